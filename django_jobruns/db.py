"""Which database the app's rows live in: the one the project's router names for ``JobRun``.

Every read and write of the app goes there -- the engine's own statements,
its transactions, starts, steering, pruning and the admin -- so a project that
routes ``django_jobruns`` to a database of its own (``DATABASE_ROUTERS``) keeps
all of it in one place. Reads that decide what to write go to the write alias
too: a replica could be behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, router
from django.utils import timezone

from .models import JobRun


def alias() -> str:
    """The alias the router names for writing ``JobRun`` (``"default"`` without a router)."""
    return router.db_for_write(JobRun) or "default"


def connection() -> Any:
    """The connection of :func:`alias`, for this thread."""
    return connections[alias()]


def replace_if_broken() -> None:
    """Close this thread's connection if the server dropped it, so the next statement opens a new one.

    Not inside a transaction: the caller's transaction owns the connection.
    """
    wrapper = connection()
    if not wrapper.in_atomic_block:
        wrapper.close_if_unusable_or_obsolete()


def database_clock() -> Callable[[], datetime]:
    """The drive's clock: the database's, on PostgreSQL and MariaDB/MySQL (D12).

    Lease expiry, due-ness and backoff are compared across hosts, so they are
    judged by one clock: the database server's, read once and carried forward
    on this process's monotonic clock (immune to the host's clock being wrong
    or stepped). A host whose clock runs fast therefore cannot take a live
    lease. SQLite is one host's file: its clock is the host's.
    """
    wrapper = connection()
    if wrapper.vendor == "postgresql":
        statement = "SELECT clock_timestamp()"
    elif wrapper.vendor == "mysql":
        statement = "SELECT UTC_TIMESTAMP(6)"
    else:
        return timezone.now
    settings = wrapper.settings_dict
    key = (wrapper.alias, settings.get("HOST"), settings.get("PORT"), settings.get("NAME"))
    cached = _readings.get(key)
    if cached is not None and time.monotonic() - cached[1] < CLOCK_REFRESH_SECONDS:
        return _carried(*cached)
    before = time.monotonic()
    with wrapper.cursor() as cur:
        cur.execute(statement)
        row = cur.fetchone()
    after = time.monotonic()
    value: datetime = row[0]
    if timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    # The server read its clock somewhere inside the round trip: take the middle.
    _readings[key] = (value, (before + after) / 2)
    return _carried(*_readings[key])


#: A reading of the database's clock is reused for this long (the monotonic
#: clock drifts from it by far less than a lease in that time), so a drive
#: costs no extra statement but once a minute.
CLOCK_REFRESH_SECONDS = 60.0
_readings: dict[tuple[Any, ...], tuple[datetime, float]] = {}


def _carried(value: datetime, at: float) -> Callable[[], datetime]:
    def now() -> datetime:
        return value + timedelta(seconds=time.monotonic() - at)

    return now
