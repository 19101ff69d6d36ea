"""The store: the engine's reads and writes of runs and step records, one class per database.

The pass and the drive ask the store to read what is due, claim a run, record
a step (with its heartbeat), commit a pass and write a fenced transition; they
never name a database. Each database gets the statements that suit it:

- :class:`Store` -- one transaction per fenced write: the heartbeat (which
  takes the run's row lock and checks the fence) and then the write. MariaDB
  and MySQL use it as it is, with deadlocks retried.
- :class:`SQLiteStore` -- the same, plus ``RETURNING`` on the claim, and, under
  ``IMMEDIATE`` transactions, a read of the fence instead of a heartbeat while
  more than half the lease is left: the transaction holds the database's write
  lock from BEGIN, so no claim can come between the read and the write.
- :class:`PostgresStore` -- every fenced write is ONE statement (a
  data-modifying CTE: the fence check, the heartbeat and the write), and a
  plain claim returns the step ledger with the run.

A pass of k fresh steps issues 2k+5 statements (k+3 on PostgreSQL), the drive's
due read included. Built by the ORM, each would cost 100-250 µs of Python before
it reached the database -- more, on a fast disk, than the commits the pass pays
for -- so the statements a pass repeats are written here once, with the
tables' and columns' names taken from the models, and executed through
Django's cursor (its transactions, execute wrappers and query logging still
apply). The due read is the SQL form of ``JobRun.objects.due().in_due_order()``
(a test holds them to each other).

Every statement goes to the database the project's router names for ``JobRun``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import db
from .deadlocks import retry_deadlocks
from .models import JobRun, JobStep, Status

#: The run's fields a claim returns (as the pass needs them).
RUN_FIELDS = (
    "id",
    "module",
    "job",
    "instance",
    "payload",
    "status",
    "cursor",
    "counters",
    "attempts",
    "lease_fence",
    "next_attempt_at",
    "paused_at",
)

#: The step ledger of a pass: (step, result, attempts, last_error) per recorded step.
Ledger = list[tuple[str, "str | None", int, "str | None"]]


@dataclass(frozen=True)
class ClaimedRow:
    """The run as the claim left it, and whether it is still due (re-read under the claim).

    ``ledger`` is the run's step ledger when the claim could read it in the same
    statement (PostgreSQL), else ``None``: read it separately.
    """

    run: JobRun
    due: bool
    ledger: Ledger | None = None


@dataclass(frozen=True)
class Committed:
    """A pass commit that held: the run's pause as the commit left it (``None`` if it was not paused)."""

    paused_at: datetime | None


@dataclass(slots=True)
class StepWrite:
    """A step record to write under a claim, and the claim's lease as the pass knows it."""

    run_id: str
    fence: int
    step: str
    result: str | None
    attempts: int
    error: str | None
    at: datetime
    #: The lease's new expiry, if this write renews it.
    expires: datetime
    #: Whether the step has a row already (an earlier failed attempt).
    exists: bool
    #: How much of the lease is left, and its length: whether a renewal is due.
    lease_left: timedelta
    ttl: timedelta


def _columns(model: Any, quote: Any) -> dict[str, str]:
    """Each field's column, quoted, by field name (``run`` → ``"run_id"``)."""
    return {f.name: quote(f.column) for f in model._meta.concrete_fields}


