"""A sentinel process that ends its drive if the drive's process freezes past a lease it holds (D15, D17).

A body that holds the interpreter's lock (one long call into C: a regex that
backtracks, arithmetic on huge numbers, a parse of hundreds of megabytes)
stops every other thread of its process, the keep-alive's included. Its lease
then lapses while it runs, and another drive would take the run over and run
the body again beside it. No thread of the process can act then; another
process can. So a process that keeps a claim starts one small sentinel (this
file, run by the same interpreter, importing nothing but the standard library)
and tells it, through a pipe, at each of the watchdog's ticks, the moment just
before its first kept lease lapses (:func:`tell`). A driver that may wait on
the network holding that lock (mysqlclient, in some calls, across a partition)
would freeze the process too, and the watchdog, which cuts a statement past
its bound, could not run. So on such a driver the sentinel starts with the
first statement, and the moment is also, for each statement, twice its bound
after it began, if that comes first.

The sentinel ends the drive's process (every thread's traceback printed on
its standard error first, then :data:`EXIT`, whose handler is ``_exit``) when
that moment has passed, no word has come for a second, and the process is
running: not stopped (SIGSTOP, Ctrl-Z), which the sentinel reads in ``/proc``. A stopped worker is left as
it was: once resumed, its watchdog speaks again within a tick, and its body
finds its lease lapsed at its next step (D11) -- re-established if nobody
took the run, fenced out (``lost``) if someone did. The sentinel ends when
the process does (the pipe's end), and never outlives it.

Linux only (``/proc``); elsewhere, or where no sentinel can be started, a
drive runs as before, without it (said once).
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("django_jobruns")

#: How long the sentinel waits, once the moment has passed, for a word after the process was last seen
#: stopped or the sentinel itself could not run: its watchdog speaks every 0.1 s.
GRACE = 1.0
#: How often the sentinel looks while a lease is kept; while none is, it waits for a word up to IDLE.
LOOK = 0.1
IDLE = 1.0
#: The signal on which the drive's process prints every thread's traceback (faulthandler's handler,
#: which needs no lock): a real-time signal, which nothing else sends.
DUMP = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else None
#: The signal on which it ends at once: its handler is libc's ``_exit``, which needs no lock either, and the
#: process exits with the signal's number as its status. SIGKILL cannot end a process that is its PID
#: namespace's first (a container's command, as a Kubernetes CronJob runs it): such a process ignores it.
EXIT = signal.SIGRTMIN + 8 if hasattr(signal, "SIGRTMIN") else None
#: The status of a process ended so (``_exit``'s with that signal's number), or that ends itself for the same cause.
EXIT_STATUS = int(EXIT) if EXIT is not None else 70

_lock = threading.Lock()
#: The sentinel of this process: its process, the pipe's writing end and what the pipe is (its device and
#: inode: a body that closes every descriptor leaves the number to its own files); ``None`` when there is none.
_running: dict[str, Any] = {"proc": None, "fd": None, "pipe": None, "refused": False}
_WORD = struct.Struct("d")


def tell(moment: float | None) -> None:
    """Tell this process's sentinel when to end it if it is frozen (monotonic), or that it holds nothing (``None``).

    The first word with a moment starts the sentinel.
    """
    with _lock:
        fd = _running["fd"]
        if fd is not None and not _ours(fd):
            _drop(closing=False)  # closed under us: the number is someone else's now
            fd = None
        if fd is None:
            if moment is None or _running["refused"]:
                return
            fd = _start()
            if fd is None:
                return
        try:
            os.write(fd, _WORD.pack(math.inf if moment is None else moment))
        except BlockingIOError:
            pass  # the sentinel reads slowly: the next tick's word says as much
        except OSError:
            _drop()  # the sentinel ended: a new one at the next word


def watching() -> bool:
    """Whether a sentinel watches this process (told a moment, and started)."""
    return _running["fd"] is not None


def _start() -> int | None:
    """Start the sentinel (under ``_lock``): the pipe's writing end, or ``None`` where none can run."""
    if not sys.platform.startswith("linux") or DUMP is None or EXIT is None or not sys.executable:
        _refuse("this platform has no /proc", logging.INFO)
        return None
    import faulthandler

    read, write = os.pipe()
    try:
        faulthandler.register(DUMP, file=stderr(), all_threads=True, chain=False)
        _exit_on(EXIT)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), str(read)],
            pass_fds=[read],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
    except (OSError, ValueError, RuntimeError) as exc:
        os.close(read)
        os.close(write)
        _refuse(str(exc), logging.WARNING)
        return None
    os.close(read)
    os.set_blocking(write, False)
    _running.update(proc=proc, fd=write, pipe=_identity(write))
    return write


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _ours(fd: int) -> bool:
    """Whether ``fd`` is still the sentinel's pipe (not closed, nor reused for another file since)."""
    return bool(_identity(fd) == _running["pipe"])


