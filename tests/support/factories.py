"""Runs made in bulk for the tests that need many of them (pages, plans, costs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from django_jobruns.models import JobRun, Status


def finished_runs(
    count: int, prefix: str, *, status: str = Status.DONE, at: datetime | None = None, **fields: Any
) -> list[JobRun]:
    """Create ``count`` finished runs of ``tests.walk``, instances ``prefix0`` …, in one statement.

    A field given as a callable is called with the run's number for its value.
    """
    now = at or timezone.now()
    return JobRun.objects.bulk_create(
        [
            JobRun(
                module="tests",
                job="walk",
                instance=f"{prefix}{i}",
                status=status,
                live=None,
                started_at=now,
                updated_at=now,
                ended_at=now,
                **{name: value(i) if callable(value) else value for name, value in fields.items()},
            )
            for i in range(count)
        ]
    )
