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


@checks.register(checks.Tags.compatibility)
def check_time_zone_support(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobruns.E005: leases, due times and schedules are instants, judged by the database's UTC clock."""
    if settings.USE_TZ:
        return []
    return [
        checks.Error(
            "django_jobruns needs USE_TZ = True: leases, due times and schedules are instants, compared across "
            "hosts by the database's clock in UTC, and with naive local times they would be misjudged by the "
            "time zone's offset.",
            hint="Set USE_TZ = True (Django's default since 5.0); see Django's time zones guide for the migration.",
            id="jobruns.E005",
        )
    ]


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


@checks.register(checks.Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobruns.E020-E022: each schedule of ``JOBRUNS["SCHEDULES"]`` parses, names what exists, and starts with
    what its start takes: a job's payload queue-safe, a task's arguments as Django's tasks take them."""
    from django.utils.module_loading import import_string

    from .exceptions import QueueUnsafe
    from .queue_safety import dump_queue_safe
    from .registry import lookup
    from .schedule_specs import declared
    from .task_results import json_form

    found, problems = declared()
    messages: list[checks.CheckMessage] = [checks.Error(problem, id="jobruns.E020") for problem in problems]
    for schedule in found.values():
        where = f"JOBRUNS['SCHEDULES'][{schedule.name!r}]"
        if schedule.job is not None:
            module, _, name = schedule.job.rpartition(".")
            if lookup(module, name) is None:
                messages.append(
                    checks.Error(
                        f"{where} names the job {schedule.job!r}, which is not registered",
                        hint="A job is registered by @job in an installed app's jobs.py, as 'app_label.name'.",
                        id="jobruns.E021",
                    )
                )
            start = {"payload": schedule.payload}
        else:
            try:
                task = import_string(str(schedule.task))
            except ImportError as exc:
                messages.append(
                    checks.Error(
                        f"{where} names the task {schedule.task!r}, which cannot be imported: {exc}", id="jobruns.E021"
                    )
                )
                continue
            if not callable(getattr(task, "enqueue", None)):
                messages.append(
                    checks.Error(
                        f"{where}: {schedule.task!r} is not a task (decorate the function with @task)",
                        id="jobruns.E021",
                    )
                )
            start = {"args": list(schedule.args), "kwargs": schedule.kwargs}
        for key, value in start.items():
            try:
                if schedule.job is not None:
                    dump_queue_safe(value, f"{where}[{key!r}]")
                else:
                    json_form(value)  # a task's arguments: Django's rules, as its enqueue applies them
            except (QueueUnsafe, TypeError, ValueError, RecursionError) as exc:
                refusal = "is not queue-safe" if schedule.job is not None else "is refused by Django's tasks"
                messages.append(checks.Error(f"{where}[{key!r}] {refusal}: {exc}", id="jobruns.E022"))
    return messages
