"""The hot path's statements, written out.

A pass of k fresh steps issues 2k+5 statements. Built by the ORM, each costs
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

from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .models import JobRun, JobStep

RUN_COLUMNS = (
    "id", "module", "job", "instance", "payload", "status", "cursor", "counters", "attempts", "lease_fence",
    "next_attempt_at",
)


@dataclass(frozen=True)
class ClaimedRow:
    """The run as the claim left it, and whether it is still due (re-read under the claim)."""

    run: JobRun
    due: bool


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _at(value: datetime) -> Any:
    return connection.ops.adapt_datetimefield_value(value)


def _returning() -> bool:
    """UPDATE … RETURNING: PostgreSQL, and SQLite from 3.35."""
    if connection.vendor == "postgresql":
        return True
    return connection.vendor == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)


_RUN = JobRun._meta.db_table
_STEP = JobStep._meta.db_table


def _row_select() -> str:
    return ", ".join(_q(c) for c in RUN_COLUMNS)


def _datetime(value: Any) -> datetime | None:
    """A datetime column read by a raw cursor, as the ORM would give it."""
    if value is None or (isinstance(value, datetime) and timezone.is_aware(value)):
        return value
    parsed = parse_datetime(value) if isinstance(value, str) else value
    if parsed is None:
        raise ValueError(f"not a datetime: {value!r}")
    return timezone.make_aware(parsed, connection.timezone) if timezone.is_naive(parsed) else parsed


def _run_from(row: tuple[Any, ...], now: datetime) -> ClaimedRow:
    # Due-ness is judged here, not in SQL: SQLite 3.40's RETURNING evaluates
    # "column IS NULL" wrongly, and the clock is the worker's either way.
    values = dict(zip(RUN_COLUMNS, row))
    values["next_attempt_at"] = _datetime(values["next_attempt_at"])
    run = JobRun(**values)
    return ClaimedRow(run, run.next_attempt_at is None or run.next_attempt_at <= now)


def claim(run_id: str, fence: int, holder: str, now: datetime, expires: datetime) -> ClaimedRow | None:
    """Take the run if its fence is still ``fence`` and its lease is free; return it re-read.

    One conditional UPDATE sets the holder, the expiry and the new fence. The
    fence read with the due rows is compared, not the status: a run changed out
    of band since that read is claimed, found not running or not due, and given
    back as stale. Where the database can, the UPDATE returns the row as the
    claim left it; elsewhere it is read back at once.
    """
    where = (
        f"WHERE {_q('id')} = %s AND {_q('lease_fence')} = %s "
        f"AND ({_q('lease_expires_at')} IS NULL OR {_q('lease_expires_at')} <= %s)"
    )
    update = (
        f"UPDATE {_q(_RUN)} SET {_q('lease_holder')} = %s, {_q('lease_expires_at')} = %s, "
        f"{_q('lease_fence')} = %s {where}"
    )
    params = [holder, _at(expires), fence + 1, run_id, fence, _at(now)]
    with connection.cursor() as cur:
        if _returning():
            cur.execute(f"{update} RETURNING {_row_select()}", params)
            row = cur.fetchone()
            return _run_from(row, now) if row is not None else None
        cur.execute(update, params)
        if cur.rowcount != 1:
            return None
    return read_run(run_id, now)


def read_run(run_id: str, now: datetime) -> ClaimedRow | None:
    """Read the run's decodable state and whether it is due at ``now``."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {_row_select()} FROM {_q(_RUN)} WHERE {_q('id')} = %s", [run_id])
        row = cur.fetchone()
    return _run_from(row, now) if row is not None else None


def ledger(run_id: str) -> list[tuple[str, str | None, int, str | None]]:
    """The step ledger of the pass in flight."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT {_q('step')}, {_q('result')}, {_q('attempts')}, {_q('last_error')} "
            f"FROM {_q(_STEP)} WHERE {_q('run_id')} = %s",
            [run_id],
        )
        return list(cur.fetchall())


def heartbeat(run_id: str, fence: int, expires: datetime) -> bool:
    """Extend the lease if ``fence`` is still the run's; the fence check of a step write."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_q(_RUN)} SET {_q('lease_expires_at')} = %s WHERE {_q('id')} = %s AND {_q('lease_fence')} = %s",
            [_at(expires), run_id, fence],
        )
        return bool(cur.rowcount == 1)


def record_step(
    run_id: str, step: str, result: str | None, attempts: int, error: str | None, at: datetime, *, exists: bool
) -> None:
    with connection.cursor() as cur:
        if exists:
            cur.execute(
                f"UPDATE {_q(_STEP)} SET {_q('result')} = %s, {_q('attempts')} = %s, {_q('last_error')} = %s, "
                f"{_q('recorded_at')} = %s WHERE {_q('run_id')} = %s AND {_q('step')} = %s",
                [result, attempts, error, _at(at), run_id, step],
            )
        else:
            cur.execute(
                f"INSERT INTO {_q(_STEP)} ({_q('run_id')}, {_q('step')}, {_q('result')}, {_q('attempts')}, "
                f"{_q('last_error')}, {_q('recorded_at')}) VALUES (%s, %s, %s, %s, %s, %s)",
                [run_id, step, result, attempts, error, _at(at)],
            )


def update_fenced(run_id: str, fence: int, fields: dict[str, Any]) -> bool:
    """Write ``fields`` to the run if ``fence`` is still its fence; return whether it was."""
    assignments = ", ".join(f"{_q(column)} = %s" for column in fields)
    params = [_at(v) if isinstance(v, datetime) else v for v in fields.values()]
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_q(_RUN)} SET {assignments} WHERE {_q('id')} = %s AND {_q('lease_fence')} = %s",
            [*params, run_id, fence],
        )
        return bool(cur.rowcount == 1)


def drop_ledger(run_id: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"DELETE FROM {_q(_STEP)} WHERE {_q('run_id')} = %s", [run_id])