class Statements:
    """The statements' text for one database (built once per vendor)."""

    def __init__(self, wrapper: Any) -> None:
        q = wrapper.ops.quote_name
        r, s = _columns(JobRun, q), _columns(JobStep, q)
        self.quote = q
        self.run_columns = r
        run, step = q(JobRun._meta.db_table), q(JobStep._meta.db_table)
        self.run_table, self.step_table = run, step
        step_set = f"{s['result']} = %s, {s['attempts']} = %s, {s['last_error']} = %s, {s['recorded_at']} = %s"
        step_columns = f"{s['run']}, {s['step']}, {s['result']}, {s['attempts']}, {s['last_error']}, {s['recorded_at']}"
        self.columns = ", ".join(r[name] for name in RUN_FIELDS)
        take = f"{r['lease_holder']} = %s, {r['lease_expires_at']} = %s, {r['lease_fence']} = %s "
        self.claim = (
            f"UPDATE {run} SET {take}"
            f"WHERE {r['id']} = %s AND {r['lease_fence']} = %s "
            f"AND ({r['lease_expires_at']} IS NULL OR {r['lease_expires_at']} <= %s)"
        )
        self.claim_returning = f"{self.claim} RETURNING {self.columns}"
        # A takeover: the run's lease lapsed unreleased, so the pass that held
        # it stopped reporting. The claim charges that pass as a failed attempt
        # in the same statement (the charge first: MySQL evaluates SET left to
        # right, with the values already assigned).
        self.takeover = (
            f"UPDATE {run} SET {r['attempts']} = {r['attempts']} + 1, {r['last_error']} = %s, "
            f"{r['updated_at']} = %s, {take}"
            f"WHERE {r['id']} = %s AND {r['lease_fence']} = %s "
            f"AND {r['lease_holder']} IS NOT NULL AND {r['lease_expires_at']} <= %s"
        )
        self.takeover_returning = f"{self.takeover} RETURNING {self.columns}"
        # The claim, the re-read and the ledger read in one round trip (PostgreSQL).
        self.claim_with_ledger = (
            f"WITH claimed AS ({self.claim} RETURNING {self.columns}) SELECT claimed.*, "
            f"(SELECT json_agg(json_build_array({s['step']}, {s['result']}, {s['attempts']}, {s['last_error']})) "
            f"FROM {step} WHERE {step}.{s['run']} = claimed.{r['id']}) FROM claimed"
        )
        self.read_run = f"SELECT {self.columns} FROM {run} WHERE {r['id']} = %s"
        # The due read (JobRunQuerySet.due().in_due_order()): runs in the order
        # they became due -- a run backing off since its next attempt, any
        # other since its start -- then by id; on PostgreSQL and SQLite one
        # range of the partial jobruns_due_order index over the runs in flight.
        # The status is spelled out, not a parameter, so the planner can match
        # the partial index's predicate.
        since = f"COALESCE({r['next_attempt_at']}, {r['started_at']})"
        due = (
            f"SELECT {r['id']}, {r['lease_fence']}, {r['module']}, {r['job']}, {r['lease_holder']}, {since} "
            f"FROM {run} WHERE {r['status']} = '{Status.RUNNING.value}' AND {r['paused_at']} IS NULL "
            f"AND ({r['next_attempt_at']} IS NULL OR {r['next_attempt_at']} <= %s) "
            f"AND ({r['lease_expires_at']} IS NULL OR {r['lease_expires_at']} <= %s)"
        )
        self.due_first = f"{due} ORDER BY {since}, {r['id']} LIMIT %s"
        self.due_after = (
            f"{due} AND ({since} > %s OR ({since} = %s AND {r['id']} > %s)) ORDER BY {since}, {r['id']} LIMIT %s"
        )
        self.ledger = (
            f"SELECT {s['step']}, {s['result']}, {s['attempts']}, {s['last_error']} FROM {step} WHERE {s['run']} = %s"
        )
        self.fence_holds = f"SELECT 1 FROM {run} WHERE {r['id']} = %s AND {r['lease_fence']} = %s"
        self.heartbeat = (
            f"UPDATE {run} SET {r['lease_expires_at']} = %s WHERE {r['id']} = %s AND {r['lease_fence']} = %s"
        )
        self.update_step = f"UPDATE {step} SET {step_set} WHERE {s['run']} = %s AND {s['step']} = %s"
        self.insert_step = f"INSERT INTO {step} ({step_columns}) VALUES (%s, %s, %s, %s, %s, %s)"
        self.update_fenced_prefix = f"UPDATE {run} SET "
        self.update_fenced_where = f" WHERE {r['id']} = %s AND {r['lease_fence']} = %s"
        self.drop_ledger = f"DELETE FROM {step} WHERE {s['run']} = %s"
        # PostgreSQL: the fence check and the write in ONE statement.
        fenced = (
            f"WITH fenced AS (UPDATE {run} SET {r['lease_expires_at']} = %s "
            f"WHERE {r['id']} = %s AND {r['lease_fence']} = %s RETURNING {r['id']}) "
        )
        self.insert_step_fenced = (
            f"{fenced}INSERT INTO {step} ({step_columns}) SELECT {r['id']}, %s, %s, %s, %s, %s FROM fenced RETURNING 1"
        )
        self.update_step_fenced = (
            f"{fenced}UPDATE {step} SET {step_set} FROM fenced WHERE {step}.{s['run']} = fenced.{r['id']} "
            f"AND {step}.{s['step']} = %s RETURNING 1"
        )
        # A commit says whether the fence held (a row) and whether an operator
        # paused the run meanwhile, so a further pass needs no read of the run.
        self.commit_returning = f" RETURNING {r['paused_at']}"
        self.paused_at = f"SELECT {r['paused_at']} FROM {run} WHERE {r['id']} = %s"
        self.commit_where = f"{self.update_fenced_where} RETURNING {r['id']}, {r['paused_at']}"
        self.commit_drop = (
            f"), dropped AS (DELETE FROM {step} WHERE {s['run']} IN (SELECT {r['id']} FROM fenced)) "
            f"SELECT {r['paused_at']} FROM fenced"
        )
        self.commit_keep = f") SELECT {r['paused_at']} FROM fenced"
        self._assignments: dict[tuple[str, ...], str] = {}

    def update_fenced(self, fields: Any) -> str:
        """The UPDATE that writes these fields if the run's fence is still the one given (its last two parameters)."""
        return f"{self.update_fenced_prefix}{self.assignments(fields)}{self.update_fenced_where}"

    def assignments(self, fields: Any) -> str:
        """``"col" = %s, …`` for these field names (cached: passes write the same few sets)."""
        key = tuple(fields)
        text = self._assignments.get(key)
        if text is None:
            text = ", ".join(f"{self.run_columns[name]} = %s" for name in key)
            self._assignments[key] = text
        return text


