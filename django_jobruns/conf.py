"""Settings, read lazily from the ``JOBRUNS`` dict in the project's settings."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Retry policy of a job that names none (a RetryPolicy).
    "DEFAULT_RETRY": None,
    # How long a claim lasts; step writes extend it. Must outlast the longest step.
    "LEASE_TTL": timedelta(minutes=5),
    # Runs one drive pass takes when the caller names no limit.
    "DRIVE_LIMIT": 50,
    # Rows one drive pass reads at most, whatever the limit.
    "SCAN_MAX": 500,
}


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.JOBRUNS``, else its default."""
    configured = getattr(settings, "JOBRUNS", None) or {}
    return configured.get(name, DEFAULTS[name])


def default_retry() -> Any:
    from .retry import DEFAULT_RETRY

    return get("DEFAULT_RETRY") or DEFAULT_RETRY
