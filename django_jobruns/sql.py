"""The hot path's statements, written out.

A pass of k fresh steps issues 2k+5 statements (k+3 on PostgreSQL), the
drive's due read included. Built by the ORM, each costs
100-250 µs of Python before it reaches the database -- more, on a fast disk,
than the commits the pass pays for. So the statements a pass repeats are
written here once, with the tables' and columns' real names, and executed
through Django's cursor (its transactions, execute wrappers and query logging
still apply). Everything else -- the due read, the failure path, the operator's
reads -- stays on the ORM.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import db
from .models import JobRun, JobStep

RUN_COLUMNS = (
    "id", "module", "job", "instance", "payload", "status", "cursor", "counters", "attempts", "lease_fence",
    "next_attempt_at", "paused_at",
)


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


_RUN = JobRun._meta.db_table
_STEP = JobStep._meta.db_table


class _Statements:
    """The statements, spelled for one database vendor (built once per vendor)."""

    def __init__(self, wrapper: Any) -> None:
        q = wrapper.ops.quote_name
        run, step = q(_RUN), q(_STEP)
        self.returning = wrapper.vendor == "postgresql" or (
            wrapper.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)
        )
        # SQLite's write transactions hold the whole database's write lock
        # (IMMEDIATE; under DEFERRED a claim committed after the read makes the
        # transaction's write fail instead), so a read of the fence inside one is
        # as good as a locking write. Elsewhere only the heartbeat's row lock is.
        self.read_checks_fence = wrapper.vendor == "sqlite"
        step_set = (
            f"{q('result')} = %s, {q('attempts')} = %s, {q('last_error')} = %s, {q('recorded_at')} = %s"
        )
        step_columns = (
            f"{q('run_id')}, {q('step')}, {q('result')}, {q('attempts')}, {q('last_error')}, {q('recorded_at')}"
        )
        self.columns = ", ".join(q(c) for c in RUN_COLUMNS)
        take = f"{q('lease_holder')} = %s, {q('lease_expires_at')} = %s, {q('lease_fence')} = %s "
        self.claim = (
            f"UPDATE {run} SET {take}"
            f"WHERE {q('id')} = %s AND {q('lease_fence')} = %s "
            f"AND ({q('lease_expires_at')} IS NULL OR {q('lease_expires_at')} <= %s)"
        )
        self.claim_returning = f"{self.claim} RETURNING {self.columns}"
        # A takeover: the run's lease lapsed unreleased, so the pass that held
        # it stopped reporting. The claim charges that pass as a failed attempt
        # in the same statement (the charge first: MySQL evaluates SET left to
        # right, with the values already assigned).
        self.takeover = (
            f"UPDATE {run} SET {q('attempts')} = {q('attempts')} + 1, {q('last_error')} = %s, "
            f"{q('updated_at')} = %s, {take}"
            f"WHERE {q('id')} = %s AND {q('lease_fence')} = %s "
            f"AND {q('lease_holder')} IS NOT NULL AND {q('lease_expires_at')} <= %s"
        )
        self.takeover_returning = f"{self.takeover} RETURNING {self.columns}"
        # PostgreSQL returns the step ledger with the claim, as one JSON array:
        # the claim, the re-read and the ledger read in one round trip.
        self.claim_with_ledger = (
            f"WITH claimed AS ({self.claim} RETURNING {self.columns}) SELECT claimed.*, "
            f"(SELECT json_agg(json_build_array({q('step')}, {q('result')}, {q('attempts')}, {q('last_error')})) "
            f"FROM {step} WHERE {step}.{q('run_id')} = claimed.{q('id')}) FROM claimed"
        )
        self.read_run = f"SELECT {self.columns} FROM {run} WHERE {q('id')} = %s"
        # The due read (JobRunQuerySet.due().in_due_order()): runs in the order
        # they became due -- a run backing off since its next attempt, any
        # other since its start -- then by id; on PostgreSQL and SQLite one
        # range of the partial jobruns_due_order index over the runs in flight.
        since = f"COALESCE({q('next_attempt_at')}, {q('started_at')})"
        due = (
            f"SELECT {q('id')}, {q('lease_fence')}, {q('module')}, {q('job')}, {q('lease_holder')}, {since} "
            f"FROM {run} WHERE {q('status')} = 'running' AND {q('paused_at')} IS NULL "
            f"AND ({q('next_attempt_at')} IS NULL OR {q('next_attempt_at')} <= %s) "
            f"AND ({q('lease_expires_at')} IS NULL OR {q('lease_expires_at')} <= %s)"
        )
        self.due_first = f"{due} ORDER BY {since}, {q('id')} LIMIT %s"
        self.due_after = (
            f"{due} AND ({since} > %s OR ({since} = %s AND {q('id')} > %s)) ORDER BY {since}, {q('id')} LIMIT %s"
        )
        self.ledger = (
            f"SELECT {q('step')}, {q('result')}, {q('attempts')}, {q('last_error')} FROM {step} "
            f"WHERE {q('run_id')} = %s"
        )
        self.fence_holds = f"SELECT 1 FROM {run} WHERE {q('id')} = %s AND {q('lease_fence')} = %s"
        self.heartbeat = (
            f"UPDATE {run} SET {q('lease_expires_at')} = %s WHERE {q('id')} = %s AND {q('lease_fence')} = %s"
        )
        self.update_step = f"UPDATE {step} SET {step_set} WHERE {q('run_id')} = %s AND {q('step')} = %s"
        self.insert_step = f"INSERT INTO {step} ({step_columns}) VALUES (%s, %s, %s, %s, %s, %s)"
        self.update_fenced_prefix = f"UPDATE {run} SET "
        self.update_fenced_where = f" WHERE {q('id')} = %s AND {q('lease_fence')} = %s"
        self.assign: dict[tuple[str, ...], str] = {}
        self.quote = q
        self.drop_ledger = f"DELETE FROM {step} WHERE {q('run_id')} = %s"
        # PostgreSQL: the fence check and the write in ONE statement, through a
        # data-modifying CTE, so a step or a commit is one round trip and one
        # commit, not BEGIN, two statements and COMMIT.
        self.ctes = wrapper.vendor == "postgresql"
        fenced = (
            f"WITH fenced AS (UPDATE {run} SET {q('lease_expires_at')} = %s "
            f"WHERE {q('id')} = %s AND {q('lease_fence')} = %s RETURNING {q('id')}) "
        )
        self.insert_step_fenced = (
            f"{fenced}INSERT INTO {step} ({step_columns}) SELECT {q('id')}, %s, %s, %s, %s, %s FROM fenced RETURNING 1"
        )
        self.update_step_fenced = (
            f"{fenced}UPDATE {step} SET {step_set} FROM fenced WHERE {step}.{q('run_id')} = fenced.{q('id')} "
            f"AND {step}.{q('step')} = %s RETURNING 1"
        )
        self.commit_where = f"{self.update_fenced_where} RETURNING {q('id')}"
        self.commit_drop = (
            f"), dropped AS (DELETE FROM {step} WHERE {q('run_id')} IN (SELECT {q('id')} FROM fenced)) "
            "SELECT COUNT(*) FROM fenced"
        )
        self.commit_keep = ") SELECT COUNT(*) FROM fenced"

    def assignments(self, columns: Any) -> str:
        key = tuple(columns)
        text = self.assign.get(key)
        if text is None:
            text = ", ".join(f"{self.quote(c)} = %s" for c in key)
            self.assign[key] = text
        return text


_statements: dict[str, _Statements] = {}


def _db() -> tuple[Any, _Statements]:
    """The routed connection itself (not a thread-local proxy) and its statements."""
    wrapper = connections[db.alias()]
    statements = _statements.get(wrapper.vendor)
    if statements is None:
        statements = _statements[wrapper.vendor] = _Statements(wrapper)
    return wrapper, statements


def _datetime(value: Any, wrapper: Any) -> datetime | None:
    """A datetime column read by a raw cursor, as the ORM would give it."""
    if value is None or (isinstance(value, datetime) and timezone.is_aware(value)):
        return value
    parsed = parse_datetime(value) if isinstance(value, str) else value
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return timezone.make_aware(parsed, wrapper.timezone) if timezone.is_naive(parsed) else parsed


def _run_from(row: tuple[Any, ...], now: datetime, wrapper: Any, ledger: Ledger | None = None) -> ClaimedRow:
    # Due-ness is judged here, not in SQL: SQLite 3.40's RETURNING evaluates
    # "column IS NULL" wrongly, and the clock is the worker's either way.
    values = dict(zip(RUN_COLUMNS, row, strict=False))
    values["next_attempt_at"] = _datetime(values["next_attempt_at"], wrapper)
    values["paused_at"] = _datetime(values["paused_at"], wrapper)
    run = JobRun(**values)
    due = run.paused_at is None and (run.next_attempt_at is None or run.next_attempt_at <= now)
    return ClaimedRow(run, due, ledger)


def claim(
    run_id: str, fence: int, holder: str, now: datetime, expires: datetime, *, takeover: str | None = None
) -> ClaimedRow | None:
    """Take the run if its fence is still ``fence`` and its lease is free; return it re-read.

    One conditional UPDATE sets the holder, the expiry and the new fence. The
    fence read with the due rows is compared, not the status: a run changed out
    of band since that read is claimed, found not running or not due, and given
    back as stale. Where the database can, the UPDATE returns the row as the
    claim left it; elsewhere it is read back at once.

    ``takeover`` (the error to record) says the due read saw the lease held and
    lapsed: the claim then also charges the silent pass as a failed attempt,
    and the ledger is read by a statement of its own, after the claim. Read in
    the claim's statement it would come from that statement's snapshot, which
    on PostgreSQL can predate a memo the old holder committed while the claim
    waited for the row.
    """
    wrapper, st = _db()
    at = wrapper.ops.adapt_datetimefield_value
    params = [holder, at(expires), fence + 1, run_id, fence, at(now)]
    plain, returning, with_ledger = st.claim, st.claim_returning, st.claim_with_ledger if st.ctes else None
    if takeover is not None:
        params = [takeover, at(now), *params]
        plain, returning, with_ledger = st.takeover, st.takeover_returning, None
    with wrapper.cursor() as cur:
        if with_ledger is not None:
            cur.execute(with_ledger, params)
            row = cur.fetchone()
            if row is None:
                return None
            steps = row[len(RUN_COLUMNS)]
            ledger = [tuple(entry) for entry in steps] if steps else []
            return _run_from(row[: len(RUN_COLUMNS)], now, wrapper, ledger)
        if st.returning:
            cur.execute(returning, params)
            row = cur.fetchone()
            return _run_from(row, now, wrapper) if row is not None else None
        cur.execute(plain, params)
        if cur.rowcount != 1:
            return None
    return read_run(run_id, now)


def read_run(run_id: str, now: datetime) -> ClaimedRow | None:
    """Read the run's decodable state and whether it is due at ``now``."""
    wrapper, st = _db()
    with wrapper.cursor() as cur:
        cur.execute(st.read_run, [run_id])
        row = cur.fetchone()
    return _run_from(row, now, wrapper) if row is not None else None


