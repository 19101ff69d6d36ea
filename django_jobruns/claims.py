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
- **A live holder keeps its lease (D17-D19).** From :meth:`Claim.take` to its
  last write a claim is kept alive by :mod:`.keepalive`, which renews it while
  a body runs and tells the pass, through :attr:`Claim.stopping`, when it
  should end early: lost, paused, past its timeout, or its drive stopping.

:class:`Claim` is the only caller of the store's fenced writes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from . import keepalive, outcomes, signals, transitions
from .conf import MIN_LEASE
from .db import Clock
from .exceptions import LeaseLost, PassTimedOut, StepResultUnstorable
from .models import JobRun
from .outcomes import LOST, TRANSIENT, Outcome, PassOutcome
from .registry import Job
from .store import store
from .store.base import ClaimedRow, Committed, DueRow, PlainClaim, Rider, Riders, StepWrite
from .store.deadlocks import retry_deadlocks
from .store.statements import Expiry

logger = logging.getLogger("django_jobruns")

#: The shortest timeout (and lease) there is, in seconds.
_SHORTEST = MIN_LEASE.total_seconds()


def claim_riders(job: Job | None, plain: PlainClaim) -> tuple[Riders, Riders]:
    """What ``job`` writes with the claim ``plain``, in its transaction, and what undoes that (a task's attempt)."""
    if job is None or job.on_claim is None:
        return [], []
    return job.on_claim(plain.row.id, plain.fence, plain.holder, plain.now)


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
    #: Whether the drive that holds the claim is stopping (a stop signal, its budget spent).
    drive_stopping: Callable[[], bool] | None = None
    #: An operator paused the run while its pass ran (a renewal saw it).
    paused: bool = False
    #: The pass in flight ran past its timeout (D19): the lease is no longer renewed.
    timed_out: bool = False
    #: When the statement that last set the lease was sent, on this process's
    #: monotonic clock: when the keep-alive renews it next (whatever the clock).
    kept_at: float = field(default_factory=time.monotonic)
    #: A step's record or the renewal before a step is in flight: the engine writes, bounded by the watchdog's
    #: cut; no body runs.
    writing: bool = False
    #: When a renewal that failed is tried again (monotonic), else ``None``.
    retry_at: float | None = None
    #: The pass in flight: its job, when it began (monotonic), its timeout and when that runs out.
    job: Job | None = None
    began: float | None = None
    timeout: timedelta | None = None
    deadline: float | None = None
    #: When the claim was taken, by its clock (a task's attempt record starts there).
    taken_at: datetime | None = None
    #: Statements written with the claim's next ending write (its commit, failure, step over,
    #: abandon), in its transaction, only if the fence held: a task's attempt record ended.
    riders: list[Rider] = field(default_factory=list)
    #: Statements that undo what rode with the claim itself, written if the claim is abandoned.
    undo: Riders = field(default_factory=list)
    #: Called once the ending write held (committed): a task's ``task_finished`` signal.
    after_written: list[Callable[[], None]] = field(default_factory=list)
    #: The claim of the drive's next run (``following.Following``), written with this claim's ending write.
    following: Any = None
    _riding: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def take(cls, row: DueRow, holder: str, ttl: timedelta, clock: Clock, job: Job | None = None) -> Claimed | None:
        """Claim the run of ``row`` if nobody claimed it since it was read, or their claim expired.

        The next fence is the one read plus one. A row with a holder recorded
        on its lapsed lease makes this a takeover, which charges that holder's
        silent pass in the same statement. What ``job`` writes with its claims
        (a task's attempt record begun) is written in the claim's transaction.
        """
        now = clock()
        charge = None if row.holder is None else transitions.charged(outcomes.stopped_reporting(row.holder), now)
        kept_at = time.monotonic()
        sent = clock.mark()
        plain = PlainClaim.of(row, holder, Expiry(clock.lease_now(), ttl), now)
        also, undo = claim_riders(job, plain)
        claimed = store().claim(*plain, charge=charge, also=also)
        if claimed is None:
            return None
        return cls.taken(plain, claimed, ttl, clock, sent=sent, kept_at=kept_at, undo=undo)

    @classmethod
    def taken(
        cls,
        plain: PlainClaim,
        claimed: ClaimedRow,
        ttl: timedelta,
        clock: Clock,
        *,
        sent: Any,
        kept_at: float,
        undo: Riders,
    ) -> Claimed:
        """The claim ``plain`` that a statement took: kept alive from now on (D17).

        ``sent`` and ``kept_at`` are when the statement was sent, by ``clock.mark()`` and by
        ``time.monotonic()``; ``undo`` undoes what rode with it, should its work never start.
        """
        row = plain.row
        claim = cls(row.id, plain.holder, plain.fence, ttl, clock, sent, took_over_from=row.holder, kept_at=kept_at)
        claim.taken_at, claim.undo = plain.now, undo
        keepalive.keep(claim)
        return Claimed(claim, claimed)

    def ride(self, rider: Rider) -> None:
        """Write this statement with the claim's ending write, in its transaction, if the fence holds."""
        self.riders.append(rider)

    def _ending_riders(self) -> list[Any]:
        """The riders of the claim's ending write: its own, then the claim of the drive's next run."""
        riders, self.riders = self.riders, []
        self._riding, self.following = self.following, None
        return riders if self._riding is None else [*riders, self._riding]

    def _written(self) -> None:
        """The ending write held: what waited for it (a task's signal) is called."""
        if self._riding is not None:
            self._riding.land()  # kept alive from now, before anything below runs
            self._riding = None
        waiting, self.after_written = self.after_written, []
        for call in waiting:
            call()

    def lease_left(self) -> timedelta:
        """How long the lease is sure to last, counted from when the statement that set it was sent."""
        return self.ttl - self.clock.since(self.sent)

    def _leased(self, sent: Any, kept_at: float) -> None:
        """A statement sent at ``sent`` (``kept_at`` monotonic) set the lease: count it from there."""
        with self._lock:
            if kept_at >= self.kept_at:
                self.sent, self.kept_at, self.retry_at = sent, kept_at, None

    @property
    def stopping(self) -> bool:
        """Whether the pass in flight should end early (D18): lost, paused, timed out, lapsing, drive stopping."""
        return (
            self.lost
            or self.paused
            or self.timed_out
            or (self.drive_stopping is not None and self.drive_stopping())
            or self.past_timeout()
            or self.lapsing()
        )

    def lapsing(self) -> bool:
        """Whether the lease is about to lapse: a quarter of it left, no renewal having held since.

        Renewals go every third of the lease, bounded by a third: by then each sent on time failed. The
        pass is asked to stop (no step body starts) while the lease is still its own: a body that checks
        ``p.stopping`` more often than a quarter of its lease has ended before any drive can take it over.
        """
        return self.lease_left() <= self.ttl / 4

    # -- keep-alive (D17) and the pass's timeout (D19) ----------------------------

    def next_renewal(self) -> float:
        """When (monotonic) the keep-alive looks at this claim next: a third of the lease after it was set.

        Or sooner: a renewal that failed is tried again, and a pass's timeout is
        looked at when it runs out (read the first time the keep-alive looks).
        """
        if self.timed_out:
            return math.inf  # never renewed again (D19)
        at = self._renewal_at()
        if self.began is not None:
            # No timeout is shorter than the shortest lease: look then, when the deadline is read.
            at = min(at, self.deadline if self.deadline is not None else self.began + _SHORTEST)
        return at

    def renewal_due(self) -> bool:
        """Whether the lease was set a third of it ago, or a failed renewal is to be tried again."""
        return time.monotonic() >= self._renewal_at()

    def _renewal_at(self) -> float:
        """When (monotonic) the lease is to be renewed: a third of it after it was set, or a failed renewal's retry."""
        at = self.kept_at + self.ttl.total_seconds() / 3
        return at if self.retry_at is None else min(at, self.retry_at)

    def keep_alive(self) -> None:
        """Renew the lease in one fenced statement; mark the claim lost or paused if the renewal says so."""
        kept_at, sent = time.monotonic(), self.clock.mark()
        held, paused = store().keep_alive(self.run_id, self.fence, self.extended())
        if not keepalive.kept(self):
            return  # the pass wrote its last meanwhile: what the renewal found no longer matters
        if not held:
            self.lost = True
            keepalive.forget(self)
            logger.warning(
                "run %s: the lease was lost while its pass ran (the run was cancelled or taken over): "
                "the pass is stopping and nothing more it writes is kept",
                self.run_id,
            )
            return
        self._leased(sent, kept_at)
        if paused and not self.paused:
            self.paused = True
            logger.info("run %s: paused while its pass ran; the pass is asked to stop (p.stopping)", self.run_id)

    def renewal_failed(self, retry_at: float) -> None:
        with self._lock:
            self.retry_at = retry_at

    def begin_pass(self, job: Job) -> None:
        """A pass of ``job`` starts: it may run ``job.timeout``, renewed all the while (D19)."""
        self.job, self.began, self.deadline = job, time.monotonic(), None

    def end_pass(self) -> None:
        self.began = None

    def past_timeout(self) -> bool:
        """Whether the pass in flight has run past its job's timeout (its deadline read once, when first asked)."""
        if self.began is None:
            return False
        if self.deadline is None:
            if time.monotonic() - self.began < _SHORTEST:
                return False  # no timeout is shorter: the settings are not read for a short pass
            assert self.job is not None
            self.timeout = self.job.timeout
            self.deadline = self.began + self.timeout.total_seconds()
        return time.monotonic() >= self.deadline

    def time_out(self) -> None:
        """The pass ran past its timeout: no more renewals (D19); still kept, so that a body that has not
        returned when a quarter of its lease is left ends its process (``keepalive.overdue``)."""
        if self.timed_out:
            return
        self.timed_out = True
        logger.warning(
            "run %s: the pass ran past its timeout of %s: its lease is no longer renewed; unless its body returns "
            "before only a quarter of the lease (%s) is left, this process ends then, and the run is taken over, "
            "charged; p.stopping is True",
            self.run_id,
            self.timeout,
            self.ttl,
        )

    def check_timeout(self) -> None:
        """Raise :class:`PassTimedOut` if the pass in flight ran past its timeout."""
        if self.timed_out or self.past_timeout():
            self.time_out()
            raise PassTimedOut(
                f"the pass ran past its timeout of {self.timeout} (@job(timeout=...), the tasks backend's "
                "TIMEOUT option or JOBRUNS['TIMEOUT']): its lease was no longer renewed"
            )

    def hold(self, step: str) -> None:
        """Start no step body on a lapsed lease: renew it if the claim still holds, else stop as lost (D11).

        Nor past the pass's timeout (D19): that pass is failed instead.
        """
        if self.lost:
            raise LeaseLost(f"run {self.run_id}: the lease was taken over; step {step!r} not run")
        self.check_timeout()
        if not self.lapsing():
            return
        kept_at, sent = time.monotonic(), self.clock.mark()
        self.writing = True
        try:
            held = store().heartbeat(self.run_id, self.fence, self.extended())
        except TRANSIENT as exc:
            self.store_failure = exc
            raise
        finally:
            self.writing = False
        if not held:
            self.lost = True
            raise LeaseLost(f"run {self.run_id}: the lease lapsed and was taken; step {step!r} not run")
        self._leased(sent, kept_at)

    def record_step(self, step: str, result: str | None, attempts: int, error: str | None, *, exists: bool) -> None:
        """Write a step's record under the fence, renewing the lease with it (D3); :class:`LeaseLost` if taken."""
        kept_at, sent = time.monotonic(), self.clock.mark()
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
        self.writing = True
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
        finally:
            self.writing = False
        if not held:
            self.lost = True
            raise LeaseLost(f"run {self.run_id}: the lease was taken over while step {step!r} ran")
        if renewed and not self.timed_out:
            self._leased(sent, kept_at)

    def extended(self) -> Expiry:
        """The lease renewed by a write about to be sent: the value of ``lease_expires_at`` that keeps it."""
        return Expiry(self.clock.lease_now(), self.ttl)

    def commit(
        self, cursor: str | None, counters: str, *, done: bool, release: bool, warning: str | None, drop_ledger: bool
    ) -> Committed | None:
        """Write a committed pass (``transitions.advanced``) and drop its ledger, in one transaction (P1).

        ``None``, and the claim lost, if another claim took the run. Unless the
        run is done or ``release`` says the drive gives it back, the lease is
        kept for a further pass, counted again from this commit, which reads
        back the run's pause.
        """
        keep_until = None if done or release else self.extended()
        fields = transitions.advanced(
            cursor, counters, self.clock(), done=done, lease_until=keep_until, warning=warning
        )
        keeps = keep_until is not None
        if not keeps:
            keepalive.forget(self)  # before the last write: no renewal may follow it
        kept_at, sent = time.monotonic(), self.clock.mark()
        riders = self._ending_riders() if not keeps else self.riders
        self.riders = []
        committed = store().commit_pass(
            self.run_id, self.fence, fields, drop_ledger=drop_ledger, read_back=keeps, also=riders
        )
        if committed is None:
            self.lost = True
            keepalive.forget(self)
            return None
        if keeps:
            self._leased(sent, kept_at)
        self._written()
        return committed

    def fail(self, attempts: int, error: str, *, next_attempt_at: datetime | None) -> bool:
        """Write a failed pass (``transitions.attempt_failed``): a backoff until ``next_attempt_at``, or failed (P2)."""
        fields = transitions.attempt_failed(attempts, error, self.clock(), next_attempt_at=next_attempt_at)
        return retry_deadlocks(lambda: self.write(fields), f"run {self.run_id}: failed pass")

    def step_over(self, note: str) -> bool:
        """Give the run back untouched and uncharged, ``note`` saying why (``transitions.stepped_over``)."""
        return self.write(transitions.stepped_over(note))

    def write(self, fields: dict[str, Any]) -> bool:
        """Write a transition that ends the claim (a failed pass, a release); return whether the fence held."""
        keepalive.forget(self)  # before the last write: no renewal may follow it
        riders = self._ending_riders()
        held = store().write_fenced(self.run_id, self.fence, fields, also=riders)
        if not held:
            self.lost = True
            return False
        self._written()
        return held

    def abandon(self, run: JobRun) -> PassOutcome:
        """Fail a run whose silent passes used its retry policy up, without calling its handler (D10).

        A run that kills its worker every time (out of memory, a segfault) is
        never able to record a failure itself; the takeovers count for it.
        """
        error = outcomes.abandoned(self.took_over_from or "?", run.attempts)
        self.never_started()
        if not self.write(transitions.abandoned(error, self.clock())):
            return LOST
        logger.error("run %s (%s) failed: %s", run.id, run.title, error)
        signals.send_run_failed(run, error)
        return PassOutcome(Outcome.FAILED, error=error)

    def never_started(self) -> None:
        """The claim's work never started: what rode with the claim (a task's attempt record begun) is undone
        by its ending write."""
        self.riders.extend(self.undo)

    def release(self) -> None:
        """Give the lease back without a pass's outcome (the pass wrote its own, or none ran)."""
        self.write(transitions.released())


@dataclass(frozen=True)
class Claimed:
    """A claim just taken, and the run as the claim re-read it (D4)."""

    claim: Claim
    row: ClaimedRow
