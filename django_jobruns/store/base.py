"""The portable store: each fenced write a transaction of a fence check (with the heartbeat) and the write.

Any database runs these statements; the vendors' modules override what their
database does better. The claim (:mod:`django_jobruns.claims`) is the only
caller of the fenced writes.
"""

from __future__ import annotations

import contextlib
import functools
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .. import db
from . import errors, watchdog
from .deadlocks import retry_deadlocks
from .retention import Retention
from .rows import ClaimedRow, ClaimRider, Committed, DueRow, Ledger, PlainClaim, Rider, Riders, StepWrite, run_of
from .statements import DATETIME_PLACES, ClockSQL, Expiry, Statements

__all__ = [
    "GUARDED",
    "ClaimRider",
    "ClaimedRow",
    "Committed",
    "DueRow",
    "Ledger",
    "PlainClaim",
    "Rider",
    "Riders",
    "StepWrite",
    "Store",
]

#: The store's operations, each bounded by the drive's watchdog (a partition cannot hang it).
GUARDED = (
    "due",
    "read_run",
    "ledger",
    "claim",
    "claim_together",
    "heartbeat",
    "keep_alive",
    "record_step",
    "commit_pass",
    "write_fenced",
    "refused_for_size",
)


def _guarded(method: Any) -> Any:
    @functools.wraps(method)
    def bounded(self: Store, *args: Any, **kwargs: Any) -> Any:
        with watchdog.guarded(self.connection):
            bound = watchdog.current_bound()
            if bound is not None:
                self.prepare_session(bound)
            return method(self, *args, **kwargs)

    bounded.guarded = True  # type: ignore[attr-defined]
    return bounded


