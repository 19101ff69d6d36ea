"""Which database the app's rows live in: the one the project's router names for ``JobRun``.

Every read and write of the app goes there -- the engine's own statements,
its transactions, starts, steering, pruning and the admin -- so a project that
routes ``django_jobruns`` to a database of its own (``DATABASE_ROUTERS``) keeps
all of it in one place. Reads that decide what to write go to the write alias
too: a replica could be behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypeVar

from django.db import DatabaseError, connections, router
from django.utils import timezone

from . import exceptions
from .store import vendors, watchdog

T = TypeVar("T")

# The model is resolved on first use, not at import: the Tasks backend imports
# this module while Django loads TASKS, before the app registry may be ready
# (or before it holds this app at all, which a check must be free to say).
_model: list[Any] = []


def alias() -> str:
    """The alias the router names for writing ``JobRun`` (``"default"`` without a router)."""
    if not _model:
        from .models import JobRun

        _model.append(JobRun)
    return router.db_for_write(_model[0]) or "default"


def connection() -> Any:
    """The connection of :func:`alias`, for this thread."""
    return connections[alias()]


def in_callers_transaction() -> bool:
    """Whether this thread is inside a transaction its caller opened (a test case's own does not count)."""
    return any(not getattr(block, "_from_testcase", False) for block in connection().atomic_blocks)


def refuse_callers_transaction() -> None:
    """Refuse a drive inside a transaction its caller opened: its commits would roll back with it."""
    if in_callers_transaction():
        raise exceptions.DriveInTransaction(
            "run_due_jobs was called inside a database transaction (transaction.atomic, ATOMIC_REQUESTS): "
            "its commits would roll back with it and the passes it reports would be lost. Drive outside the "
            "transaction: transaction.on_commit(lambda: run_due_jobs(...)) from inside one, or "
            "`manage.py run_due_jobs` from a scheduler"
        )


class Transactions(NamedTuple):
    """What a body may leave changed on this thread's connection: Django's autocommit, an open transaction."""

    wrapper: Any
    autocommit: bool
    open: bool


def transactions(wrapper: Any = None) -> Transactions:
    """This thread's connection's :class:`Transactions` now (no statement: what Django and the driver hold).

    ``wrapper``: that connection, where the caller has it at hand.
    """
    wrapper = wrapper or connection()
    raw = wrapper.connection
    opened = vendors.of(wrapper).in_transaction
    return Transactions(wrapper, wrapper.autocommit, raw is not None and opened is not None and opened(raw))


def undo_left_open(before: Transactions) -> str | None:
    """Roll back a transaction a body left open on this thread's connection, and say how it was left.

    Against ``before``, the connection's :func:`transactions` as the body began: autocommit turned off
    (``transaction.set_autocommit(False)``), or a transaction begun by a ``BEGIN`` sent as text, where
    the driver says so. Its writes are the body's own, never committed: left open, the transaction
    would take in every write of the drive after it, and they would be lost with it. Autocommit is put
    back. An ``atomic`` block left open is not undone here (a step refuses to run inside one).
    """
    wrapper = before.wrapper
    raw = wrapper.connection
    if raw is None or wrapper.in_atomic_block:
        return None
    if before.autocommit and not wrapper.autocommit:
        how = "autocommit turned off and not turned back on"
    elif not before.open and (opened := vendors.of(wrapper).in_transaction) is not None and opened(raw):
        how = "a transaction begun and neither committed nor rolled back"
    else:
        return None
    try:
        if wrapper.autocommit:
            with wrapper.cursor() as cursor:
                cursor.execute("ROLLBACK")
        else:
            wrapper.rollback()
            wrapper.set_autocommit(True)
    except DatabaseError:
        wrapper.close()  # a connection that cannot roll back is closed, and its transaction with it
    return how


def left_open(before: Transactions, what: str, exc: BaseException | None = None) -> Exception | None:
    """The refusal of a body that left a transaction open (:func:`undo_left_open`), once it is rolled back.

    ``what``: the body, in words; ``exc``: what it raised. ``None`` when nothing was left open, and for
    an exit (``SystemExit``, ``KeyboardInterrupt``), which goes on once the transaction is rolled back.
    """
    how = undo_left_open(before)
    if how is None or not isinstance(exc, Exception | None):
        return None
    return exceptions.TransactionLeftOpen(
        f"{what} left a database transaction open ({how}): what it wrote in it was rolled back, not "
        "committed for it, and the drive's next writes would have been lost with it; commit or roll back "
        "every transaction a body begins (transaction.atomic does both)"
    )


def ending_its_transactions(body: Callable[[], T], what: str, wrapper: Any = None) -> T:
    """``body()``; refused with :class:`~django_jobruns.exceptions.TransactionLeftOpen` if it left a
    transaction open on this thread's connection, once that transaction is rolled back (:func:`left_open`).

    ``what``: the body, in words; ``wrapper``: this thread's connection, where the caller has it at hand.
    """
    before = transactions(wrapper)
    try:
        value = body()
    except BaseException as exc:
        if (refused := left_open(before, what, exc)) is not None:
            raise refused from exc
        raise
    if (refused := left_open(before, what)) is not None:
        raise refused
    return value


def replace_if_broken(bound: float | None = None) -> None:
    """Close this thread's connection if the server dropped it, so the next statement opens a new one.

    Not inside a transaction: the caller's transaction owns the connection.
    After an error Django asks the connection whether it still answers (a
    statement of its own), which a partition can leave waiting: that question
    is bounded as the drive's statements are (D15), by ``bound`` or else this
    thread's bound.
    """
    wrapper = connection()
    if wrapper.in_atomic_block or wrapper.connection is None:
        return
    with watchdog.bounding(bound or watchdog.current_bound()), watchdog.guarded(wrapper):
        wrapper.close_if_unusable_or_obsolete()


def mend_after_body(wrapper: Any, exc: BaseException | None = None) -> None:
    """After a body ran on this thread's connection: replace it if the body found it dropped.

    A body's own statement that the server answered by ending the connection
    (a restart, a backend that crashes on it), caught or not, leaves the
    connection dead under the engine's record of the body: that record is
    then written on a new one. The failure is the body's, charged as any; left
    to the engine's write, it would be the engine's, never charged, and the
    run taken again without end. Only once the body met a database error
    (Django's ``errors_occurred``): nothing on the way of a body that met none.
    """
    if wrapper.errors_occurred or isinstance(exc, DatabaseError):
        replace_if_broken()


class Clock(Protocol):
    """The one clock of a drive (D12): what it writes, and how its leases are judged.

    - ``clock()``: the time to write (``updated_at``, a backoff's next attempt)
      and to judge a re-read row's backoff by;
    - ``lease_now()``: the instant lease comparisons and expiries start from,
      as a statement parameter; ``None`` means the database's own clock as the
      statement runs, so no delay on either leg of the statement can move it;
    - ``mark()`` / ``since(mark)``: how much time has passed since a statement
      was *sent*, by which a holder counts down its own lease (an expiry the
      database set starts no earlier than the statement was sent).
    """

    def __call__(self) -> datetime: ...
    def lease_now(self) -> datetime | None: ...
    def mark(self) -> Any: ...
    def since(self, mark: Any) -> timedelta: ...
    def refresh(self) -> None: ...


#: How much faster this host's monotonic clock may run than the database's, as a
#: fraction: a holder counts its lease down this much faster, to stay on the safe
#: side of the database's clock (1e-3 is a thousand times NTP's usual bound).
DRIFT = 1e-3


class _Monotonic:
    """A holder's lease counted on this process's monotonic clock from when its statement was sent."""

    def mark(self) -> float:
        return time.monotonic()

    def since(self, mark: float) -> timedelta:
        return timedelta(seconds=(time.monotonic() - mark) * (1 + DRIFT))

    def refresh(self) -> None:
        pass


class HostClock(_Monotonic):
    """SQLite's clock (and any database's without a clock statement): the host's, which writes the file."""

    def __call__(self) -> datetime:
        return timezone.now()

    def lease_now(self) -> datetime:
        return timezone.now()


class ServerClock(_Monotonic):
    """The database server's clock (PostgreSQL, MariaDB/MySQL).

    Leases are judged and set by the server as each statement runs
    (``lease_now()`` is ``None``), never from an estimate: a delay on the way
    to the server (a connect, a busy pooler) or back cannot make a drive take
    a lease that is live by the server's clock. What the engine writes as a
    value (``updated_at``, a next attempt) comes from an estimate of the
    server's clock -- a reading carried forward on the monotonic clock,
    refreshed once a minute -- where an error of a round trip does no harm.
    """

    def __init__(self, wrapper: Any, statement: str) -> None:
        self.wrapper = wrapper
        self.statement = statement
        settings = wrapper.settings_dict
        self.key = (wrapper.alias, settings.get("HOST"), settings.get("PORT"), settings.get("NAME"))
        # Read when first needed, not here: a drive reads it inside its round,
        # under the statement bound, where a lost connection is replaced.

    def refresh(self) -> None:
        cached = _readings.get(self.key)
        if cached is not None and time.monotonic() - cached[1] < CLOCK_REFRESH_SECONDS:
            return
        before = time.monotonic()
        with watchdog.guarded(self.wrapper), self.wrapper.cursor() as cur:
            cur.execute(self.statement)
            row = cur.fetchone()
        after = time.monotonic()
        value: datetime = row[0]
        if timezone.is_naive(value):
            value = value.replace(tzinfo=UTC)
        # The server read its clock somewhere inside the round trip: the middle
        # is the best guess for values; nothing that a lease decides uses it.
        _readings[self.key] = (value, (before + after) / 2)

    def __call__(self) -> datetime:
        if self.key not in _readings:
            self.refresh()
        value, at = _readings[self.key]
        return value + timedelta(seconds=time.monotonic() - at)

    def lease_now(self) -> None:
        return None


class InjectedClock:
    """A clock a test (or a tool) gives ``run_due_jobs(now=...)``: the one clock of everything, leases included."""

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now()

    def lease_now(self) -> datetime:
        return self.now()

    def mark(self) -> datetime:
        return self.now()

    def since(self, mark: datetime) -> timedelta:
        return self.now() - mark

    def refresh(self) -> None:
        pass


def read_clock_again(clock: Clock) -> None:
    """``clock`` read again as its reading ages, while a drive's threads work (a round may last as long as a task's
    body); by the thread whose connection it reads. A failure is said, not raised: the threads go on, and the
    drive's next round reads the clock again."""
    try:
        clock.refresh()
    except DatabaseError as exc:
        logging.getLogger("django_jobruns").warning("the database's clock could not be read again (%s)", exc)
        replace_if_broken()


def now() -> datetime:
    """The database's clock now (PostgreSQL, MariaDB: a reading carried forward, refreshed once a minute).

    What a start, a cancel or a prune dates by: ``started_at`` orders the due
    runs (D9), and a prune's cutoff must not follow a host whose clock is wrong.
    """
    return database_clock()()


def database_clock() -> Clock:
    """The drive's clock: the database's, on PostgreSQL and MariaDB/MySQL (D12).

    Lease expiry, due-ness and backoff are compared across hosts, so they are
    judged by one clock: the database server's, as each statement runs. A host
    whose clock runs fast or slow, or a statement delayed on either leg,
    therefore cannot take a live lease. SQLite is one host's file: its clock is
    the host's.
    """
    wrapper = connection()
    statement = vendors.of(wrapper).clock
    return HostClock() if statement is None else ServerClock(wrapper, statement)


#: A reading of the database's clock is reused for this long: it only dates what
#: the engine writes as values, never a lease.
CLOCK_REFRESH_SECONDS = 60.0
_readings: dict[tuple[Any, ...], tuple[datetime, float]] = {}
