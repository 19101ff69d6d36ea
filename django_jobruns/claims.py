"""A worker's hold on one run: the claim, its lease, and every write made under it.

The three rules of the lease live here, with their SQL in :mod:`.store`:

- **One holder at a time (D2).** :meth:`Claim.take` is one conditional UPDATE
  that compares the fence read with the due row and sets the holder, the
  expiry and the next fence. An expired claim counts as unheld. The fence, not
  the holder, identifies a claim: threads of one process share a holder.
- **A takeover charges the silent pass (D10).** A due row whose lease lapsed
  with a holder recorded was worked by a pass that never reported: the claim's
  own statement charges it a failed attempt (``transitions.charged``). When
  that spends the policy, :meth:`Claim.abandon` fails the run without calling
  its handler.
- **A holder that lost its lease starts no further step (D3, D11).** Every
  write under the claim carries its fence: a worker whose claim was taken
  over writes nothing and the claim is marked :attr:`Claim.lost`, which the
  pass asks. Before each step body :meth:`Claim.hold` renews a lapsed lease
  if nobody took it, or stops the pass as lost.

:class:`Claim` is the only caller of the store's fenced writes.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import outcomes, signals, transitions
from .db import Clock
from .exceptions import InvalidDriveOptions, LeaseLost, StepResultUnstorable
from .models import JobRun
from .outcomes import LOST, TRANSIENT, Outcome, PassOutcome
from .store import ClaimedRow, Committed, DueRow, Expiry, StepWrite, store

logger = logging.getLogger("django_jobruns")

_holder_lock = threading.Lock()
_holder: tuple[int, str] | None = None


def default_holder() -> str:
    """Return this process's holder name: host, pid and a random suffix.

    Per process, never per deployment: the holder is what tells a renewal from
    a theft, so two workers sharing one would take claims from each other.
    Recomputed after a fork, since the child is another worker.
    """
    global _holder
    pid = os.getpid()
    with _holder_lock:
        if _holder is None or _holder[0] != pid:
            _holder = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}")
        return _holder[1]


def holder_name(value: Any) -> str:
    """The holder a drive claims as: ``value`` checked (D6), or :func:`default_holder` for ``None``."""
    if value is None:
        return default_holder()
    if not isinstance(value, str) or not value.strip():
        raise InvalidDriveOptions(
            f"holder must be non-empty text, got {value!r}: it tells a renewal from a theft, "
            "so use something per process, such as a pod name plus a pid"
        )
    if len(value) > 255:
        raise InvalidDriveOptions(f"holder must be at most 255 characters, got {len(value)}")
    return value


@dataclass
class Claim:
    """A worker's hold on one run, from :meth:`take` to its release or its final write."""

    run_id: str
    holder: str
    #: The claim's fence: every write under it changes the run only while the run's fence is this.
    fence: int
    ttl: timedelta
    clock: Clock
    #: When the statement that last set the lease was sent (``clock.mark()``):
    #: the lease runs out no sooner than ``ttl`` after it, by the database's clock.
    sent: Any
    #: The holder whose silent pass this claim charged (a takeover), else ``None``.
    took_over_from: str | None = None
    #: Another claim took the run: nothing more is written under this one.
    lost: bool = False
    #: A database error of the engine's own write under this claim (a step
    #: record, a heartbeat) in the pass in flight: never charged to the job.
    store_failure: BaseException | None = None

    @classmethod
    def take(cls, row: DueRow, holder: str, ttl: timedelta, clock: Clock) -> Claimed | None:
        """Claim the run of ``row`` if nobody claimed it since it was read, or their claim expired.

        The next fence is the one read plus one. A row with a holder recorded
        on its lapsed lease makes this a takeover, which charges that holder's
        silent pass in the same statement.
        """
        now = clock()
        fence = row.fence + 1
        charge = None if row.holder is None else transitions.charged(outcomes.stopped_reporting(row.holder), now)
        sent = clock.mark()
        claimed = store().claim(row, fence, holder, Expiry(clock.lease_now(), ttl), now, charge=charge)
        if claimed is None:
            return None
        return Claimed(cls(row.id, holder, fence, ttl, clock, sent, took_over_from=row.holder), claimed)

    def lease_left(self) -> timedelta:
        """How long the lease is sure to last, counted from when the statement that set it was sent."""
        return self.ttl - self.clock.since(self.sent)

    def hold(self, step: str) -> None:
        """Start no step body on a lapsed lease: renew it if the claim still holds, else stop as lost (D11)."""
        if self.lost:
            raise LeaseLost(f"run {self.run_id}: the lease was taken over; step {step!r} not run")
        if self.lease_left() > timedelta(0):
            return
        sent = self.clock.mark()
        try:
            held = store().heartbeat(self.run_id, self.fence, self.extended())
        except TRANSIENT as exc:
            self.store_failure = exc
            raise
        if not held:
            self.lost = True
            raise LeaseLost(f"run {self.run_id}: the lease lapsed and was taken; step {step!r} not run")
        self.sent = sent

    def record_step(self, step: str, result: str | None, attempts: int, error: str | None, *, exists: bool) -> None:
        """Write a step's record under the fence, renewing the lease with it (D3); :class:`LeaseLost` if taken."""
        sent = self.clock.mark()
        write = StepWrite(
            self.run_id,
            self.fence,
            step,
            result,
            attempts,
            error,
            self.clock(),
            expires=self.extended(),
            exists=exists,
            lease_left=self.lease_left(),
            ttl=self.ttl,
        )
        try:
            held, renewed = store().record_step(write)
        except TRANSIENT as exc:
            if store().refused_for_size(write, exc):
                # Permanent, whatever its class says: the run fails (P10) rather
                # than sending the same statement for ever.
                raise StepResultUnstorable(
                    f"the database refused step {step!r}'s record as too large ({outcomes.summary(exc)}); "
                    "lower JOBRUNS['STEP_RESULT_MAX_BYTES'] below its limit, or return less"
                ) from exc
            self.store_failure = exc
            raise
        if not held:
            self.lost = True
            raise LeaseLost(f"run {self.run_id}: the lease was taken over while step {step!r} ran")
        if renewed:
            self.sent = sent

    def extended(self) -> Expiry:
        """The lease renewed by a write about to be sent: the value of ``lease_expires_at`` that keeps it."""
        return Expiry(self.clock.lease_now(), self.ttl)

    def commit(self, fields: dict[str, Any], *, drop_ledger: bool) -> Committed | None:
        """Write a committed pass (``transitions.advanced``) and drop its ledger, in one transaction (P1).

        ``None``, and the claim lost, if another claim took the run. When the
        fields keep the lease (:meth:`extended`: a further pass follows), the
        lease is counted again from this commit, which reads back the run's pause.
        """
        keeps = isinstance(fields.get("lease_expires_at"), Expiry)
        sent = self.clock.mark()
        committed = store().commit_pass(self.run_id, self.fence, fields, drop_ledger=drop_ledger, read_back=keeps)
        if committed is None:
            self.lost = True
        elif keeps:
            self.sent = sent
        return committed

    def write(self, fields: dict[str, Any]) -> bool:
        """Write a transition that ends the claim (a failed pass, a release); return whether the fence held."""
        held = store().write_fenced(self.run_id, self.fence, fields)
        if not held:
            self.lost = True
        return held

    def abandon(self, run: JobRun) -> PassOutcome:
        """Fail a run whose silent passes used its retry policy up, without calling its handler (D10).

        A run that kills its worker every time (out of memory, a segfault) is
        never able to record a failure itself; the takeovers count for it.
        """
        error = outcomes.abandoned(self.took_over_from or "?", run.attempts)
        if not self.write(transitions.abandoned(error, self.clock())):
            return LOST
        logger.error("run %s (%s.%s) failed: %s", run.id, run.module, run.job, error)
        signals.send_run_failed(run, error)
        return PassOutcome(Outcome.FAILED, error=error)

    def release(self) -> None:
        """Give the lease back without a pass's outcome (the pass wrote its own, or none ran)."""
        self.write(transitions.released())


@dataclass(frozen=True)
class Claimed:
    """A claim just taken, and the run as the claim re-read it (D4)."""

    claim: Claim
    row: ClaimedRow
