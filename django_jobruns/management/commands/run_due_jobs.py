"""``manage.py run_due_jobs``: one bounded drive pass, for cron, systemd or a CronJob."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns.conf import MIN_LEASE
from django_jobruns.drive import in_flight, run_due_jobs
from django_jobruns.exceptions import JobRunsError
from django_jobruns.management.scheduled import ScheduledCommand


def seconds(most: float, least: float = 0.0) -> Any:
    """An argparse type: a positive, finite number of seconds, at least ``least`` and at most ``most``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r:.50}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r:.50}")
        if value < least:
            raise argparse.ArgumentTypeError(f"expected at least {least:g} seconds, got {text!r:.50}")
        if value > most:
            raise argparse.ArgumentTypeError(f"expected at most {most:g} seconds, got {text!r:.50}")
        return value

    return parse


def whole(most: int) -> Any:
    """An argparse type: a whole number from 1 to ``most``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r:.50}") from None
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {most}, got {text!r:.50}")
        return value

    return parse


DAY = 86_400


def _timestamped_log() -> logging.Handler | None:
    """Where the project configured no logging, log the engine's lines to stderr with their time."""
    logger = logging.getLogger("django_jobruns")
    if logger.hasHandlers():
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return handler


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (a driver's may run to many), or its type."""
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


class Command(ScheduledCommand):
    help = (
        "Claim due job runs, run up to --max-passes passes of each, release them, and exit; with "
        "--max-seconds, keep working and waiting for work until the time is spent. SIGTERM/SIGINT stop "
        "taking new runs (and end a wait at once); the pass in flight finishes and releases."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--limit",
            type=whole(10_000),
            default=None,
            help="runs to take at most (default JOBRUNS['DRIVE_LIMIT'], 50)",
        )
        parser.add_argument(
            "--max-passes",
            type=whole(1_000_000),
            default=None,
            help="passes per run and claim (default 1; with --max-seconds, unlimited)",
        )
        parser.add_argument(
            "--concurrency", type=whole(256), default=1, help="runs driven at once (default 1, at most 256)"
        )
        parser.add_argument("--holder", default=None, help="lease holder name (default: host:pid:random)")
        parser.add_argument(
            "--lease-ttl",
            type=seconds(7 * DAY, least=MIN_LEASE.total_seconds()),
            default=None,
            help="lease length in seconds (default JOBRUNS['LEASE_TTL'], 30; at least 5, at most a week): "
            "how long a killed worker's runs wait before another drive takes them over; a live worker keeps "
            "its leases alive however long a step runs",
        )
        parser.add_argument(
            "--job", action="append", dest="jobs", metavar="APP.NAME", help="drive only this job (repeatable)"
        )
        parser.add_argument(
            "--max-seconds",
            type=seconds(DAY),
            default=None,
            help="keep working (and waiting for work) for this many seconds, then finish the "
            "pass in flight, release and exit (default: one bounded pass)",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="work only the tasks of this queue (repeatable; default every queue; job runs are always driven)",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        previous = self._install_signal_handlers(stop)
        logged = _timestamped_log()
        try:
            ttl = options["lease_ttl"]
            report = run_due_jobs(
                limit=options["limit"],
                max_passes=options["max_passes"],
                holder=options["holder"],
                lease_ttl=timedelta(seconds=ttl) if ttl is not None else None,
                concurrency=options["concurrency"],
                jobs=options["jobs"],
                stop=stop,
                max_seconds=options["max_seconds"],
                queues=options.get("queues"),
            )
        except JobRunsError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if logged is not None:
                logging.getLogger("django_jobruns").removeHandler(logged)
        idle = report.attempted == 0 and not report.errors and not report.warnings and not report.unrecorded
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
        elif options["verbosity"] == 0 and idle:
            pass  # -v 0: a drive that found nothing to do says nothing (cron mails no empty reports)
        else:
            self.stdout.write(report.summary())
            if not logging.getLogger("django_jobruns").isEnabledFor(logging.WARNING):
                # The engine logs each failure and warning as it happens; only when that log is
                # silenced are they printed here, so each appears once.
                stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M:%S}"
                for run_id, error in report.errors:
                    self.stderr.write(f"{stamp} run {run_id}: {error}")
                for warning in report.warnings:
                    self.stderr.write(f"{stamp} warning: {warning}")
        if report.unrecorded:
            for run_id, error in report.unrecorded:
                self.stderr.write(f"run {run_id}: the pass could not be recorded: {error.splitlines()[0]}")
            # Exit non-zero: the database failed under the drive, which a
            # scheduler should surface; the runs themselves are intact and due.
            raise CommandError(
                f"{len(report.unrecorded)} run(s) could not be recorded because the database failed; "
                "they will be taken again by a later drive"
            )

    def _install_signal_handlers(self, stop: threading.Event) -> dict[int, Any]:
        """The first SIGTERM/SIGINT: finish the passes in flight, release, exit. The second: exit at once.

        At once means as after a kill: each run in flight keeps its lease
        until it lapses, then another drive takes it over and charges the
        interrupted pass as an attempt.
        """
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous  # signals can only be handled on the main thread

        def handle(signum: int, frame: Any) -> None:
            if not stop.is_set():
                stop.set()
                self.stderr.write(
                    f"stopping after the pass in flight ({in_flight()} running); "
                    f"{signal.Signals(signum).name} again to stop at once"
                )
                return
            self.stderr.write(
                f"stopping at once: {in_flight()} run(s) in flight keep their lease until it lapses, then another "
                "drive takes them over"
            )
            os._exit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, handle)
        return previous
