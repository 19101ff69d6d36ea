"""Module-level ``@task`` functions the tasks backend's tests enqueue (Django 6's framework, or the backport)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from django.db import InterfaceError, OperationalError, connection

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def failing_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task(priority=10, queue_name="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"


@task()
def flaky(log: str, fail_times: int) -> str:
    """Fails its first ``fail_times`` attempts (counted in the file ``log``), then succeeds."""
    path = Path(log)
    done = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as out:
        out.write("attempt\n")
    if done < fail_times:
        raise ConnectionError(f"upstream down (attempt {done + 1})")
    return "ok"


@task(takes_context=True)
def durable_steps(context: Any, log: str, die_after_first: bool) -> dict[str, Any]:
    """Two durable steps; the first SIGKILLs its worker after recording, once (a marker file says when)."""
    marker = Path(log + ".died")

    def first() -> str:
        with open(log, "a") as out:
            out.write("first\n")
        return "one"

    def second() -> str:
        with open(log, "a") as out:
            out.write("second\n")
        return "two"

    a = context.step("first", first)
    if die_after_first and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    b = context.step("second", second)
    context.count("steps", 2)
    return {"a": a, "b": b, "attempt": context.attempt}


@task()
def hangs_until_killed(log: str) -> None:
    with open(log, "a") as out:
        out.write("started\n")
    os.kill(os.getpid(), signal.SIGKILL)


@task()
def gives_up() -> None:
    from django_jobruns import GiveUp

    raise GiveUp("the order was deleted: nothing to do, ever")


@task()
def blocking_task(log: str, fifo: str, release: str) -> str:
    """Announces itself on the FIFO ``fifo``, then runs until the test opens the FIFO ``release``."""
    with open(log, "a") as out:
        out.write(f"started {os.getpid()}\n")
    with open(fifo, "w") as entered:
        entered.write(f"{os.getpid()}\n")
    with open(release) as let_go:
        let_go.read()
    return "finished"


@task(takes_context=True)
def stoppable_task(context: Any, log: str, fifo: str) -> int:
    """Counts until ``context.stopping`` (D18), announcing itself on the FIFO ``fifo`` first."""
    import threading

    with open(fifo, "w") as entered:
        entered.write(f"{os.getpid()}\n")
    count = 0
    pace = threading.Event()
    while True:  # one count at least: the stop may come before the first look at it
        count += 1
        if context.stopping or count >= 100_000:
            break
        pace.wait(0.01)
    with open(log, "a") as out:
        out.write(f"stopped {count}\n")
    return count


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = {"level": level, "inner": [value]} if level % 2 else [value]
    return value


#: What ``echo`` returns, by kind: values Django's own backends accept (``normalize_json``) or refuse.
def _values() -> dict[str, Any]:
    from collections import OrderedDict, defaultdict
    from datetime import datetime

    from django.utils.safestring import mark_safe

    return {
        "safe": mark_safe("<p>Hello</p>"),
        "tuple": (1, (2, "three")),
        "ordered": OrderedDict([("b", 1), ("a", [1, 2])]),
        "defaultdict": defaultdict(list, {"k": [1]}),
        "int_keys": {1: "one", 2: {3: "three"}},
        "bytes": b"bytes",
        "big_ints": [10**30, -(10**25)],  # past 64 bits: JSON and Python carry them exactly
        "deep": _nested(100),
        "two_mib": "x" * 2 * 1024 * 1024,
        "set": {1, 2},
        "datetime": datetime(2026, 1, 1),
        "nan": float("nan"),
    }


@task()
def echo(kind: str, log: str = "") -> Any:
    """Returns the value of ``kind``; each body run leaves a line in ``log``."""
    if log:
        with open(log, "a") as out:
            out.write(f"{kind}\n")
    return _values()[kind]


@task(takes_context=True)
def which_attempt(context: Any) -> dict[str, Any]:
    return {"attempt": context.attempt, "backend": context.task_result.backend}


@task(takes_context=True)
async def async_steps(context: Any, log: str) -> list[Any]:
    async def fetch() -> str:
        with open(log, "a") as out:
            out.write("fetch\n")
        return "fetched"

    def save() -> int:
        with open(log, "a") as out:
            out.write("save\n")
        return 2

    first = await context.astep("fetch", fetch)
    second = await context.astep("save", save)
    return [first, second]


@task(takes_context=True)
async def sync_step_in_async(context: Any) -> None:
    context.step("nope", lambda: 1)


@task(takes_context=True)
def loses_its_lease(context: Any) -> str:
    """Another worker takes the run over while this one runs (its fence moves on), then a step is asked for."""
    from django.db.models import F

    from django_jobruns.models import JobRun

    JobRun.objects.filter(pk=context.task_result.id).update(lease_fence=F("lease_fence") + 1)
    context.step("after", lambda: "never")
    return "never"


#: Events a test hands to ``set_event`` by name (one process: the drive runs in the test's).
EVENTS: dict[str, Any] = {}


@task()
def set_event(name: str) -> str:
    """Sets the test's event ``name`` (a drive's stop, from inside a task body)."""
    EVENTS[name].set()
    return name


@task()
def leaves_autocommit_off() -> str:
    """Turns autocommit off and returns, its transaction left open."""
    from django.db import transaction

    transaction.set_autocommit(False)
    return "left open"


@task()
def exits(code: int) -> None:
    """Calls ``sys.exit`` (what a command-line library does on a bad argument)."""
    import sys

    sys.exit(code)


@task()
async def cancelled() -> None:
    """Raises ``CancelledError`` out of its body (an awaited inner task that was cancelled)."""
    import asyncio

    raise asyncio.CancelledError()


@task()
def interrupted() -> None:
    """Raises ``KeyboardInterrupt`` (Ctrl-C while it ran)."""
    raise KeyboardInterrupt


@task()
def raises_unstorable_text(log: str) -> None:
    """Raises an error whose text holds NUL and a lone surrogate, which PostgreSQL's text cannot hold as they are."""
    with open(log, "a") as out:
        out.write("ran\n")
    raise ValueError("the payload held \x00 and " + chr(0xD800))


@task()
def raises_a_whole_body(log: str) -> None:
    """Raises an error carrying 20 MB (a response body), more than MariaDB's default packet of 16 MB."""
    with open(log, "a") as out:
        out.write("ran\n")
    raise ValueError("<html>" + "x" * 20_000_000 + "</html>")


@task()
def ends_its_connection(swallow: bool) -> str:
    """Its own statement ends its connection on the server, as a restart or a crashed backend would."""
    end_own_connection(swallow=swallow)
    return "went on"


#: The statement by which a session ends itself on the server, by vendor.
END_OWN_CONNECTION = {"postgresql": "SELECT pg_terminate_backend(pg_backend_pid())", "mysql": "KILL CONNECTION_ID()"}


def end_own_connection(*, swallow: bool) -> None:
    """A body's own statement ends its connection on the server (a restart, a backend that crashes on it)."""
    try:
        with connection.cursor() as cur:
            cur.execute(END_OWN_CONNECTION[connection.vendor])
            cur.fetchall()
    except (OperationalError, InterfaceError):
        if not swallow:
            raise
    else:
        raise AssertionError("the server did not end the connection")
