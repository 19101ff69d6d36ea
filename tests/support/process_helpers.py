"""Functions run in freshly spawned processes (no Django imports at module level)."""

from __future__ import annotations

import os
from typing import Any


def start_one_key(env: dict[str, str], barrier: Any, queue: Any, instance: str = "race-proc") -> None:
    """Set Django up against the test database, wait for the others, then start the shared key."""
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connections

    from django_jobruns import start_job_run

    barrier.wait()
    run, created = start_job_run("tests.walk", instance=instance, payload={"log": "/dev/null"})
    queue.put((run.id, created))
    connections.close_all()


def start_and_drive(env: dict[str, str], barrier: Any, queue: Any, log: str, rounds: int) -> None:
    """Start one hot key and drive it, over and over, counting what went wrong instead of raising."""
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connections

    from django_jobruns import run_due_jobs, start_job_run

    starts = joins = committed = 0
    problems: list[str] = []
    unrecorded: list[str] = []
    barrier.wait()
    for _ in range(rounds):
        try:
            _run, created = start_job_run("tests.walk", instance="hot", payload={"log": log, "passes": 1, "steps": 1})
            starts += created
            joins += not created
        except Exception as exc:  # counted: the test asserts there are none
            problems.append(f"start: {type(exc).__name__}: {exc}")
        try:
            report = run_due_jobs(limit=5)
            committed += report.completed
            unrecorded.extend(message for _, message in report.unrecorded)
        except Exception as exc:
            problems.append(f"drive: {type(exc).__name__}: {exc}")
    queue.put(
        {"starts": starts, "joins": joins, "completed": committed, "problems": problems, "unrecorded": unrecorded}
    )
    connections.close_all()