def due(now: datetime, after: tuple[Any, str] | None, limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` due runs after ``after`` (all, if ``None``), in the order they became due.

    Each row is ``(id, fence, module, job, holder, due since)``; ``after`` is
    the last row's ``(due since, id)``, as read.
    """
    wrapper, st = _db()
    at = wrapper.ops.adapt_datetimefield_value(now)
    with wrapper.cursor() as cur:
        if after is not None:
            since, run_id = after
            cur.execute(st.due_after, [at, at, since, since, run_id, limit])
        else:
            cur.execute(st.due_first, [at, at, limit])
        return list(cur.fetchall())


def ledger(run_id: str) -> Ledger:
    """The step ledger of the pass in flight."""
    wrapper, st = _db()
    with wrapper.cursor() as cur:
        cur.execute(st.ledger, [run_id])
        return list(cur.fetchall())


def heartbeat(run_id: str, fence: int, expires: datetime) -> bool:
    """Extend the lease if ``fence`` is still the run's; the fence check of a step write."""
    wrapper, st = _db()
    with wrapper.cursor() as cur:
        cur.execute(st.heartbeat, [wrapper.ops.adapt_datetimefield_value(expires), run_id, fence])
        return bool(cur.rowcount == 1)


def read_checks_fence() -> bool:
    """Whether a read of the fence inside a write transaction is as good as a locking write.

    SQLite under ``transaction_mode="IMMEDIATE"`` only: there the transaction
    holds the write lock from BEGIN. Under the DEFERRED mode a fresh project
    has, a transaction that reads first and writes later cannot wait for the
    lock when another connection wrote meanwhile (``database is locked`` at
    once, whatever the timeout), so the engine's transactions write first.
    """
    wrapper, st = _db()
    return bool(st.read_checks_fence and getattr(wrapper, "transaction_mode", None) in ("IMMEDIATE", "EXCLUSIVE"))


def _adapted(wrapper: Any, fields: dict[str, Any]) -> list[Any]:
    """The values of ``fields`` as query parameters, datetimes adapted for this database."""
    adapt = wrapper.ops.adapt_datetimefield_value
    return [adapt(v) if isinstance(v, datetime) else v for v in fields.values()]


def one_statement_writes() -> bool:
    """Whether fenced writes are single statements here (PostgreSQL's data-modifying CTEs)."""
    return bool(_db()[1].ctes)


def record_step_fenced(
    run_id: str, fence: int, expires: datetime, step: str, result: str | None, attempts: int,
    error: str | None, at: datetime, *, exists: bool,
) -> bool:
    """Heartbeat, fence check and step record in one statement; return whether the fence held."""
    wrapper, st = _db()
    adapt = wrapper.ops.adapt_datetimefield_value
    head = [adapt(expires), run_id, fence]
    with wrapper.cursor() as cur:
        if exists:
            cur.execute(st.update_step_fenced, [*head, result, attempts, error, adapt(at), step])
        else:
            cur.execute(st.insert_step_fenced, [*head, step, result, attempts, error, adapt(at)])
        return cur.fetchone() is not None


def commit_fenced(run_id: str, fence: int, fields: dict[str, Any], *, drop_ledger: bool) -> bool:
    """Write the run and drop its ledger in one statement, if ``fence`` still holds."""
    wrapper, st = _db()
    params = _adapted(wrapper, fields)
    text = (
        f"WITH fenced AS ({st.update_fenced_prefix}{st.assignments(fields)}{st.commit_where}"
        f"{st.commit_drop if drop_ledger else st.commit_keep}"
    )
    with wrapper.cursor() as cur:
        cur.execute(text, [*params, run_id, fence])
        (count,) = cur.fetchone()
        return bool(count == 1)


def fence_holds(run_id: str, fence: int) -> bool:
    """Whether ``fence`` is still the run's (only meaningful under the database's write lock)."""
    wrapper, st = _db()
    with wrapper.cursor() as cur:
        cur.execute(st.fence_holds, [run_id, fence])
        return cur.fetchone() is not None


def record_step(
    run_id: str, step: str, result: str | None, attempts: int, error: str | None, at: datetime, *, exists: bool
) -> None:
    wrapper, st = _db()
    recorded = wrapper.ops.adapt_datetimefield_value(at)
    with wrapper.cursor() as cur:
        if exists:
            cur.execute(st.update_step, [result, attempts, error, recorded, run_id, step])
        else:
            cur.execute(st.insert_step, [run_id, step, result, attempts, error, recorded])


def update_fenced(run_id: str, fence: int, fields: dict[str, Any]) -> bool:
    """Write ``fields`` to the run if ``fence`` is still its fence; return whether it was."""
    wrapper, st = _db()
    params = _adapted(wrapper, fields)
    with wrapper.cursor() as cur:
        cur.execute(
            f"{st.update_fenced_prefix}{st.assignments(fields)}{st.update_fenced_where}", [*params, run_id, fence]
        )
        return bool(cur.rowcount == 1)


def drop_ledger(run_id: str) -> None:
    wrapper, st = _db()
    with wrapper.cursor() as cur:
        cur.execute(st.drop_ledger, [run_id])
