"""Settings, read lazily from the ``JOBRUNS`` dict in the project's settings.

=====================  ===========================  ==========================================
key                    default                      meaning
=====================  ===========================  ==========================================
``DEFAULT_RETRY``      ``RetryPolicy()``            policy of a job (and step) that names none
``LEASE_TTL``          ``timedelta(minutes=5)``     the drive's lease, where a job names none
``DRIVE_LIMIT``        ``50``                       runs one drive takes at most (``--limit``)
``SCAN_MAX``           ``500``                      rows one drive reads at most
``PAYLOAD_MAX_BYTES``  ``1_048_576``                largest payload or cursor, as JSON
``STEP_RESULT_MAX_BYTES`` ``4_194_304``             largest step result, as JSON (below every
                                                    database's default packet limit)
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
    "LEASE_TTL": timedelta(minutes=5),
    "DRIVE_LIMIT": 50,
    "SCAN_MAX": 500,
    "PAYLOAD_MAX_BYTES": 1_048_576,
    "STEP_RESULT_MAX_BYTES": 4_194_304,
}


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.JOBRUNS``, else its default."""
    configured = getattr(settings, "JOBRUNS", None) or {}
    value = configured.get(name)
    return DEFAULTS[name] if value is None else value


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
    ttl = configured.get("LEASE_TTL")
    if ttl is not None and not (
        (isinstance(ttl, timedelta) and ttl >= MIN_LEASE)
        or (
            isinstance(ttl, (int, float))
            and not isinstance(ttl, bool)
            and math.isfinite(ttl)
            and ttl >= MIN_LEASE.total_seconds()
        )
    ):
        found.append(
            (
                "jobruns.E003",
                f"JOBRUNS['LEASE_TTL'] must be a timedelta or seconds of at least {MIN_LEASE.total_seconds():g} "
                f"seconds, got {ttl!r}",
            )
        )
    for key in ("DRIVE_LIMIT", "SCAN_MAX", "PAYLOAD_MAX_BYTES", "STEP_RESULT_MAX_BYTES"):
        value = configured.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            found.append(("jobruns.E003", f"JOBRUNS[{key!r}] must be a whole number >= 1, got {value!r}"))
    return found
