"""Start demo imports and drive them to completion through ``run_due_jobs``."""

from __future__ import annotations

import io
import logging
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_jobruns import job_runs, start_job_run
from django_jobruns.models import JobRun, Status
from testproject.demo.models import Outage, Product


class Command(BaseCommand):
    help = "Start catalogue imports for a few suppliers and drive them to completion with run_due_jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--suppliers", type=int, default=3, help="suppliers whose import succeeds")
        parser.add_argument("--page-size", type=int, default=500)

    def handle(self, *args: Any, **options: Any) -> None:
        # Each drive's errors and warnings are printed below; the log would say them twice.
        logging.getLogger("django_jobruns").setLevel(logging.CRITICAL)
        # The same story every time: the fake upstream starts without its outages
        # and its imported products (earlier demo runs stay, as the record).
        Outage.objects.all().delete()
        Product.objects.all().delete()
        ids = []
        payloads = [{"supplier": n, "page_size": options["page_size"]} for n in range(1, options["suppliers"] + 1)]
        # One more supplier whose provider goes down three quarters of the way
        # through for longer than the retry policy waits: a failed run to resume.
        failing = len(payloads) + 1
        payloads.append({"supplier": failing, "page_size": options["page_size"], "down_at": 7500, "down_for": 5})
        for payload in payloads:
            supplier = payload["supplier"]
            run, created = start_job_run("demo.import_catalog", instance=f"supplier-{supplier}", payload=payload)
            ids.append(run.id)
            self.stdout.write(f"{'started' if created else 'joined'} run {run.id} for supplier {supplier}")
        drives = 0
        while JobRun.objects.filter(pk__in=ids, status=Status.RUNNING).exists():
            nxt = JobRun.objects.filter(pk__in=ids, status=Status.RUNNING, next_attempt_at__gt=timezone.now())
            if not JobRun.objects.due(timezone.now()).filter(pk__in=ids).exists() and nxt.exists():
                # Only runs in backoff are left: wait for the first to come due, as cron would.
                wait = (min(r.next_attempt_at for r in nxt) - timezone.now()).total_seconds()
                time.sleep(max(0.0, wait))
            out = io.StringIO()
            call_command("run_due_jobs", "--max-passes", "5", "--limit", "10", stdout=out, stderr=out)
            drives += 1
            self.stdout.write(f"run_due_jobs #{drives}: {out.getvalue().strip()}")
        self.stdout.write("")
        for record in job_runs(job="demo.import_catalog", limit=len(ids)):
            if record.id not in ids:
                continue
            c = record.counters
            line = f"{record.instance}: {record.status}, imported {c.get('imported', 0)} of {c.get('total', '?')}"
            if record.status == Status.FAILED and record.last_error:
                line += f" -- {record.last_error.splitlines()[0]}"
            self.stdout.write(f"{line} (run {record.id})")
        self.stdout.write("\nReview the runs, and resume the failed one, in the admin: ./dev admin")
