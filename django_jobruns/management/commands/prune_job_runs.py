"""``manage.py prune_job_runs``: delete finished runs older than a number of days."""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns.management.scheduled import ScheduledCommand
from django_jobruns.pruning import BATCH_SIZE, FINISHED, prune_job_runs

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


def _status(text: str) -> tuple[str, float | None]:
    """``STATUS`` or ``STATUS=DAYS``: which finished runs, and how old (DAYS overrides --older-than)."""
    name, sep, days = text.partition("=")
    if name not in FINISHED:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r:.50} (choose from {', '.join(map(repr, FINISHED))}, optionally =DAYS)"
        )
    return name, _days(days) if sep else None


class Command(ScheduledCommand):
    help = (
        "Delete finished (done, failed or cancelled) job runs that ended more than --older-than days ago, "
        "in batches, each its own short transaction. --older-than 7 --status failed=90 keeps failures 90 "
        "days and the other finished statuses 7; a bare --status S prunes only the statuses named."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=_days,
            default=None,
            metavar="DAYS",
            help="age in days of the runs to delete (required unless every --status has its own)",
        )
        parser.add_argument(
            "--status",
            action="append",
            type=_status,
            dest="statuses",
            metavar="STATUS[=DAYS]",
            help="STATUS=DAYS: this status's own age (the other finished statuses keep --older-than); "
            "a bare STATUS: prune only the statuses named (repeatable; default: every finished status)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
        parser.add_argument("--json", action="store_true", help="print a summary as JSON")
        parser.add_argument("--batch-size", type=_batch, default=BATCH_SIZE, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        default = options["older_than"]
        if default is None and not options["statuses"]:
            raise CommandError("--older-than DAYS is required (or give each --status its own age: --status failed=90)")
        named = options["statuses"] or []
        chosen = list(named)
        if not named or (default is not None and all(days is not None for _, days in named)):
            # Only statuses with their own age named ("7 days, but 90 for failures"): the other
            # finished statuses keep --older-than. A bare --status S limits the prune to those named.
            chosen += [(status, None) for status in FINISHED if status not in {name for name, _ in named}]
        plan: dict[str, float] = {}
        for status, days in chosen:
            age = days if days is not None else default
            if age is None:
                raise CommandError(
                    f"--status {status} has no age: give it one (--status {status}=DAYS) or give --older-than"
                )
            plan[status] = age
        started = time.monotonic()
        counts: dict[str, int] = {}
        done_before = 0

        def progress(total: int) -> None:
            if total >= options["batch_size"] and not options["dry_run"]:
                elapsed = max(time.monotonic() - started, 1e-9)
                so_far = done_before + total
                self.stderr.write(f"… {so_far} run(s) deleted so far ({so_far / elapsed:,.0f} runs/s)")

        try:
            for status, age in plan.items():
                counts[status] = prune_job_runs(
                    older_than=timedelta(days=age),
                    statuses=[status],
                    dry_run=options["dry_run"],
                    batch_size=options["batch_size"],
                    progress=progress,
                )
                done_before += counts[status]
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
        seconds = time.monotonic() - started
        total = sum(counts.values())
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "dry_run": options["dry_run"],
                        "deleted": total,
                        "by_status": counts,
                        "older_than_days": plan,
                        "seconds": round(seconds, 3),
                        # The same keys on a dry run: nothing deleted, no rate.
                        "runs_per_second": round(total / seconds) if seconds > 0 and not options["dry_run"] else None,
                    }
                )
            )
            return
        verb = "would delete" if options["dry_run"] else "deleted"
        ages = set(plan.values())
        if len(ages) == 1:
            self.stdout.write(f"{verb} {total} finished run(s) older than {ages.pop():g} day(s)")
        else:
            parts = ", ".join(f"{status} {counts[status]} (older than {age:g} day(s))" for status, age in plan.items())
            self.stdout.write(f"{verb} {total} finished run(s): {parts}")
