"""A bound on each of the engine's statements, whatever the network does (D15).

A partition that drops traffic without a reset (a stuck load balancer, a
half-dead NAT) leaves a statement waiting for an answer that never comes, and
neither the database drivers nor TCP keepalives end that wait. So a drive
arms a bound on every statement of its own (:func:`guarded`, used by the
store around each of its operations, commits included); one thread of the
process cuts the connection of a statement that outlasts it -- a shutdown of
its socket, which the driver reports as a lost connection -- and the engine
replaces the connection and goes on, as after any lost connection.

Connecting is bounded too: a drive's connections are opened with
``connect_timeout`` unless the project set one, and the statements Django
sends on a connection it has just opened (a time zone, an isolation level)
are bounded as the engine's are, and so is its check of a connection kept
for reuse (``CONN_HEALTH_CHECKS``), which may open another.

A body can hold the interpreter's lock (one long call into C), and stop
this thread and the keep-alive's past its lease; so can a driver call that
waits on the network (mysqlclient can, in some calls). No
thread of the process can act then; another process can. So this thread
tells the process's sentinel (:mod:`.sentinel`) at each tick when to end the
process if it freezes from then on: the moment just before the first kept
lease lapses by its holder's count (:data:`LAPSE_MARGIN`), or twice an armed
statement's bound after it was armed, on a driver that can hold the lock
(:data:`BACKSTOP`), whichever comes first, but never nearer than
:data:`FLOOR` from now. A process whose threads run pushes that moment on at
every tick; one frozen past it while running is ended by the sentinel (where
each thread was printed first), before another drive can take its run, and
its run is taken over as after a kill. One stopped (SIGSTOP) is left alone:
resumed, its watchdog speaks again within a tick. Where no sentinel runs (not
Linux), ``faulthandler``'s timer is the statements' backstop, which cannot
tell a stopped process from a frozen one.

A connection still opening has no socket to cut yet: ``connect_timeout``
bounds its connect, but not what a driver sends on it before it returns it
(mysqlclient's ``autocommit``). Past twice its bound, counted in the time this
thread ran (so that a process merely stopped meanwhile is not ended for it),
this thread ends the process, printing where each thread was.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import sentinel, vendors

logger = logging.getLogger("django_jobruns")

_local = threading.local()
_lock = threading.Lock()
#: token: (deadline, bound, the socket to cut: one, or none yet while its connection opens; when the sentinel
#: ends the process if it freezes meanwhile, for a statement on a driver that can hold the interpreter's lock)
_armed: dict[int, tuple[float, float, list[int], float | None]] = {}
_tokens = itertools.count()
#: token: how long, of this thread's own running time, a connection has been opening past its deadline
_overdue: dict[int, float] = {}
_started = threading.Event()
#: How often the watchdog looks at the armed statements.
TICK = 0.1
#: A process frozen while running is ended this long before a kept lease lapses by its holder's count:
#: the sentinel's look, its moment for the tracebacks and the kill fit in it.
LAPSE_MARGIN = 1.0
#: The moment told to the sentinel is never nearer than this from now: twenty ticks, so a process whose
#: threads run is never ended, whatever its renewals find.
FLOOR = 2.0
#: A statement on a driver that can hold the interpreter's lock ends its frozen process this long past its
#: bound, counted from its deadline: the watchdog cuts it at its deadline if any thread of the process runs.
BACKSTOP = 1.0
#: What says when the first kept lease lapses (monotonic), if any is kept: the keep-alive's.
_leases: list[Callable[[], float | None]] = []
#: What says when each body must have returned, its run, and whether it is past its pass's timeout: the
#: keep-alive's.
_timeouts: list[Callable[[], list[tuple[float, str, bool]]]] = []
#: The moment the sentinel was last told (``None``: that no lease is kept); the lock that keeps each word in
#: step with what it read.
_told: list[float | None] = [None]
_telling = threading.Lock()


@contextlib.contextmanager
def bounding(seconds: float | None) -> Iterator[None]:
    """Bound each guarded statement this thread runs inside the block to ``seconds`` (``None``: unbounded)."""
    previous = getattr(_local, "bound", None)
    _local.bound = seconds
    try:
        yield
    finally:
        _local.bound = previous


def current_bound() -> float | None:
    """This thread's bound on a statement, inside :func:`bounding`; else ``None``."""
    bound: float | None = getattr(_local, "bound", None)
    return bound


