"""``manage.py job_schedules [--json] [--run NAME]``: the schedules, or one started now (S4)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_jobruns import db, schedule_specs, schedules
from django_jobruns.management.scheduled import ScheduledCommand
from django_jobruns.models import JobRun, JobSchedule
from django_jobruns.outcomes import summary

from .run_due_jobs import first_line


def _iso(moment: Any) -> str | None:
    return moment.isoformat() if moment is not None else None


class Command(ScheduledCommand):
    help = (
        "List the schedules of JOBRUNS['SCHEDULES'] with their expression in words, time zone, next and last "
        "tick and last run; or, with --run NAME, start one now (outside its ticks)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the schedules as JSON")
        parser.add_argument("--run", metavar="NAME", help="start this schedule's run (or task) now")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["run"] is not None:
                self.run_one(options["run"])
                return
            self.list(as_json=options["json"])
        except DatabaseError as exc:
            raise CommandError(f"cannot reach the database: {first_line(exc)}") from None

    def run_one(self, name: str) -> None:
        try:
            run_id, created = schedules.run_now(name)
        except KeyError as exc:
            raise CommandError(str(exc.args[0])) from None
        except DatabaseError:
            raise
        except Exception as exc:  # the job's start or the task's enqueue refused
            raise CommandError(f"schedule {name!r} could not start: {summary(exc).splitlines()[0]}") from None
        if schedules.runs_here(name):
            self.stdout.write(f"{'started' if created else 'joined live'} run {run_id} of schedule {name!r}")
        else:
            self.stdout.write(f"enqueued task {run_id} of schedule {name!r} on its backend")

    def list(self, *, as_json: bool) -> None:
        declared, problems = schedule_specs.declared()
        for problem in problems:
            self.stderr.write(f"not a schedule: {problem}")
        schedules.sync(db.now())
        rows = list(JobSchedule.objects.using(db.alias()).order_by("name"))
        last = {
            run.pk: run.status
            for run in JobRun.objects.using(db.alias()).filter(pk__in=[r.last_run_id for r in rows if r.last_run_id])
        }
        found = []
        for row in rows:
            schedule = declared.get(row.name)
            state = "removed" if row.removed_at or schedule is None else "paused" if row.paused_at else "active"
            found.append(
                {
                    "name": row.name,
                    "target": row.target,
                    "cron": row.cron,
                    "in_words": schedule.explain() if schedule is not None else None,
                    "timezone": row.timezone,
                    "state": state,
                    "next_tick": _iso(row.next_tick) if state == "active" else None,
                    "last_tick": _iso(row.last_tick),
                    "last_run": row.last_run_id,
                    "last_run_status": last.get(row.last_run_id or ""),
                    "ticks": row.ticks,
                    "joined": row.joined,
                }
            )
        if as_json:
            self.stdout.write(json.dumps(found))
            return
        if not found:
            self.stdout.write("no schedules (JOBRUNS['SCHEDULES'] declares none)")
        for entry in found:
            last_run = f"{entry['last_run']} ({entry['last_run_status'] or 'pruned'})" if entry["last_run"] else "none"
            self.stdout.write(
                f"{entry['name']}  {entry['state']}  {entry['target']}  {entry['cron']} ({entry['in_words'] or '-'}, "
                f"{entry['timezone']})  next {entry['next_tick'] or '-'}  last {entry['last_tick'] or '-'}  "
                f"last run {last_run}"
            )
