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
    #: Made due, but paused: the operator expected it to run (retry_job_run_now).
    stays_paused_is_a_failure = False

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
                # The error names the run already where it knows it: no "run X: run X is ...".
                self.stderr.write(str(exc) if run_id in str(exc) else f"run {run_id}: {exc}")
                continue
            except DatabaseError as exc:
                raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
            self.stdout.write(f"{self.verb} run {run.id} ({run.label} [{run.instance}], now {describe(run)})")
            if self.stays_paused_is_a_failure and run.paused_at is not None:
                failures += 1
                self.stderr.write(f"run {run.id} stays paused: it is not due until unpaused (unpause_job_run {run.id})")
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
