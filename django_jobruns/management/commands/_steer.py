"""The steering commands' shared body: one run id in, one line out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns.exceptions import JobRunsError
from django_jobruns.management.scheduled import ScheduledCommand
from django_jobruns.models import JobRun

from .run_due_jobs import first_line


class SteerCommand(ScheduledCommand):
    verb = ""
    takes_reason = False

    def act(self, run_id: str, **options: Any) -> JobRun:
        raise NotImplementedError

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_ids", nargs="+", metavar="RUN_ID")
        if self.takes_reason:
            parser.add_argument("--reason", default="", help="why, kept on the run")

    def handle(self, *args: Any, **options: Any) -> None:
        failures = 0
        for run_id in options["run_ids"]:
            try:
                run = self.act(run_id, **options)
            except JobRunsError as exc:
                failures += 1
                self.stderr.write(f"run {run_id}: {exc}")
                continue
            except DatabaseError as exc:
                raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
            self.stdout.write(f"{self.verb} run {run.id} ({run.label} [{run.instance}], now {describe(run)})")
        if failures:
            raise CommandError(f"{failures} run(s) could not be {self.verb.lower()}")


def describe(run: JobRun) -> str:
    return "paused" if run.paused_at is not None and run.status == "running" else str(run.status)


def command(verb: str, function: Callable[..., JobRun], *, reason: bool = False) -> type[SteerCommand]:
    class Command(SteerCommand):
        help = f"{(function.__doc__ or verb).splitlines()[0]} (one or more run ids)"

        def act(self, run_id: str, **options: Any) -> JobRun:
            if reason:
                return function(run_id, reason=options["reason"])
            return function(run_id)

    Command.verb = verb
    Command.takes_reason = reason
    return Command
