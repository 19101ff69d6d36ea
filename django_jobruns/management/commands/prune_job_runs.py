"""``manage.py prune_job_runs``: delete finished runs older than a number of days."""

from __future__ import annotations

import argparse
import math
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns.pruning import FINISHED, prune_job_runs

from .run_due_jobs import first_line

MAX_DAYS = 36_500  # a century


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {text!r:.50}")
    if value > MAX_DAYS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_DAYS} days, got {text!r:.50}")
    return value


def _batch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r:.50}") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"expected a batch size from 1 to 100000, got {text!r:.50}")
    return value


class Command(BaseCommand):
    help = (
        "Delete finished (done, failed or cancelled) job runs that ended more than --older-than days ago, "
        "in batches."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=_days, required=True, metavar="DAYS")
        parser.add_argument("--status", action="append", choices=list(FINISHED), dest="statuses",
                            help="only runs with this status (repeatable; default: done and failed)")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
        parser.add_argument("--batch-size", type=_batch, default=500, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = prune_job_runs(
                older_than=timedelta(days=options["older_than"]),
                statuses=options["statuses"] or FINISHED,
                dry_run=options["dry_run"],
                batch_size=options["batch_size"],
            )
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
        verb = "would delete" if options["dry_run"] else "deleted"
        self.stdout.write(f"{verb} {count} finished run(s) older than {options['older_than']:g} day(s)")
