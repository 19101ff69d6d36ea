"""Module-level ``@task`` functions the tasks backend's tests enqueue (Django 6's framework, or the backport)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

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
    while not context.stopping and count < 100_000:
        count += 1
        pace.wait(0.01)
    with open(log, "a") as out:
        out.write(f"stopped {count}\n")
    return count
