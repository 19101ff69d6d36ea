"""``manage.py start_job_run app.name``: start a run, or join the live one."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns.exceptions import JobRunsError
from django_jobruns.management.scheduled import ScheduledCommand
from django_jobruns.starts import start_job_run

from .run_due_jobs import first_line


class Command(ScheduledCommand):
    help = "Start a run of a job (or join the live run for its instance) and print its id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", metavar="APP.NAME", help="the job to start, as 'app_label.job_name'")
        parser.add_argument(
            "--instance",
            default="default",
            help="which run of the job: one live run per job and instance (default: 'default')",
        )
        parser.add_argument(
            "--payload",
            default=None,
            metavar="JSON",
            help="the run's input as JSON, handed to every pass as p.payload (default: none, p.payload is None)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        payload = None
        if options["payload"] is not None:
            try:
                payload = json.loads(options["payload"])
            except ValueError as exc:
                raise CommandError(f"--payload is not valid JSON: {exc}") from None
        try:
            run, created = start_job_run(options["job"], instance=options["instance"], payload=payload)
        except (JobRunsError, ValidationError, ValueError) as exc:
            message = exc.messages[0] if isinstance(exc, ValidationError) else str(exc)
            raise CommandError(message) from None
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
        if created:
            self.stdout.write(f"started run {run.id}")
        else:
            self.stdout.write(f"joined live run {run.id} (started {run.started_at:%Y-%m-%d %H:%M:%S %Z})")
            if options["payload"] is not None and json.loads(run.payload) != payload:
                self.stderr.write(
                    "note: the live run's payload differs from --payload; it keeps its own "
                    "(cancel it first to start with the new one)"
                )
