"""Settings, read lazily from the ``JOBRUNS`` dict in the project's settings.

=====================  ===========================  ==========================================
key                    default                      meaning
=====================  ===========================  ==========================================
``DEFAULT_RETRY``      ``RetryPolicy()``            policy of a job (and step) that names none
``LEASE_TTL``          ``timedelta(seconds=30)``    the drive's lease, where a job names none;
                                                    kept alive while a body runs (D17)
``TIMEOUT``            ``timedelta(hours=1)``       longest pass, where a job names none (D19)
``DRIVE_LIMIT``        ``50``                       runs one drive takes at most (``--limit``)
``SCAN_MAX``           ``500``                      rows one drive reads at most
``PAYLOAD_MAX_BYTES``  ``1_048_576``                largest payload, cursor or counters, as JSON
``STEP_RESULT_MAX_BYTES`` ``4_194_304``             largest step result or task return value, as
                                                    JSON (below every database's default packet limit)
``SCHEDULES``          none                         periodic runs and tasks (``django_jobruns.schedules``;
                                                    checks ``jobruns.E020``-``E022``)
=====================  ===========================  ==========================================

Read on every use, never at import time, so ``override_settings`` works. System
checks ``jobruns.E001``-``E003`` refuse unknown keys and values of the wrong kind.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.conf import settings

#: The shortest lease anywhere: ``@job(lease=)``, ``LEASE_TTL``, ``run_due_jobs(lease_ttl=)``,
#: ``--lease-ttl`` and a Tasks backend's ``LEASE_TTL`` option. A shorter one lapses
#: between a step's writes when a round trip to the database takes a while.
MIN_LEASE = timedelta(seconds=5)

DEFAULTS: dict[str, Any] = {
    "DEFAULT_RETRY": None,
    "LEASE_TTL": timedelta(seconds=30),
    "TIMEOUT": timedelta(hours=1),
    "DRIVE_LIMIT": 50,
    "SCAN_MAX": 500,
    "PAYLOAD_MAX_BYTES": 1_048_576,
    "STEP_RESULT_MAX_BYTES": 4_194_304,
    "SCHEDULES": None,
}


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.JOBRUNS``, else its default."""
    configured = getattr(settings, "JOBRUNS", None) or {}
    value = configured.get(name)
    return DEFAULTS[name] if value is None else value


#: The longest lease or timeout anywhere: past it a number stops meaning a duration (and
#: a datetime's arithmetic overflows).
MAX_DURATION = timedelta(days=7)


def duration(value: Any, name: str) -> timedelta:
    """``value`` (a timedelta or seconds) as a lease or timeout: finite, at least :data:`MIN_LEASE`, at most a week.

    ``ValueError`` naming ``name`` and the value otherwise.
    """
    length: timedelta | None = None
    if isinstance(value, timedelta):
        length = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if abs(value) <= MAX_DURATION.total_seconds():
            length = timedelta(seconds=value)
        else:
            length = MAX_DURATION + timedelta(seconds=1) if value > 0 else timedelta(0)
    if length is None:
        raise ValueError(f"{name} must be a timedelta or a finite number of seconds, got {value!r:.100}")
    if length <= timedelta(0):
        raise ValueError(f"{name} must be positive, got {value!r:.100}: a lease or time limit that has already run out")
    if length < MIN_LEASE:
        raise ValueError(
            f"{name} must be at least {MIN_LEASE.total_seconds():g} seconds, got {value!r:.100}: a lease shorter "
            "than a database round trip under load lapses between its renewals"
        )
    if length > MAX_DURATION:
        raise ValueError(
            f"{name} must be at most a week ({MAX_DURATION.total_seconds():g} seconds), got {value!r:.100}"
        )
    return length


def timeout() -> timedelta:
    """``JOBRUNS["TIMEOUT"]``, the longest pass of a job that names none (D19)."""
    return duration(get("TIMEOUT"), "JOBRUNS['TIMEOUT']")


#: The ``TASKS`` backend of this app, as a project names it.
TASKS_BACKEND = "django_jobruns.backend.JobRunsBackend"


def task_backends() -> dict[str, dict[str, Any]]:
    """The project's ``TASKS`` entries that use this app's backend, by alias."""
    configured = getattr(settings, "TASKS", None) or {}
    return {alias: params for alias, params in configured.items() if params.get("BACKEND") == TASKS_BACKEND}


def default_retry() -> Any:
    from .retry import DEFAULT_RETRY

    return get("DEFAULT_RETRY") or DEFAULT_RETRY


def problems(configured: Any) -> list[tuple[str, str]]:
    """Check a ``JOBRUNS`` value; return ``(check id, message)`` pairs for what is wrong."""
    from .retry import RetryPolicy

    if configured is None:
        return []
    if not isinstance(configured, dict):
        return [("jobruns.E001", f"JOBRUNS must be a dict, got {type(configured).__name__}")]
    found = []
    unknown = sorted(set(configured) - set(DEFAULTS))
    if unknown:
        found.append(
            (
                "jobruns.E001",
                f"JOBRUNS has unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(DEFAULTS)}",
            )
        )
    retry = configured.get("DEFAULT_RETRY")
    if retry is not None and not isinstance(retry, RetryPolicy):
        found.append(("jobruns.E002", f"JOBRUNS['DEFAULT_RETRY'] must be a RetryPolicy, got {retry!r}"))
    for key in ("LEASE_TTL", "TIMEOUT"):
        if configured.get(key) is not None:
            try:
                duration(configured[key], f"JOBRUNS[{key!r}]")
            except ValueError as exc:
                found.append(("jobruns.E003", str(exc)))
    for key in ("DRIVE_LIMIT", "SCAN_MAX", "PAYLOAD_MAX_BYTES", "STEP_RESULT_MAX_BYTES"):
        value = configured.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            found.append(("jobruns.E003", f"JOBRUNS[{key!r}] must be a whole number >= 1, got {value!r}"))
    return found