@contextlib.contextmanager
def guarded(wrapper: Any) -> Iterator[None]:
    """Cut ``wrapper``'s connection if the block outlasts this thread's bound."""
    bound = getattr(_local, "bound", None)
    if bound is None or not vendors.of(wrapper).networked:
        yield  # outside a drive, or a database file on this host
        return
    _bound_connects(wrapper, bound)
    deadline = time.monotonic() + bound
    if wrapper.connection is not None and wrapper.health_check_enabled and not wrapper.health_check_done:
        # Django's check of a connection kept for reuse (``CONN_HEALTH_CHECKS``),
        # which replaces a dead one: made here, under the old socket's bound,
        # so that a new connection is set up under the bound as below.
        armed = _arm_socket(wrapper, deadline, bound)
        try:
            wrapper.close_if_health_check_failed()
        finally:
            _disarm_socket(armed)
    if wrapper.connection is None:
        # A new connection: once it is open Django sends statements of its own
        # on it (PostgreSQL's time zone, MariaDB's isolation level), which wait
        # on the network like any other. Its socket is armed as it opens.
        opened: list[int] = []
        token = _arm(wrapper, deadline, bound, opened)
        try:
            _connect(wrapper, opened)
        finally:
            _disarm(token)
            for sock in opened:
                os.close(sock)
    armed = _arm_socket(wrapper, deadline, bound)
    try:
        yield
    finally:
        _disarm_socket(armed)


def _connect(wrapper: Any, opened: list[int]) -> None:
    """Open ``wrapper``'s connection, putting a duplicate of its socket in ``opened`` before Django's statements on it.

    In this thread, between the driver's connect and Django's set-up of the
    new connection: a driver may refuse to be asked for its socket from
    another thread while a statement waits (mysqlclient does).
    """
    connect = wrapper.get_new_connection

    def noting_the_socket(conn_params: Any) -> Any:
        new = connect(conn_params)
        with contextlib.suppress(Exception):  # no socket to arm: ``connect_timeout`` and the backstop remain
            opened.append(os.dup(new.fileno()))
        return new

    wrapper.get_new_connection = noting_the_socket
    try:
        wrapper.ensure_connection()
    finally:
        del wrapper.get_new_connection


def _arm_socket(wrapper: Any, deadline: float, bound: float) -> tuple[int, int] | None:
    """Have the socket of ``wrapper``'s open connection cut once ``deadline`` passes: the token and the duplicate armed.

    The socket is taken here, in the thread that owns the connection (a
    driver may refuse to be touched from another), as a duplicate: it stays
    this socket for as long as it is armed, whatever reuses the number.
    ``None``: a connection already lost, which the statement finds out
    through Django, reported as the engine's own error (and replaced).
    """
    try:
        sock = os.dup(wrapper.connection.fileno())
    except Exception:
        return None
    return _arm(wrapper, deadline, bound, [sock]), sock


def _disarm_socket(armed: tuple[int, int] | None) -> None:
    if armed is not None:
        _disarm(armed[0])
        os.close(armed[1])


def _arm(wrapper: Any, deadline: float, bound: float, target: list[int]) -> int:
    """Have the socket in ``target`` cut once ``deadline`` passes (empty while its connection opens: not yet).

    On a driver that can hold the interpreter's lock as it waits, the sentinel
    is told first, in this thread, when to end the process if it freezes in
    the statement: past its bound twice over.
    """
    token = next(_tokens)
    holds = vendors.of(wrapper).holds_the_lock
    with _lock:
        _armed[token] = (deadline, bound, target, deadline + bound + BACKSTOP if holds else None)
    start()
    if holds:
        _tell_sentinel(time.monotonic(), sooner_only=True)
        if not sentinel.watching():
            with _lock:
                _arm_backstop(time.monotonic(), bound)
    return token


def _disarm(token: int) -> None:
    with _lock:
        _armed.pop(token, None)
        _overdue.pop(token, None)


_backstop: list[float] = []  # when the armed backstop fires, if one is armed


def _arm_backstop(now: float, bound: float) -> None:
    """Where no sentinel runs: arm ``faulthandler``'s timer to end the process twice the bound from now.

    Called under ``_lock``. Re-armed only when less than a bound is left (arming starts a thread); the
    watchdog disarms it once nothing has been armed for a tick.
    """
    if _backstop and _backstop[0] - now > bound + 1:
        return
    faulthandler.dump_traceback_later(2 * bound + 1, exit=True)
    _backstop[:] = [now + 2 * bound + 1]


def watch_leases(first_lapse: Callable[[], float | None]) -> None:
    """Have the sentinel end this process if it freezes, running, past a kept lease (the keep-alive's hook)."""
    _leases[:] = [first_lapse]


def watch_timeouts(ends: Callable[[], list[tuple[float, str, bool]]]) -> None:
    """End this process when a body still runs at a moment ``ends`` gives (the keep-alive's hook): one past its
    pass's timeout (D19), or one whose lease is about to lapse, its renewals failing (D17). This thread is not
    held up by any statement. A process stopped (SIGSTOP) across a lapse is left to the fence on resuming."""
    _timeouts[:] = [ends]


def kept() -> None:
    """A claim was kept: the sentinel told now, in the claiming thread, before the claim's body can run.

    Only if the claim's moment comes before the one the sentinel knows: at the
    next tick the watchdog tells it anyway.
    """
    start()
    _tell_sentinel(time.monotonic(), sooner_only=True)


