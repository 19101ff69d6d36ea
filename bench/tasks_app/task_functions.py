"""The benchmark's tasks: a no-op, one that returns when it started (enqueue-to-start latency), a long one."""

from __future__ import annotations

import time

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


@task()
def noop() -> None:
    return None


@task()
def started_at() -> float:
    return time.time()


@task()
def hold(seconds: float) -> None:
    """A long body (``--long-task``): the latencies are measured while it holds one of the worker's threads."""
    time.sleep(seconds)
