"""What the app's commands share: they are run from schedulers, whose output lands in a log every minute."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.management.base import BaseCommand, CommandError, SystemCheckError

from django_jobruns.queue_safety import unstorable


class ScheduledCommand(BaseCommand):
    """A command a scheduler runs: the system checks' errors stop it, as they stop any command.

    Their warnings (``jobruns.W001``, say) are left to where a user looks --
    ``manage.py check``, ``migrate``, ``runserver`` -- instead of being printed
    into a cron log on every run.
    """

    requires_system_checks: Any = []

    def execute(self, *args: Any, **options: Any) -> Any:
        _storable_arguments(args, options)
        if not options.get("skip_checks"):
            # No database is given: the checks connect to none (Django 6.1 would, for each model field,
            # unbounded, before the drive's bounded statements begin; a partition would hang it there).
            issues = checks.run_checks(databases=[])
            errors = [issue for issue in issues if issue.is_serious() and not issue.is_silenced()]
            if errors:
                raise SystemCheckError(
                    "System check identified some issues:\n" + "\n".join(str(issue) for issue in errors)
                )
        return super().execute(*args, **options)


def _storable_arguments(args: tuple[Any, ...], options: dict[str, Any]) -> None:
    """Refuse, naming it, an argument no database stores: a byte that is not UTF-8 in the command line
    (Python reads it as a lone surrogate) would reach the database driver and end in its traceback."""
    values: list[Any] = [*args]
    for value in options.values():
        values.extend(value if isinstance(value, (list, tuple)) else [value])
    for value in values:
        why = unstorable(value) if isinstance(value, str) else None
        if why is not None:
            raise CommandError(f"the argument {value!r:.200} {why}")
