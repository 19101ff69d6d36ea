"""Fixture jobs, autodiscovered like any app's jobs.py (registered as ``tests.<name>``)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django_jobruns import RetryPolicy, job

# In-process tests script the ``scripted`` job per instance.
BEHAVIOUR: dict[str, Callable[[Any], Any]] = {}
# Events the ``blocking`` job waits on, per instance: (entered, release).
GATES: dict[str, tuple[threading.Event, threading.Event]] = {}

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay=60, max_delay=3600, factor=2, jitter=0)


def effect(log: str, run_id: str, step: str) -> str:
    """Append one line per executed step body: the independent evidence of work done."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{run_id} {step} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    return step


@job(retry=FAST_RETRY)
def walk(p: Any) -> dict[str, Any]:
    """``passes`` passes of ``steps`` steps each; every step body leaves an effect line."""
    payload = p.payload
    position = p.cursor or 0
    for index in range(payload.get("steps", 3)):
        name = f"p{position}-s{index}"
        p.step(name, lambda name=name: effect(payload["log"], p.run.id, name))
    p.count("steps", payload.get("steps", 3))
    p.count("passes")
    following = position + 1
    if following >= payload.get("passes", 1):
        return {"cursor": following, "done": True}
    return {"cursor": following}


@job(retry=FAST_RETRY)
def scripted(p: Any) -> Any:
    """Whatever the test put in ``BEHAVIOUR`` under the run's instance."""
    return BEHAVIOUR[p.run.instance](p)


@job(retry=FAST_RETRY)
def blocking(p: Any) -> Any:
    """Two steps; the first blocks until the test says so.

    In-process: on the ``GATES`` events of the run's instance. Across processes:
    it opens the FIFO ``payload["fifo"]`` for writing (which blocks until the test
    opens it to read, so the test knows the worker is inside the step), then
    waits until the test opens the FIFO ``payload["release"]`` (or forever) --
    unless ``payload["marker"]`` exists, left by an earlier attempt, in which
    case it returns at once (after opening the FIFO ``payload["rescued"]`` for
    writing, if given: the test then knows another worker took the run over).
    """
    payload = p.payload or {}

    def first() -> str:
        if "log" in payload:
            effect(payload["log"], p.run.id, "first")
        if "fifo" in payload:
            marker = Path(payload["marker"])
            if marker.exists() and "rescued" in payload:
                with open(payload["rescued"], "w") as rescued:
                    rescued.write(f"{os.getpid()}\n")
            if not marker.exists():
                marker.touch()
                with open(payload["fifo"], "w") as fifo:
                    fifo.write(f"{os.getpid()}\n")
                if "release" in payload:
                    with open(payload["release"]) as release:  # until the test lets go
                        release.read()
                else:
                    threading.Event().wait()
        elif p.run.instance in GATES:
            entered, let_go = GATES[p.run.instance]
            if not entered.is_set():
                entered.set()
                let_go.wait(timeout=60)
        return "first"

    p.step("before", lambda: effect(payload["log"], p.run.id, "before") if "log" in payload else "before")
    p.step("first", first)
    p.step("second", lambda: effect(payload["log"], p.run.id, "second") if "log" in payload else "second")
    p.count("passes")
    return {"cursor": "end", "done": True}


#: ``blocking`` with a pass time limit of 5 seconds (D19): its first attempt ignores it.
overrunning = job("overrunning", retry=FAST_RETRY, lease=5, timeout=5)(blocking.handler)


@job(retry=FAST_RETRY, lease=5)
def looping(p: Any) -> dict[str, Any]:
    """One long step walking ``payload["items"]`` items, checking ``p.stopping`` after each (D18).

    Each item leaves an effect line; the step returns how far it got, and the
    handler hands that forward as the cursor. The first item announces the
    worker's pid on the FIFO ``payload["fifo"]``; when the walk stops early, the
    wall-clock time it saw ``stopping`` is written to ``payload["seen"]``.
    """
    payload = p.payload
    start = p.cursor or 0

    def walk() -> int:
        item = start
        pace = threading.Event()
        while item < payload["items"] and not p.stopping:
            effect(payload["log"], p.run.id, f"item-{item}")
            if item == start and "fifo" in payload:
                with open(payload["fifo"], "w") as fifo:
                    fifo.write(f"{os.getpid()}\n")
            item += 1
            pace.wait(payload.get("pace", 0.01))  # the work an item takes
        if item < payload["items"] and "seen" in payload:
            Path(payload["seen"]).write_text(repr(time.time()))
        return item

    reached = p.step(f"walk:{start}", walk)
    return {"cursor": reached, "done": reached >= payload["items"]}


# Jobs for assert_resumable's own tests: one right, and one wrong in each way it catches.
STATE: dict[str, int] = {}