class Store:
    """The engine's statements on one database alias: MariaDB/MySQL, and any database without a class of its own."""

    #: Whether the claim statement returns the row it claimed.
    returning = False

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.statements = Statements(connections[alias])

    @property
    def connection(self) -> Any:
        """This thread's connection to the store's database."""
        return connections[self.alias]

    # -- reads -------------------------------------------------------------------

    def due(self, now: datetime, after: tuple[Any, str] | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` due runs after ``after`` (all, if ``None``), in the order they became due.

        Each row is ``(id, fence, module, job, holder, due since)``; ``after`` is
        the last row's ``(due since, id)``, as read.
        """
        wrapper, st = self.connection, self.statements
        at = wrapper.ops.adapt_datetimefield_value(now)
        with wrapper.cursor() as cur:
            if after is not None:
                since, run_id = after
                cur.execute(st.due_after, [at, at, since, since, run_id, limit])
            else:
                cur.execute(st.due_first, [at, at, limit])
            return list(cur.fetchall())

    def read_run(self, run_id: str, now: datetime) -> ClaimedRow | None:
        """The run's decodable state and whether it is due at ``now``."""
        wrapper = self.connection
        with wrapper.cursor() as cur:
            cur.execute(self.statements.read_run, [run_id])
            row = cur.fetchone()
        return self._claimed(row, now) if row is not None else None

    def ledger(self, run_id: str) -> Ledger:
        """The step ledger of the pass in flight."""
        with self.connection.cursor() as cur:
            cur.execute(self.statements.ledger, [run_id])
            return list(cur.fetchall())

    # -- the claim ---------------------------------------------------------------

    def claim(
        self, run_id: str, fence: int, holder: str, now: datetime, expires: datetime, *, takeover: str | None = None
    ) -> ClaimedRow | None:
        """Take the run if its fence is still ``fence`` and its lease is free; return it re-read.

        One conditional UPDATE sets the holder, the expiry and the new fence. The
        fence read with the due rows is compared, not the status: a run changed
        out of band since that read is claimed, found not running or not due,
        and given back as stale.

        ``takeover`` (the error to record) says the due read saw the lease held
        and lapsed: the claim then also charges the silent pass as a failed
        attempt, and the ledger is read by a statement of its own, after the
        claim. Read in the claim's statement it would come from that
        statement's snapshot, which on PostgreSQL can predate a memo the old
        holder committed while the claim waited for the row.
        """
        wrapper, st = self.connection, self.statements
        params = self._claim_params(run_id, fence, holder, now, expires, takeover)
        with wrapper.cursor() as cur:
            if self.returning:
                cur.execute(st.claim_returning if takeover is None else st.takeover_returning, params)
                row = cur.fetchone()
                return self._claimed(row, now) if row is not None else None
            cur.execute(st.claim if takeover is None else st.takeover, params)
            if cur.rowcount != 1:
                return None
        return self.read_run(run_id, now)

    def _claim_params(
        self, run_id: str, fence: int, holder: str, now: datetime, expires: datetime, takeover: str | None
    ) -> list[Any]:
        at = self.connection.ops.adapt_datetimefield_value
        params = [holder, at(expires), fence + 1, run_id, fence, at(now)]
        return params if takeover is None else [takeover, at(now), *params]

    def _claimed(self, row: tuple[Any, ...], now: datetime, ledger: Ledger | None = None) -> ClaimedRow:
        # Due-ness is judged here, not in SQL: SQLite 3.40's RETURNING evaluates
        # "column IS NULL" wrongly, and the clock is the drive's either way.
        values = dict(zip(RUN_FIELDS, row, strict=False))
        values["next_attempt_at"] = self._datetime(values["next_attempt_at"])
        values["paused_at"] = self._datetime(values["paused_at"])
        run = JobRun(**values)
        due = run.paused_at is None and (run.next_attempt_at is None or run.next_attempt_at <= now)
        return ClaimedRow(run, due, ledger)

    def _datetime(self, value: Any) -> datetime | None:
        """A datetime column read by a raw cursor, as the ORM would give it."""
        if value is None or (isinstance(value, datetime) and timezone.is_aware(value)):
            return value
        parsed = parse_datetime(value) if isinstance(value, str) else value
        if parsed is None:
            raise ValueError(f"not a datetime: {value!r}")
        return timezone.make_aware(parsed, self.connection.timezone) if timezone.is_naive(parsed) else parsed

    # -- fenced writes -------------------------------------------------------------

    def heartbeat(self, run_id: str, fence: int, expires: datetime) -> bool:
        """Extend the lease if ``fence`` is still the run's; the fence check of a step write."""
        wrapper = self.connection
        with wrapper.cursor() as cur:
            cur.execute(self.statements.heartbeat, [wrapper.ops.adapt_datetimefield_value(expires), run_id, fence])
            return bool(cur.rowcount == 1)

    def record_step(self, write: StepWrite) -> tuple[bool, bool]:
        """Write a step record if the claim still holds; return (whether it held, whether the lease was renewed).

        One transaction: the heartbeat (the run's row lock, the fence check and
        the renewal in one statement), then the step's row.
        """

        wrapper, st = self.connection, self.statements
        adapt = wrapper.ops.adapt_datetimefield_value

        def record() -> tuple[bool, bool]:
            with transaction.atomic(using=self.alias), wrapper.cursor() as cur:
                renew = self._renews(wrapper, write)
                if renew:
                    cur.execute(st.heartbeat, [adapt(write.expires), write.run_id, write.fence])
                    held = cur.rowcount == 1
                else:
                    cur.execute(st.fence_holds, [write.run_id, write.fence])
                    held = cur.fetchone() is not None
                if held:
                    if write.exists:
                        cur.execute(
                            st.update_step,
                            [write.result, write.attempts, write.error, adapt(write.at), write.run_id, write.step],
                        )
                    else:
                        cur.execute(
                            st.insert_step,
                            [write.run_id, write.step, write.result, write.attempts, write.error, adapt(write.at)],
                        )
                return held, renew

        return retry_deadlocks(record, f"run {write.run_id}: record of step {write.step!r}")

    def _renews(self, wrapper: Any, write: StepWrite) -> bool:
        """Whether this step write renews the lease (else it only checks the fence)."""
        return True

    def commit_pass(
        self, run_id: str, fence: int, fields: dict[str, Any], *, drop_ledger: bool, read_back: bool = False
    ) -> Committed | None:
        """Write the pass's transition and drop its ledger, if ``fence`` still holds; ``None`` if it did not.

        ``read_back`` asks for the run's pause as the commit left it (for a
        further pass under the same claim); without ``RETURNING`` that is one
        more read inside the commit's transaction.
        """

        wrapper, st = self.connection, self.statements
        params = [*self._adapted(wrapper, fields), run_id, fence]
        returning = self.returning

        def commit() -> Committed | None:
            with transaction.atomic(using=self.alias), wrapper.cursor() as cur:
                paused_at = None
                if returning:
                    cur.execute(st.update_fenced(fields) + st.commit_returning, params)
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
                return Committed(self._datetime(paused_at))

        return retry_deadlocks(commit, f"run {run_id}: pass commit")

    def write_fenced(self, run_id: str, fence: int, fields: dict[str, Any]) -> bool:
        """Write ``fields`` (a transition) to the run if ``fence`` is still its fence; return whether it was."""
        wrapper, st = self.connection, self.statements
        with wrapper.cursor() as cur:
            cur.execute(st.update_fenced(fields), [*self._adapted(wrapper, fields), run_id, fence])
            return bool(cur.rowcount == 1)

    def _adapted(self, wrapper: Any, fields: dict[str, Any]) -> list[Any]:
        """The values of ``fields`` as query parameters, datetimes adapted for this database."""
        adapt = wrapper.ops.adapt_datetimefield_value
        return [adapt(v) if isinstance(v, datetime) else v for v in fields.values()]


class SQLiteStore(Store):
    """SQLite: ``RETURNING`` on the claim (3.35+); under IMMEDIATE, fewer page writes per step."""

    returning = sqlite3.sqlite_version_info >= (3, 35)

    def _renews(self, wrapper: Any, write: StepWrite) -> bool:
        # Under IMMEDIATE the transaction holds the database's write lock from
        # BEGIN, so a read of the fence is as good as a locking write, and
        # spares a page write per step while more than half the lease is left.
        # Under the DEFERRED mode a fresh project has, a transaction that reads
        # first and writes later cannot wait for the lock when another
        # connection wrote meanwhile ("database is locked" at once, whatever the
        # timeout), so there the transaction writes first.
        immediate = getattr(wrapper, "transaction_mode", None) in ("IMMEDIATE", "EXCLUSIVE")
        return not (immediate and write.lease_left > write.ttl / 2)


class PostgresStore(Store):
    """PostgreSQL: every fenced write one statement; a plain claim returns the ledger with the run."""

    returning = True

    def claim(
        self, run_id: str, fence: int, holder: str, now: datetime, expires: datetime, *, takeover: str | None = None
    ) -> ClaimedRow | None:
        if takeover is not None:
            return super().claim(run_id, fence, holder, now, expires, takeover=takeover)
        with self.connection.cursor() as cur:
            cur.execute(
                self.statements.claim_with_ledger, self._claim_params(run_id, fence, holder, now, expires, None)
            )
            row = cur.fetchone()
        if row is None:
            return None
        steps = row[len(RUN_FIELDS)]
        ledger = [tuple(entry) for entry in steps] if steps else []
        return self._claimed(row[: len(RUN_FIELDS)], now, ledger)

    def record_step(self, write: StepWrite) -> tuple[bool, bool]:
        wrapper, st = self.connection, self.statements
        adapt = wrapper.ops.adapt_datetimefield_value
        head = [adapt(write.expires), write.run_id, write.fence]
        with self._savepoint_if_nested(wrapper), wrapper.cursor() as cur:
            if write.exists:
                cur.execute(
                    st.update_step_fenced,
                    [*head, write.result, write.attempts, write.error, adapt(write.at), write.step],
                )
            else:
                cur.execute(
                    st.insert_step_fenced,
                    [*head, write.step, write.result, write.attempts, write.error, adapt(write.at)],
                )
            return cur.fetchone() is not None, True

    def commit_pass(
        self, run_id: str, fence: int, fields: dict[str, Any], *, drop_ledger: bool, read_back: bool = False
    ) -> Committed | None:
        wrapper, st = self.connection, self.statements
        text = (
            f"WITH fenced AS ({st.update_fenced_prefix}{st.assignments(fields)}{st.commit_where}"
            f"{st.commit_drop if drop_ledger else st.commit_keep}"
        )
        with self._savepoint_if_nested(wrapper), wrapper.cursor() as cur:
            cur.execute(text, [*self._adapted(wrapper, fields), run_id, fence])
            row = cur.fetchone()
        return None if row is None else Committed(row[0])

    def _savepoint_if_nested(self, wrapper: Any) -> Any:
        """A savepoint around a one-statement write made inside the caller's transaction.

        Outside any transaction the statement is its own and needs none. Inside
        one (a test case, a caller's ``atomic``), a failed statement would
        otherwise abort the caller's whole transaction.
        """
        if wrapper.in_atomic_block:
            return transaction.atomic(using=self.alias)
        return contextlib.nullcontext()


_STORES: dict[str, type[Store]] = {"postgresql": PostgresStore, "sqlite": SQLiteStore}
_built: dict[tuple[str, str], Store] = {}


def store() -> Store:
    """The store of the database the router names for ``JobRun``."""
    alias = db.alias()
    vendor = connections[alias].vendor
    found = _built.get((alias, vendor))
    if found is None:
        found = _built[(alias, vendor)] = _STORES.get(vendor, Store)(alias)
    return found