class Store(Retention):
    """The engine's statements on one database alias, portable to any database Django supports.

    Each operation in :data:`GUARDED`, in this class and its vendors', runs
    under the drive's watchdog (its commit included).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in GUARDED:
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "guarded", False):
                setattr(cls, name, _guarded(method))

    #: Whether the claim statement returns the row it claimed.
    returning = False
    #: Whether a transaction can hold one row locked while others are written (not SQLite's one writer).
    locks_rows = False
    #: Where the statements' "now" comes from: a parameter, here.
    clock_sql = ClockSQL()

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.statements = Statements(connections[alias], self.clock_sql)

    def cursor(self) -> Any:
        """A cursor for the engine's own statements: Django's (PostgreSQL's store gives one that prepares them)."""
        return self.connection.cursor()

    def prepare_session(self, bound: float) -> None:
        """Set up a drive's connection once (after each connect) so a stalled peer cannot freeze it: nothing here."""

    @property
    def connection(self) -> Any:
        """This thread's connection to the store's database."""
        return connections[self.alias]

    def adapt(self, value: datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    # -- reads -------------------------------------------------------------------

    def due(
        self,
        now: datetime | None,
        after: DueRow | None,
        limit: int,
        *,
        jobs: list[tuple[str, str]] | None = None,
        queues: list[str] | None = None,
    ) -> list[DueRow]:
        """Up to ``limit`` runs due at ``now`` after the row ``after`` (from the first, if ``None``), in due order.

        ``now`` ``None``: by the database's clock as the statement runs. ``jobs``
        (``(module, job)`` pairs) and ``queues`` (task queues; job runs have none)
        limit the read in SQL, so the rows it reads are rows the drive may run.
        """
        st = self.statements
        at = st.now_params(now)
        text = st.due_selected(len(jobs) if jobs else None, len(queues) if queues else None, after=after is not None)
        params = [*at, *at]
        for module, job in jobs or ():
            params += [module, job]
        params += list(queues or ())
        if after is not None:
            params += [after.priority, after.priority, after.due_since, after.due_since, after.id]
        with self.cursor() as cur:
            cur.execute(text, [*params, limit])
            return [DueRow(*row) for row in cur.fetchall()]

    def read_run(self, run_id: str, now: datetime) -> ClaimedRow | None:
        """The run's decodable state and whether it is due at ``now``."""
        with self.cursor() as cur:
            cur.execute(self.statements.read_run, [run_id])
            row = cur.fetchone()
        return self._claimed(row, now) if row is not None else None

    def ledger(self, run_id: str) -> Ledger:
        """The step ledger of the pass in flight."""
        with self.cursor() as cur:
            cur.execute(self.statements.ledger, [run_id])
            return list(cur.fetchall())

    # -- the claim ---------------------------------------------------------------

    def claim(
        self,
        row: DueRow,
        fence: int,
        holder: str,
        expires: Expiry,
        now: datetime,
        *,
        charge: dict[str, Any] | None = None,
        also: Riders | None = None,
    ) -> ClaimedRow | None:
        """Take the run if its fence is still ``row.fence`` and its lease free; set ``fence``; return it re-read.

        ``also``: statements written in the claim's transaction once it held (one commit for both).

        The lease is free, and its new expiry set, by ``expires.now`` -- the
        database's clock as the statement runs, when that is ``None``. ``now``
        judges the re-read run's backoff.

        One conditional UPDATE sets the holder, the expiry and the new fence. The
        fence read with the due row is compared, not the status: a run changed
        out of band since that read is claimed, found not running or not due,
        and given back as stale.

        ``charge`` (a takeover: the due read saw the lease held and lapsed) is
        written by the same statement; the ledger is then read by a statement
        of its own, after the claim. Read in the claim's statement it would come
        from that statement's snapshot, which on PostgreSQL can predate a memo
        the old holder committed while the claim waited for the row.
        """
        if charge is None:
            with self._together(None if self._joined(also) else also), self.cursor() as cur:
                return self.claim_on(cur, PlainClaim(row, fence, holder, expires, now), also)
        st = self.statements
        params = self._claim_params(row, fence, holder, expires, charge)
        with self._together(also), self.cursor() as cur:
            cur.execute(st.takeover(charge, returning=self.returning), params)
            if self.returning:
                found = cur.fetchone()
                if found is not None:
                    self._ride(cur, also)
                return self._claimed(found, now) if found is not None else None
            if cur.rowcount != 1:
                return None
            self._ride(cur, also)
        return self.read_run(row.id, now)

    def claim_on(
        self, cur: Any, claim: PlainClaim, also: Riders | None = None, *, skip_locked: bool = False
    ) -> ClaimedRow | None:
        """The claim with no charge, on ``cur`` in the transaction it is in; ``also`` only if it held.

        The drive's next run is claimed so, in the transaction of the ending
        write of the run before it (:class:`~django_jobruns.following.Following`),
        with ``skip_locked``: a run whose row another transaction holds locked
        is not claimed, rather than holding that ending write until the lock goes.
        """
        st, row = self.statements, claim.row
        params = self._claim_params(row, claim.fence, claim.holder, claim.expires, None)
        if skip_locked and self.locks_rows:
            cur.execute(st.lock_if_free, [row.id, row.fence, *st.now_params(claim.expires.now)])
            if cur.fetchone() is None:
                return None
        if self.returning:
            cur.execute(st.claim_returning, params)
            found = cur.fetchone()
            if found is None:
                return None
            self._ride(cur, also)
            return self._claimed(found, claim.now)
        cur.execute(st.claim, params)
        if cur.rowcount != 1:
            return None
        self._ride(cur, also)
        return self.read_run(row.id, claim.now)

    def claim_together(self, claims: list[tuple[PlainClaim, Riders]]) -> list[ClaimedRow | None]:
        """Plain claims of several due runs, each with its own fence, in one transaction: one commit for all.

        Each is :meth:`claim_on`'s claim, with what rides with it (a task's
        attempt record begun), and each is ``None`` where the run was taken or
        changed since the due read. A run whose row another transaction holds
        locked is passed over, not waited for: a transaction that holds the
        rows it claimed must not wait on another's (two drives claiming the
        same runs in different orders would deadlock).
        """
        with transaction.atomic(using=self.alias), self.cursor() as cur:
            return [self.claim_on(cur, plain, also, skip_locked=True) for plain, also in claims]

    def _together(self, also: Riders | None) -> Any:
        """One transaction for a write and its riders (a lone statement needs none)."""
        return transaction.atomic(using=self.alias) if also else contextlib.nullcontext()

    def _joined(self, also: Riders | None) -> bool:
        """Whether ``also`` is written within the write's own statement (``Rider.joined``): not here."""
        return False

    @staticmethod
    def _ride(cur: Any, also: Riders | None) -> None:
        for rider in also or ():
            if isinstance(rider, Rider):
                cur.execute(rider.text, rider.params)
            else:
                rider(cur)  # the drive's next claim (following.Following)

    def _claim_params(
        self, row: DueRow, fence: int, holder: str, expires: Expiry, charge: dict[str, Any] | None
    ) -> list[Any]:
        st = self.statements
        take = [holder, *st.expiry_params(expires.now, expires.ttl), fence]
        params = [*take, row.id, row.fence, *st.now_params(expires.now)]
        return params if charge is None else [*st.parameters(charge), *params]

    def _claimed(self, row: tuple[Any, ...] | list[Any], now: datetime, ledger: Ledger | None = None) -> ClaimedRow:
        values = list(row)
        for index in DATETIME_PLACES:  # a raw cursor reads them as text (SQLite) or naive (MariaDB)
            values[index] = self.read_datetime(values[index])
        run = run_of(values)
        # Judged in Python, not SQL (SQLite 3.40's RETURNING evaluates "column IS
        # NULL" wrongly), by the one definition of due. The claim's own lease is
        # not among the fields read back, so it does not count against it.
        return ClaimedRow(run, run.is_due(now), ledger)

    def read_datetime(self, value: Any) -> datetime | None:
        """A datetime column read by a raw cursor, as the ORM would give it."""
        if value is None or (isinstance(value, datetime) and timezone.is_aware(value)):
            return value
        parsed = parse_datetime(value) if isinstance(value, str) else value
        if parsed is None:
            raise ValueError(f"not a datetime: {value!r}")
        return timezone.make_aware(parsed, self.connection.timezone) if timezone.is_naive(parsed) else parsed

    # -- fenced writes (the claim is their only caller) ----------------------------

    def heartbeat(self, run_id: str, fence: int, expires: Expiry) -> bool:
        """Extend the lease if ``fence`` is still the run's; return whether it was."""
        st = self.statements
        with self.cursor() as cur:
            cur.execute(st.heartbeat, [*st.expiry_params(expires.now, expires.ttl), run_id, fence])
            return bool(cur.rowcount == 1)

    def keep_alive(self, run_id: str, fence: int, expires: Expiry) -> tuple[bool, bool]:
        """Renew a held lease from the keep-alive's own connection (D17): (whether ``fence`` held, whether paused).

        A lease given back meanwhile (no holder) is left as it is, and so is a
        run whose fence moved on (cancelled, or taken over).
        """
        st = self.statements
        params = [*st.expiry_params(expires.now, expires.ttl), run_id, fence]
        with self.cursor() as cur:
            if self.returning:
                cur.execute(st.keep_alive_returning, params)
                found = cur.fetchone()
                return found is not None, found is not None and found[0] is not None
            cur.execute(st.keep_alive, params)
            if cur.rowcount != 1:
                return False, False
            cur.execute(st.paused_at, [run_id])
            row = cur.fetchone()
            return True, row is not None and row[0] is not None

    def record_step(self, write: StepWrite) -> tuple[bool, bool]:
        """Write a step record if the claim still holds; return (whether it held, whether the lease was renewed).

        One transaction: the heartbeat (the run's row lock, the fence check and
        the renewal in one statement), then the step's row.
        """
        wrapper, st, at = self.connection, self.statements, self.adapt

        def record() -> tuple[bool, bool]:
            with transaction.atomic(using=self.alias), self.cursor() as cur:
                renew = self._renews(wrapper, write)
                if renew:
                    cur.execute(
                        st.heartbeat,
                        [*st.expiry_params(write.expires.now, write.expires.ttl), write.run_id, write.fence],
                    )
                    held = cur.rowcount == 1
                else:
                    cur.execute(st.fence_holds, [write.run_id, write.fence])
                    held = cur.fetchone() is not None
                if held:
                    if write.exists:
                        cur.execute(
                            st.update_step,
                            [write.result, write.attempts, write.error, at(write.at), write.run_id, write.step],
                        )
                    else:
                        cur.execute(
                            st.insert_step,
                            [write.run_id, write.step, write.result, write.attempts, write.error, at(write.at)],
                        )
                return held, renew

        return retry_deadlocks(record, f"run {write.run_id}: record of step {write.step!r}")

    def refused_for_size(self, write: StepWrite, exc: BaseException) -> bool:
        """Whether the database refused this step record for its size (no retry makes it fit).

        Asked only after the record failed. The connection is replaced first if
        the server dropped it over the statement.
        """
        db.replace_if_broken()
        return errors.too_large(exc)

    def _renews(self, wrapper: Any, write: StepWrite) -> bool:
        """Whether this step write renews the lease (else it only checks the fence)."""
        return True

    def commit_pass(
        self,
        run_id: str,
        fence: int,
        fields: dict[str, Any],
        *,
        drop_ledger: bool,
        read_back: bool = False,
        also: Riders | None = None,
    ) -> Committed | None:
        """Write the pass's transition and drop its ledger, if ``fence`` still holds; ``None`` if it did not.

        ``read_back`` asks for the run's pause as the commit left it (for a
        further pass under the same claim); without ``RETURNING`` that is one
        more read inside the commit's transaction.
        """
        st = self.statements
        params = [*st.parameters(fields), run_id, fence]
        returning = self.returning

        def commit() -> Committed | None:
            with transaction.atomic(using=self.alias), self.cursor() as cur:
                paused_at = None
                if returning:
                    cur.execute(st.update_fenced(fields, returning_pause=True), params)
                    row = cur.fetchone()
                    if row is None:
                        return None
                    paused_at = row[0]
                else:
                    cur.execute(st.update_fenced(fields), params)
                    if cur.rowcount != 1:
                        return None
                    if read_back:
                        cur.execute(st.paused_at, [run_id])
                        (paused_at,) = cur.fetchone()
                if drop_ledger:
                    cur.execute(st.drop_ledger, [run_id])
                self._ride(cur, also)
                return Committed(self.read_datetime(paused_at))

        return retry_deadlocks(commit, f"run {run_id}: pass commit")

    def write_fenced(self, run_id: str, fence: int, fields: dict[str, Any], also: Riders | None = None) -> bool:
        """Write ``fields`` (a transition) to the run if ``fence`` is still its fence; return whether it was."""
        st = self.statements
        with self._together(also), self.cursor() as cur:
            cur.execute(st.update_fenced(fields), [*st.parameters(fields), run_id, fence])
            held = bool(cur.rowcount == 1)
            if held:
                self._ride(cur, also)
            return held


for _name in GUARDED:
    setattr(Store, _name, _guarded(getattr(Store, _name)))
