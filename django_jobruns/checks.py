"""System checks, with stable ids."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.compatibility)  # reads settings only: shown by `check` without --database
def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobruns.W001: SQLite without IMMEDIATE transactions: correct, but slower under several workers."""
    return sqlite_transaction_mode_warnings(settings.DATABASES)


def sqlite_transaction_mode_warnings(databases: dict[str, Any]) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for alias, db in databases.items():
        if "sqlite3" not in db.get("ENGINE", ""):
            continue
        mode = (db.get("OPTIONS") or {}).get("transaction_mode")
        if str(mode).upper() != "IMMEDIATE":
            messages.append(
                checks.Warning(
                    f"The SQLite database {alias!r} does not use transaction_mode='IMMEDIATE'.",
                    hint=(
                        "django-jobruns is correct under SQLite's default DEFERRED mode (its transactions "
                        "write first, so they wait for the lock instead of failing), but each step then "
                        "writes the lease as well. For throughput with several workers, set "
                        f"DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE', a 'timeout' of "
                        "20 or more, and WAL mode (init_command 'PRAGMA journal_mode=WAL'). Your own code "
                        "that reads before it writes in a transaction needs IMMEDIATE to avoid "
                        "'database is locked'."
                    ),
                    id="jobruns.W001",
                )
            )
    return messages


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobruns.E001-E003: the JOBRUNS settings dict has only known keys, each of the right kind."""
    from . import conf

    found = conf.problems(getattr(settings, "JOBRUNS", None))
    return [checks.Error(message, id=check_id) for check_id, message in found]


@checks.register(checks.Tags.admin)
def check_rangefilter_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobruns.E004: the admin's date-range filters need ``rangefilter`` in ``INSTALLED_APPS``."""
    from django.apps import apps

    if apps.is_installed("django.contrib.admin") and not apps.is_installed("rangefilter"):
        return [
            checks.Error(
                "'rangefilter' is not in INSTALLED_APPS: the job run admin's date-range filters need its "
                "templates, and the changelist fails without them.",
                hint='Add "rangefilter" to INSTALLED_APPS (django-admin-rangefilter is installed with django-jobruns).',
                id="jobruns.E004",
            )
        ]
    return []