@job(retry=FAST_RETRY)
def resumable(p: Any) -> dict[str, Any]:
    """Right: step names come from the cursor, all state flows through steps and counters."""
    page = p.cursor or 0
    items = p.step(f"fetch:{page}", lambda: [page * 10 + i for i in range(3)])
    p.step(f"save:{page}", lambda: sum(items))
    p.count("items", len(items))
    return {"cursor": page + 1, "done": page + 1 >= 2}


@job(retry=FAST_RETRY)
def stamped_names(p: Any) -> dict[str, Any]:
    """Wrong: a step name carries a value that changes between attempts."""
    STATE["stamp"] = STATE.get("stamp", 0) + 1
    p.step(f"fetch@{STATE['stamp']}", lambda: 1)
    p.step("save", lambda: 2)
    return {"done": True}


@job(retry=FAST_RETRY)
def probing(p: Any) -> dict[str, Any]:
    """Wrong: a step is asked for only on the first attempt, so its memo goes unused."""
    if not STATE.get(f"probed:{p.run.id}"):
        STATE[f"probed:{p.run.id}"] = 1
        p.step("probe", lambda: "ok")
    p.step("work", lambda: 1)
    return {"done": True}


@job(retry=FAST_RETRY)
def outside_state(p: Any) -> dict[str, Any]:
    """Wrong: the cursor comes from state changed outside any step."""
    STATE["calls"] = STATE.get("calls", 0) + 1
    p.step("work", lambda: 1)
    p.step("more", lambda: 2)
    return {"cursor": STATE["calls"], "done": True}


@job(retry=FAST_RETRY)
def suicidal(p: Any) -> dict[str, Any]:
    """A pass that kills its own worker process (as an out-of-memory kill would), every time."""
    log = p.payload["log"]
    p.step("before", lambda: effect(log, p.run.id, "before"))

    def die() -> None:
        effect(log, p.run.id, "die")
        os.kill(os.getpid(), signal.SIGKILL)

    p.step("die", die)
    return {"done": True}


@job(retry=FAST_RETRY)
def paced(p: Any) -> dict[str, Any]:
    """Step ``a``, then ``think`` seconds of the handler's own work, then step ``c``.

    Step ``c``'s body writes, as its effect, whether the run's lease is live by
    the database's clock and whose it is as the body starts.
    """
    from django.db import connection

    payload = p.payload
    p.step("a", lambda: effect(payload["log"], p.run.id, "a"))
    threading.Event().wait(payload["think"])  # the handler computing: no statement, no step

    def c() -> str:
        if not payload.get("probe", True):
            return effect(payload["log"], p.run.id, "c")
        server_now = "clock_timestamp()" if connection.vendor == "postgresql" else "UTC_TIMESTAMP(6)"
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT lease_holder, lease_expires_at > {server_now} AS live "
                "FROM django_jobruns_jobrun WHERE id = %s",
                [p.run.id],
            )
            holder, live = cur.fetchone()
        return effect(payload["log"], p.run.id, f"c:{holder}:{'live' if live else 'lapsed'}")

    p.step("c", c)
    return {"done": True}


def _still_running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet reaped, does not)."""
    from django_jobruns.store import sentinel

    return sentinel.state(pid) is not None


@job(retry=FAST_RETRY)
def holds_the_lock(p: Any) -> dict[str, Any]:
    """One step whose first body holds the interpreter's lock until a later body lets it go (one call into C).

    The first body leaves its pid in ``payload["marker"]``, announces itself on
    the FIFO ``payload["fifo"]``, then reads one byte from the FIFO
    ``payload["release"]`` through ``ctypes.PyDLL``, which keeps the
    interpreter's lock: no other thread of its process runs until a byte comes
    (a signal's handler does not end the read). It leaves the effect ``held`` if
    it ever returns. A later body leaves ``after:running`` or ``after:gone``
    (whether the first body's process, or the one ``payload["watch"]`` names,
    still ran as it started), then writes the byte that lets a first body still
    running go on.
    """
    import ctypes
    import ctypes.util

    payload = p.payload

    def crunch() -> str:
        marker = Path(payload["marker"])
        if marker.exists():
            first = int(payload.get("watch") or marker.read_text())
            seen = effect(payload["log"], p.run.id, f"after:{'running' if _still_running(first) else 'gone'}")
            try:
                release = os.open(payload["release"], os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return seen  # nobody reads it: the first body's process is gone
            os.write(release, b"x")
            os.close(release)
            return seen
        marker.write_text(str(os.getpid()))
        release = os.open(payload["release"], os.O_RDWR)  # a reader that blocks until a byte comes
        with open(payload["fifo"], "w") as fifo:
            fifo.write(f"{os.getpid()}\n")
        ctypes.PyDLL(ctypes.util.find_library("c")).read(release, ctypes.create_string_buffer(1), 1)
        return effect(payload["log"], p.run.id, "held")

    p.step("crunch", crunch)
    return {"done": True}