def _tell_sentinel(now: float, *, sooner_only: bool = False) -> None:
    """Tell the sentinel when to end this process if it freezes from now on, or that nothing is at stake."""
    with _telling:
        lapse = _leases[0]() if _leases else None
        with _lock:
            backstops = [armed[3] for armed in _armed.values() if armed[3] is not None]
        ends = [*backstops] if lapse is None else [lapse - LAPSE_MARGIN, *backstops]
        if not ends:
            if _told[0] is not None:
                _told[0] = None
                sentinel.tell(None)
            return
        moment = max(min(ends), now + FLOOR)
        if sooner_only and _told[0] is not None and _told[0] <= moment:
            return
        _told[0] = moment
        sentinel.tell(moment)


def _forked() -> None:
    """A forked child has none of its parent's threads: its watchdog starts when it needs one."""
    global _lock, _telling
    _lock, _telling = threading.Lock(), threading.Lock()  # perhaps held by a thread the child does not have
    _armed.clear()
    _overdue.clear()
    _started.clear()
    _told[0] = None


os.register_at_fork(after_in_child=_forked)


def _bound_connects(wrapper: Any, bound: float) -> None:
    options = wrapper.settings_dict.setdefault("OPTIONS", {})
    if "connect_timeout" not in options:
        options["connect_timeout"] = max(2, min(10, int(bound / 4)))


def start() -> None:
    """Start the watchdog thread, if it is not running."""
    if _started.is_set():
        return
    with _lock:
        if not _started.is_set():
            threading.Thread(target=_watch, name="jobruns-watchdog", daemon=True).start()
            _started.set()


def _watch() -> None:
    idle = threading.Event()
    previous = time.monotonic()
    while True:
        idle.wait(TICK)
        now = time.monotonic()
        # What this thread ran since its last look; a longer gap is time the process was stopped (or starved).
        before = previous
        ran, previous = min(now - previous, 2 * TICK), now
        with _lock:
            for token, (deadline, bound, target, _) in list(_armed.items()):
                if now < deadline:
                    continue
                if target:
                    _armed.pop(token)
                    _cut(target[0], bound)
                    continue
                # Still opening, with no socket to cut yet: ``connect_timeout`` bounds the connect, but not
                # what a driver sends on it before it returns it (mysqlclient's ``autocommit``).
                _overdue[token] = _overdue.get(token, 0.0) + ran
                if _overdue[token] >= bound + BACKSTOP:
                    _end_opening(bound)
            if _backstop and not _armed:
                faulthandler.cancel_dump_traceback_later()
                _backstop.clear()
        for moment, run_id, timed_out in _timeouts[0]() if _timeouts else ():
            if now < moment:
                continue
            if timed_out:
                _end_overdue_body(run_id)
            elif before < moment and now - before < LAPSE_MARGIN:
                # Reached while the process ran: a lapse that came while it was stopped is left to the fence.
                _end_lapsing_body(run_id)
        _tell_sentinel(now)


def _end_opening(bound: float) -> None:
    """End this process: a connection outlasted twice its bound as it opened, and nothing else can end the wait."""
    _end(
        logging.ERROR,
        "a connection outlasted twice its bound of %.1f s as it opened (a partition?), with no socket to cut yet: "
        "the process ends, as a killed worker would, its runs taken over when their leases lapse.",
        bound,
    )


def _end_overdue_body(run_id: str) -> None:
    """End this process: a body past its pass's timeout still runs, and its lease is about to lapse (D19)."""
    _end(
        logging.CRITICAL,
        "run %s: its pass ran past its timeout and its body has not returned with a quarter of its lease left: "
        "the process ends, as a killed worker would, so that the drive that takes the run over (charged) when "
        "its lease lapses never runs it beside this body.",
        run_id,
    )


def _end_lapsing_body(run_id: str) -> None:
    """End this process: a body still runs, its lease about to lapse, no renewal having landed (D17)."""
    _end(
        logging.CRITICAL,
        "run %s: its lease is about to lapse, no renewal having landed (cut off from the database?), and its body "
        "has not returned: the process ends, as a killed worker would, so that the drive that takes the run over "
        "(charged) never runs it beside this body.",
        run_id,
    )


def _end(level: int, why: str, *args: Any) -> None:
    """Say why, print where each thread was, and end this process at once (as the sentinel would)."""
    logger.log(level, f"{why} Each of its threads was:", *args)
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(file=sentinel.stderr(), all_threads=True)
    os._exit(sentinel.EXIT_STATUS)


def _cut(fd: int, bound: float) -> None:
    """Shut the socket down under the waiting driver: it reports a lost connection at once."""
    logger.warning("a statement outlasted its bound of %.1f s (a partition?): its connection is cut", bound)
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        logger.debug("could not cut the connection", exc_info=True)
