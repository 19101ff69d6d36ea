"""The operator read: runs decoded tolerantly into frozen records."""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .models import JobRun, Status

LIST_LIMIT = 50
LIST_MAX = 500


@dataclass(frozen=True)
class JobRunRecord:
    """One run as an operator reads it, with every JSON column decoded.

    A column that does not parse comes back empty (``payload`` and ``cursor``
    ``None``, ``counters`` ``{}``) and ``decode_error`` names the first failure,
    so an unreadable cursor is never mistaken for "no pass committed yet".
    """

    id: str
    module: str
    job: str
    instance: str
    status: str
    payload: Any
    cursor: Any
    counters: dict[str, Any]
    attempts: int
    #: Every failed pass over the run's life (``attempts`` is reset when a pass commits).
    failed_passes: int
    last_error: str | None
    last_warning: str | None
    started_at: datetime
    updated_at: datetime
    next_attempt_at: datetime | None
    ended_at: datetime | None
    lease_holder: str | None
    lease_expires_at: datetime | None
    lease_fence: int
    restarted_from: str | None
    #: The run this one was restarted or resumed as (kept after that run is pruned).
    restarted_as: str | None
    decode_error: str | None

    @classmethod
    def from_row(cls, row: JobRun) -> JobRunRecord:
        errors: list[str] = []

        def parse(text: str | None, column: str, fallback: Any) -> Any:
            if text is None:
                return fallback
            try:
                return json.loads(text)
            except (TypeError, ValueError) as exc:
                errors.append(f"{column}: {exc}")
                return fallback
            except RecursionError:
                errors.append(f"{column}: nested too deeply to decode ({len(text)} characters)")
                return fallback

        # Every column is decoded before the error is read, so decode_error
        # names the first failure of the row, in column order.
        payload = parse(row.payload, "payload", None)
        cursor = parse(row.cursor, "cursor", None)
        counters = parse(row.counters, "counters", {})
        if not isinstance(counters, dict):
            errors.append(f"counters: not a JSON object but {type(counters).__name__}")
            counters = {}
        return cls(
            id=row.id,
            module=row.module,
            job=row.job,
            instance=row.instance,
            status=row.status,
            payload=payload,
            cursor=cursor,
            counters=counters,
            attempts=row.attempts,
            failed_passes=row.failed_passes,
            last_error=row.last_error,
            last_warning=row.last_warning,
            started_at=row.started_at,
            updated_at=row.updated_at,
            next_attempt_at=row.next_attempt_at,
            ended_at=row.ended_at,
            lease_holder=row.lease_holder,
            lease_expires_at=row.lease_expires_at,
            lease_fence=row.lease_fence,
            restarted_from=row.restarted_from_id,
            restarted_as=row.restarted_as,
            decode_error=errors[0] if errors else None,
        )


def list_limit(limit: Any) -> int:
    """Clamp a caller's limit to 1..500 (default 50) before it goes near SQL."""
    if limit is None:
        return LIST_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise TypeError(f"limit must be a number, got {limit!r:.100}")
    if isinstance(limit, int):
        return min(LIST_MAX, max(1, limit))
    try:
        value = float(limit)
    except (OverflowError, ValueError):  # a fraction too large for a float
        positive = isinstance(limit, numbers.Rational) and int(limit.numerator) > 0
        return LIST_MAX if positive else 1
    if math.isnan(value):
        return LIST_LIMIT
    if math.isinf(value):
        return LIST_MAX if value > 0 else 1
    return int(min(LIST_MAX, max(1, math.floor(value))))


def job_runs(
    *,
    module: str | None = None,
    job: str | None = None,
    instance: str | None = None,
    status: str | None = None,
    limit: int | None = None,
) -> list[JobRunRecord]:
    """Return runs, newest first, decoded tolerantly. ``limit`` is clamped to 1..500."""
    rows = JobRun.objects.all()
    if module is not None:
        rows = rows.filter(module=module)
    if job is not None:
        if "." in job and module is None:
            rows = of_job(rows, job)
        else:
            rows = rows.filter(job=job)
    if instance is not None:
        rows = rows.filter(instance=instance)
    if status is not None:
        if status not in Status.values:
            raise ValueError(f"status must be one of {', '.join(Status.values)}; got {status!r}")
        rows = rows.filter(status=status)
    return [JobRunRecord.from_row(row) for row in rows.order_by("-id")[: list_limit(limit)]]


def of_job(rows: Any, name: str) -> Any:
    """The runs of ``rows`` of a job (``"app_label.job"``) or of a task (its module path, ``"orders.tasks.charge"``)."""
    from django.db.models import Q

    from .models import TASKS_MODULE
    from .task_results import TaskPayload

    module, _, job = name.partition(".")
    return rows.filter(Q(module=module, job=job) | Q(module=TASKS_MODULE, payload__startswith=TaskPayload.prefix(name)))


#: The states an operator looks for among the running runs (the admin's filter, ``job_runs --state``).
STATES = {
    "backoff": "in backoff",
    "leased": "leased",
    "lapsed": "lease lapsed",
    "paused": "paused",
    "unregistered": "job not registered here",
}


def in_state(rows: Any, state: str, now: datetime | None = None) -> Any:
    """The running runs of ``rows`` in ``state`` (one of :data:`STATES`).

    ``unregistered``: no job of this process is registered for them (the
    registry decides), or a drive marked them so (another process's registry).
    """
    from django.db.models import Q
    from django.utils import timezone

    from .registry import registered_jobs

    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}; got {state!r}")
    now = now or timezone.now()
    running = rows.filter(status=Status.RUNNING)
    if state == "backoff":
        return rows.backing_off(now)
    if state == "leased":
        return rows.leased(now)
    if state == "lapsed":
        return rows.lapsed(now)
    if state == "paused":
        return rows.paused()
    known = Q()
    for entry in registered_jobs():
        known |= Q(module=entry.module, job=entry.name)
    from .models import MARKED_UNREGISTERED

    return running.filter(~known | MARKED_UNREGISTERED) if known else running
