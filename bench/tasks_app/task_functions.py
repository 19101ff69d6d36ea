"""The benchmark's tasks: a no-op, and one that returns when it started (for enqueue-to-start latency)."""

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
