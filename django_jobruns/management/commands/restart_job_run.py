"""``manage.py restart_job_run RUN_ID [--resume]``: start a failed run again as a new run (see ``restart_job_run``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns.exceptions import JobRunsError
from django_jobruns.management.scheduled import ScheduledCommand
from django_jobruns.starts import restart_job_run

from .run_due_jobs import first_line


class Command(ScheduledCommand):
    help = (
        "Start a failed run again as a new run with the same key and payload, from the beginning or (--resume) "
        "from its last committed cursor and counters. At most once: while the new run is live, restarting again "
        "names it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", metavar="RUN_ID", help="the failed run")
        parser.add_argument(
            "--resume", action="store_true", help="carry the failed run's cursor and counters (default: start over)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run, created = restart_job_run(options["run_id"].strip().upper(), resume=options["resume"])
        except JobRunsError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
        how = "resumed" if options["resume"] else "restarted"
        if created:
            self.stdout.write(f"{how} run {options['run_id']} as run {run.id} ({run.label} [{run.instance}])")
        else:
            self.stdout.write(
                f"run {options['run_id']} was already restarted: its successor run {run.id} is live "
                f"({run.label} [{run.instance}])"
            )