def _exit_on(signum: int) -> None:
    """Have signal ``signum`` end this process at once, from whatever thread receives it: ``_exit`` its handler."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    if libc.signal(int(signum), ctypes.cast(libc["_exit"], ctypes.c_void_p)) == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), f"signal({int(signum)}) was refused")


def _refuse(why: str, level: int) -> None:
    _running["refused"] = True
    logger.log(
        level,
        "no sentinel process could be started (%s): a body that holds the interpreter's lock past its lease "
        "cannot be stopped before its run is taken over",
        why,
    )


def _drop(*, closing: bool = True) -> None:
    fd, proc = _running["fd"], _running["proc"]
    _running.update(fd=None, proc=None, pipe=None)
    if fd is not None and closing:
        os.close(fd)
    if proc is not None:
        proc.poll()


def stderr() -> Any:
    """Where the tracebacks go: ``sys.stderr`` if it is a file, else descriptor 2."""
    try:
        sys.stderr.fileno()
    except Exception:
        return 2
    return sys.stderr


def _forked() -> None:
    """A forked child is not the process its parent's sentinel watches: it starts its own if it drives."""
    global _lock
    _lock = threading.Lock()
    fd = _running["fd"]
    _running.update(fd=None, proc=None, pipe=None, refused=False)
    if fd is not None:
        os.close(fd)


os.register_at_fork(after_in_child=_forked)


# -- the sentinel process itself ------------------------------------------------------


def state(pid: int) -> str | None:
    """Process ``pid``'s state letter from ``/proc`` (``T``: stopped), or ``None`` if it has ended."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in ("Z", "X") else state


def watch(parent: int, fd: int) -> None:
    """Watch ``parent`` until it ends, ending it if it is frozen past the moment its last word named."""
    moment, heard, waited_since = math.inf, time.monotonic(), time.monotonic()
    pending = b""
    previous = time.monotonic()
    while True:
        wait = LOOK if moment < math.inf else IDLE
        ready, _, _ = select.select([fd], [], [], wait)
        now = time.monotonic()
        if now - previous > wait + GRACE / 2:
            waited_since = now  # this process could not run either (stopped with its parent, starved)
        previous = now
        if ready:
            data = os.read(fd, 4096)
            if not data:
                return  # the parent ended
            pending += data
            whole = len(pending) - len(pending) % _WORD.size
            if whole:
                (moment,) = _WORD.unpack(pending[whole - _WORD.size : whole])
                pending, heard = pending[whole:], now
        if os.getppid() != parent:
            return
        letter = state(parent)
        if letter is None:
            return
        if letter in ("T", "t"):
            waited_since = now
            continue
        if now >= moment and now - max(heard, waited_since) >= GRACE:
            _end(parent, now - moment)
            return


def _end(parent: int, late: float) -> None:
    message = (
        f"django_jobruns: process {parent} has run {late:.1f} s past the moment its watchdog named (just before "
        "a lease it holds lapses, or a statement outlasts twice its bound), with no thread of it able to renew "
        "the lease or cut the statement (a body, or a driver waiting on the network, holding the interpreter's "
        "lock?); it is ended, as a killed worker would be, so that no other drive runs its run beside it. "
        "Each of its threads was:\n"
    )
    assert DUMP is not None and EXIT is not None  # a sentinel is started only where both are
    try:
        os.write(2, message.encode())
        os.kill(parent, DUMP)
        time.sleep(0.2)  # the parent's handler prints as the signal arrives: a moment for it, within the margin
        os.kill(parent, EXIT)
        time.sleep(0.1)
        if state(parent) is not None:
            os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended meanwhile


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
