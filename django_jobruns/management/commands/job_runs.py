"""``manage.py job_runs [RUN_ID]``: the runs, newest first, or one run in full -- the operator's command line."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone
from django.utils.timesince import timesince

from django_jobruns import db
from django_jobruns.management.scheduled import ScheduledCommand
from django_jobruns.models import JobAttempt, JobRun, JobSchedule, JobStep, Status
from django_jobruns.records import STATES, JobRunRecord, in_state, list_limit, of_job

from .run_due_jobs import first_line, seconds

#: The longest --max-lag: thirty days (a lag past that is no liveness check).
MAX_LAG_SECONDS = 30 * 24 * 3600.0


class Command(ScheduledCommand):
    help = (
        "List runs, newest first (status, job [instance], age, progress, the error's first line), or show one "
        "run in full: every field decoded, its step ledger and its lineage."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID", help="show this run in full")
        parser.add_argument("--status", choices=Status.values, help="only runs with this status")
        parser.add_argument("--job", metavar="APP.NAME", help="only runs of this job")
        parser.add_argument("--instance", help="only runs of this instance")
        parser.add_argument(
            "--state",
            choices=list(STATES),
            help="only running runs in this state: backing off, leased, with a lapsed lease, paused, or whose "
            "job a drive found not registered",
        )
        parser.add_argument("--limit", type=int, default=50, help="at most this many runs (1-500, default 50)")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument(
            "--health",
            action="store_true",
            help="check the queue instead of listing: exit non-zero, saying why, when the oldest due run has "
            "waited longer than --max-lag, when a lease lapsed longer ago than that and no drive took the run "
            "over, or when the database cannot be reached (for a liveness probe or a cron monitor)",
        )
        parser.add_argument(
            "--max-lag",
            type=seconds(most=MAX_LAG_SECONDS),
            default=300.0,
            metavar="SECONDS",
            help="with --health: the longest a due run may wait, and a lapsed lease stay untaken (default 300)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["health"]:
            self.health(options["max_lag"], as_json=options["json"])
            return
        try:
            if options["run_id"]:
                self.show(options["run_id"], as_json=options["json"])
            else:
                self.list(options)
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None

    # -- the list ----------------------------------------------------------------

    def list(self, options: dict[str, Any]) -> None:
        rows = JobRun.objects.using(db.alias()).all()
        if options["status"]:
            rows = rows.filter(status=options["status"])
        if options["job"]:
            module, dot, name = options["job"].partition(".")
            if not dot or not module or not name:
                raise CommandError(f"--job {options['job']!r}: write it as 'app_label.job_name' or a task's path")
            rows = of_job(rows, options["job"])
        if options["instance"]:
            rows = rows.filter(instance=options["instance"])
        if options["state"]:
            rows = in_state(rows, options["state"])
        found = list(rows.order_by("-id")[: list_limit(options["limit"])])
        records = [JobRunRecord.from_row(row) for row in found]
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    [
                        {**_plain(r.__dict__), "paused_at": _plain(row.paused_at)}
                        for r, row in zip(records, found, strict=True)
                    ]
                )
            )
            return
        if not records:
            self.stdout.write("no runs")
            return
        now = timezone.now()
        lines = []
        for record, row in zip(records, found, strict=True):
            progress = " ".join(f"{name}={value}" for name, value in sorted(record.counters.items())) or "-"
            error = (record.last_error or "").splitlines()[0][:100] if record.last_error else ""
            paused = " (paused)" if record.status == Status.RUNNING and row.paused_at is not None else ""
            key = f"{row.title} [{record.instance}]"
            lines.append([record.id, f"{record.status}{paused}", key, _age(record.started_at, now), progress, error])
        # Columns aligned (each as wide as its widest cell), so the eye and `cut`/`awk` find them.
        widths = [max(len(line[column]) for line in lines) for column in range(4)]
        for line in lines:
            cells = [cell.ljust(width) for cell, width in zip(line[:4], widths, strict=True)] + line[4:]
            self.stdout.write("  ".join(cells).rstrip())

    # -- health ------------------------------------------------------------------

    def health(self, max_lag: float, *, as_json: bool) -> None:
        if not max_lag > 0:
            raise CommandError(f"--max-lag must be a positive number of seconds, got {max_lag}")
        try:
            now = db.now()
            due = JobRun.objects.using(db.alias()).due(now)
            # How long the due runs have waited since they became due (D9), not since they started:
            # a run driven every second is never late, however old it is.
            oldest = due.order_by("due_at", "id").values_list("id", "due_at")[:1]
            lag_cutoff = now - timedelta(seconds=max_lag)
            lapsed = JobRun.objects.using(db.alias()).lapsed(lag_cutoff)
            lapsed_count = lapsed.count()
            first = list(oldest)
            # Periodic work is started only by drives: a tick left waiting says none is looking at it.
            late = list(
                JobSchedule.objects.using(db.alias())
                .filter(paused_at__isnull=True, removed_at__isnull=True, next_tick__lt=lag_cutoff)
                .order_by("next_tick")
                .values_list("name", "next_tick")[:1]
            )
            counts = {
                "due": due.count(),
                "running": JobRun.objects.using(db.alias()).filter(status=Status.RUNNING).count(),
            }
        except DatabaseError as exc:
            problem = f"cannot reach the database: {first_line(exc)}"
            if as_json:
                self.stdout.write(json.dumps({"healthy": False, "problems": [problem]}))
            raise CommandError(problem) from None
        wait = _seconds(first[0][1], now) if first else 0.0
        problems = []
        if first and wait > max_lag:
            problems.append(
                f"the oldest due run ({first[0][0]}) has waited {wait:.0f} s, over {max_lag:g} s: no drive is "
                "taking runs (is run_due_jobs scheduled, and its jobs registered?)"
            )
        late_name, late_tick = late[0] if late else (None, None)
        tick_wait = _seconds(late_tick, now) if late_tick is not None else None
        if late_tick is not None:
            problems.append(
                f"schedule {late_name!r}: its tick at {late_tick.isoformat()} has waited {tick_wait:.0f} s to "
                f"start, over {max_lag:g} s: no drive is looking at the schedules (is run_due_jobs scheduled?), or "
                "the tick cannot start (the drives' log names why)"
            )
        if lapsed_count:
            problems.append(
                f"{lapsed_count} run(s) have a lease that lapsed over {max_lag:g} s ago and no drive took them "
                "over (e.g. run " + str(lapsed.values_list("id", flat=True).first()) + ")"
            )
        report = {
            "healthy": not problems,
            "problems": problems,
            "oldest_due_wait_seconds": round(wait, 3) if first else None,  # nothing due: no wait to speak of
            "oldest_due_run": first[0][0] if first else None,
            "lapsed_untaken": lapsed_count,
            "late_schedule": late_name,
            "late_tick_wait_seconds": round(tick_wait, 3) if tick_wait is not None else None,
            **counts,
            "max_lag_seconds": max_lag,
        }
        if as_json:
            self.stdout.write(json.dumps(report))
        elif not problems:
            waited = f"the oldest due waited {wait:.0f} s" if first else "nothing waiting"
            self.stdout.write(f"healthy: {counts['running']} running, {counts['due']} due, {waited}")
        if problems:
            for problem in problems:
                self.stderr.write(f"unhealthy: {problem}")
            raise CommandError(f"unhealthy: {len(problems)} problem(s)")

    # -- one run -----------------------------------------------------------------

    def show(self, run_id: str, *, as_json: bool) -> None:
        row = JobRun.objects.using(db.alias()).filter(pk=run_id.strip().upper()).first()
        if row is None:
            raise CommandError(f"no run has the id {run_id!r}")
        record = _plain(JobRunRecord.from_row(row).__dict__)
        record["paused_at"] = _plain(row.paused_at)
        ledger = [
            {
                "step": step.step,
                "completed": step.result is not None,
                "result": step.result_value,
                "attempts": step.attempts,
                "last_error": step.last_error,
                "recorded_at": _plain(step.recorded_at),
            }
            for step in JobStep.objects.using(db.alias()).filter(run_id=row.id).order_by("recorded_at", "id")
        ]
        restarts = list(
            JobRun.objects.using(db.alias())
            .filter(restarted_from_id=row.id)
            .order_by("id")
            .values_list("id", flat=True)
        )
        attempts = [
            {
                "number": a.number,
                "holder": a.holder,
                "started_at": _plain(a.started_at),
                "ended_at": _plain(a.ended_at),
                "error": a.error_class,
            }
            for a in JobAttempt.objects.using(db.alias()).filter(run_id=row.id).order_by("number", "id")
        ]
        if row.is_task:
            # A task: its return value (the run's final cursor), queue, priority, and its attempts as recorded.
            record = {
                "id": record["id"],
                "task": row.task_path,
                "queue": row.queue_name,
                "priority": row.priority,
                **{key: value for key, value in record.items() if key not in ("id", "cursor", "attempts")},
                "return_value": record.get("cursor") if row.status == Status.DONE else None,
                "attempts": len(attempts),
            }
        if as_json:
            self.stdout.write(json.dumps({**record, "ledger": ledger, "restarts": restarts, "attempts": attempts}))
            return
        for name, value in record.items():
            if value is None or value == {}:
                continue
            shown = json.dumps(value, indent=2, sort_keys=True) if isinstance(value, (dict, list)) else value
            self.stdout.write(f"{name}: {shown}")
        self.stdout.write(f"restarted as: {', '.join(restarts) or record.get('restarted_as') or '-'}")
        self.stdout.write(f"step ledger: {len(ledger) or 'empty'}")
        for step in ledger:
            state = "completed" if step["completed"] else f"not completed ({step['attempts']} attempt(s))"
            self.stdout.write(
                f"  {step['step']}: {state}" + (f" -> {json.dumps(step['result'])}" if step["completed"] else "")
            )
        for attempt in attempts:
            self.stdout.write(
                f"attempt {attempt['number']}: {attempt['holder']} {attempt['started_at']} -> "
                f"{attempt['ended_at'] or 'stopped reporting'}" + (f" {attempt['error']}" if attempt["error"] else "")
            )


def _seconds(since: Any, now: datetime) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def _age(started: datetime, now: datetime) -> str:
    if now - started < timedelta(minutes=1):
        return "just now"
    # Django's timesince joins number and unit with a no-break space: a plain one, so grep finds "2 minutes".
    return f"{timesince(started, now, depth=1)} ago".replace("\xa0", " ")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
