"""Start demo imports and drive them to completion through ``run_due_jobs``."""

from __future__ import annotations

import io
import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from django_jobruns import job_runs, start_job_run
from django_jobruns.models import JobRun, Status


class Command(BaseCommand):
    help = "Start catalogue imports for a few suppliers and drive them to completion with run_due_jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--suppliers", type=int, default=3)
        parser.add_argument("--page-size", type=int, default=500)

    def handle(self, *args: Any, **options: Any) -> None:
        ids = []
        for supplier in range(1, options["suppliers"] + 1):
            run, created = start_job_run(
                "demo.import_catalog", instance=f"supplier-{supplier}",
                payload={"supplier": supplier, "page_size": options["page_size"]},
            )
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
            self.stdout.write(
                f"{record.instance}: {record.status}, imported {c.get('imported', 0)} of {c.get('total', '?')}"
                f" (run {record.id})"
            )
