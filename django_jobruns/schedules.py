"""Schedules: periodic runs and tasks, started by the drives themselves, each tick once (S1-S5).

``JOBRUNS["SCHEDULES"]`` declares them (read by :mod:`django_jobruns.schedule_specs`).
There is no beat and no leader: every ``run_due_jobs`` reads the schedules'
state (:class:`~django_jobruns.models.JobSchedule`, one cheap read a round) and
starts the ticks that are due, each in a transaction that first advances the
schedule's ``next_tick`` by a compare-and-set -- so however many drives see a
tick at once, one starts it.

Cron expressions are read by cronsim, which follows Debian cron's rules,
daylight-saving changes included: a time of day that a spring-forward change
skips runs once right after it; in the hour an autumn change repeats, a time
of day runs once, while a schedule of every so many minutes keeps its real
interval. Ticks missed while nothing drove start once, for the latest of them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F
from django.utils.module_loading import import_string

from . import db, telemetry
from .models import JobRun, JobSchedule
from .registry import lookup
from .report import DriveReport
from .schedule_specs import Schedule, declared

logger = logging.getLogger("django_jobruns")

#: At most this many due schedules are started in one round (the rest in the next).
ROUND_MAX = 1000


# -- the rows ------------------------------------------------------------------------

_synced: dict[str, dict[str, Schedule]] = {}


def sync(now: datetime) -> dict[str, Schedule]:
    """Bring the schedules' rows in line with settings (once per process and settings); return the schedules.

    A new schedule gets a row with its first tick after ``now``; one whose
    expression, timezone or target changed, or that comes back, gets its next
    tick again from ``now``; a row whose schedule left settings is marked
    removed (S5): it stops, its runs stay.
    """
    schedules, _ = declared()
    alias = db.alias()
    # ``declared()`` gives the same dict while the settings stay the same object: synced already.
    if _synced.get(alias) is schedules:
        return schedules
    rows = {row.name: row for row in JobSchedule.objects.using(alias)}
    for schedule in schedules.values():
        row = rows.get(schedule.name)
        fields = {"target": schedule.target, "cron": schedule.cron, "timezone": schedule.zone.key}
        if row is None:
            try:
                with transaction.atomic(using=alias):
                    JobSchedule.objects.using(alias).create(
                        name=schedule.name, next_tick=schedule.next_after(now), updated_at=now, **fields
                    )
            except IntegrityError:
                pass  # another process made it meanwhile
        elif (
            any(getattr(row, k) != v for k, v in fields.items()) or row.removed_at is not None or row.next_tick is None
        ):
            JobSchedule.objects.using(alias).filter(name=schedule.name).update(
                next_tick=schedule.next_after(now), removed_at=None, updated_at=now, **fields
            )
    gone = [name for name, row in rows.items() if name not in schedules and row.removed_at is None]
    if gone:
        JobSchedule.objects.using(alias).filter(name__in=gone, removed_at__isnull=True).update(
            removed_at=now, updated_at=now
        )
        logger.warning("schedule(s) %s are no longer in JOBRUNS['SCHEDULES']: stopped (their runs are kept)", gone)
    _synced[alias] = schedules
    return schedules


def forget_sync() -> None:
    """Sync again at the next look (after a change of the rows from outside: tests, an operator's tool)."""
    _synced.clear()


@dataclass
class Ticks:
    """What one look at the schedules did: ticks started, joined to a live run, and the next tick to wake for."""

    started: int = 0
    joined: int = 0
    next_tick: datetime | None = None


#: What was said once per process: a schedule whose job or task this process cannot start.
_said: set[tuple[str, str]] = set()


def fire_due(now: datetime) -> Ticks:
    """Start each schedule's due tick, once across every drive; say when the next one is.

    One read a round (none without schedules): the active schedules in order
    of their next tick, as many as are due and the first one that is not.
    """
    ticks = Ticks()
    if not _has_schedules():
        return ticks  # no statement at all
    schedules = sync(now)
    upcoming, due = _due(now)
    ticks.next_tick = upcoming
    for name, tick in due:
        schedule = schedules.get(name)
        if schedule is not None:
            fire(schedule, tick, now, ticks)
    return ticks


def _due(now: datetime) -> tuple[datetime | None, list[tuple[str, datetime]]]:
    """One statement: the active schedules' first tick after ``now``, and the ticks due at ``now`` (in order).

    Two index reads of the schedules' ``next_tick``, whatever their number: the
    earliest tick to come, joined to the due ones (at most :data:`ROUND_MAX`).
    """
    from .store import store

    wrapper = db.connection()
    q = wrapper.ops.quote_name
    table, name, tick = q(JobSchedule._meta.db_table), q("name"), q("next_tick")
    active = f"{q('paused_at')} IS NULL AND {q('removed_at')} IS NULL"
    sql = (
        f"SELECT upcoming.first_tick, due.{name}, due.{tick} FROM "
        f"(SELECT MIN({tick}) AS first_tick FROM {table} WHERE {active} AND {tick} > %s) upcoming "
        f"LEFT JOIN (SELECT {name}, {tick} FROM {table} WHERE {active} AND {tick} <= %s "
        f"ORDER BY {tick} LIMIT {ROUND_MAX}) due ON 1 = 1 ORDER BY due.{tick}"
    )
    at = wrapper.ops.adapt_datetimefield_value(now)
    with wrapper.cursor() as cur:
        cur.execute(sql, [at, at])
        rows = cur.fetchall()
    read = store().read_datetime
    upcoming = read(rows[0][0]) if rows else None
    due = [(row[1], read(row[2])) for row in rows if row[1] is not None]
    return upcoming, [(n, t) for n, t in due if t is not None]


def look_at_schedules(report: DriveReport, now: datetime) -> None:
    """A drive's look at the schedules (S2): the due ticks started, counted in ``report`` with the next tick.

    A database that cannot answer for them (migration 0019 not applied yet, a lost connection) costs
    the schedules this round, said once, never the drive: its runs are driven as ever.
    """
    try:
        ticks = fire_due(now)
    except DatabaseError as exc:
        if ("*", "unread") not in _said:
            _said.add(("*", "unread"))
            logger.error("the schedules could not be read (%s); runs are driven without them", exc)
        db.replace_if_broken()
        return
    with report._lock:
        report.ticks += ticks.started
        report.ticks_joined += ticks.joined
        report.next_tick = ticks.next_tick


def until_next_tick(report: DriveReport, now: datetime, deadline: float) -> float:
    """The end of a drive's wait for work: its budget's end, or the schedules' next tick if that comes first (S4)."""
    if report.next_tick is None:
        return deadline
    seconds = float((report.next_tick - now).total_seconds())
    return min(deadline, time.monotonic() + max(seconds, 0.0))


def _has_schedules() -> bool:
    """Whether settings declare any schedule (a drive without pays nothing for schedules)."""
    return bool((getattr(settings, "JOBRUNS", None) or {}).get("SCHEDULES"))


def fire(schedule: Schedule, tick: datetime, now: datetime, ticks: Ticks) -> None:
    """Start ``schedule``'s tick ``tick`` if no other drive has: the compare-and-set, then the start.

    A job run, or a task on this app's backend, starts in the compare-and-set's
    transaction: exactly once. A task on another backend is enqueued once that
    transaction has committed: at most once, and never in it (Django's
    ImmediateBackend runs the body right there; a database error in it would
    undo the compare-and-set and the tick would start again at every look).
    Ticks missed meanwhile start once, for the latest; the next tick is the
    first after ``now``. A job not registered in this process, or a task it
    cannot import, is left for a process that can (named once).
    """
    if not _startable(schedule):
        return
    latest = schedule.latest_until(now) or tick
    alias = db.alias()
    try:
        ours = _runs_here(schedule)
        with transaction.atomic(using=alias):
            advanced = (
                JobSchedule.objects.using(alias)
                .filter(name=schedule.name, next_tick=tick, paused_at__isnull=True, removed_at__isnull=True)
                .update(next_tick=schedule.next_after(now), last_tick=latest, updated_at=now)
            )
            if advanced != 1:
                return  # another drive started this tick
            if ours:
                run_id, created = _start_and_record(schedule, latest, now, ours)
        if not ours:
            run_id, created = _start_and_record(schedule, latest, now, ours)
    except Exception as exc:
        # Checks name a schedule that cannot start (jobruns.E020-E022); one that fails anyway is named
        # once per process. Its tick is tried again at the next look, unless it was already advanced (a
        # task on another backend).
        if (schedule.name, "failed") not in _said:
            _said.add((schedule.name, "failed"))
            logger.error("schedule %r could not start its tick at %s: %s", schedule.name, latest.isoformat(), exc)
        return
    if created:
        ticks.started += 1
    else:
        ticks.joined += 1
        logger.info("schedule %r: its run %s is still live; the tick joined it", schedule.name, run_id)


def _runs_here(schedule: Schedule) -> bool:
    """Whether the schedule's runs are this app's: a job's, or a task's on this app's backend (a write here)."""
    if schedule.job is not None:
        return True
    from .backend import JobRunsBackend

    return isinstance(import_string(str(schedule.task)).get_backend(), JobRunsBackend)


def _start_and_record(schedule: Schedule, tick: datetime, now: datetime, ours: bool) -> tuple[str, bool]:
    """Start the schedule's run for ``tick`` and count it on the schedule's row: (the run's id, whether it is new).

    The row keeps the run's id when the run is this app's; a task on another
    backend is that backend's to report (its ids are not runs here).
    """
    with telemetry.ticking(schedule.name, schedule.target, tick):
        run_id, created = start(schedule)
    counter = "ticks" if created else "joined"
    JobSchedule.objects.using(db.alias()).filter(name=schedule.name).update(
        last_run_id=run_id if ours else None, updated_at=now, **{counter: F(counter) + 1}
    )
    return run_id, created


def _startable(schedule: Schedule) -> bool:
    if schedule.job is not None:
        module, _, name = schedule.job.rpartition(".")
        ready = lookup(module, name) is not None
    else:
        try:
            import_string(str(schedule.task))
            ready = True
        except ImportError:
            ready = False
    if not ready and (schedule.name, "missing") not in _said:
        _said.add((schedule.name, "missing"))
        logger.warning(
            "schedule %r: %s cannot be started in this process (not registered or not importable here); its "
            "ticks are left to a process that can",
            schedule.name,
            schedule.target,
        )
    return ready


def start(schedule: Schedule) -> tuple[str, bool]:
    """Start the schedule's run now (a job run, joined if live) or enqueue its task: (the run's id, whether new)."""
    if schedule.job is not None:
        from .starts import start_job_run

        if schedule.instance is None:
            run, created = start_job_run(schedule.job, payload=schedule.payload)
        else:
            run, created = start_job_run(schedule.job, instance=schedule.instance, payload=schedule.payload)
        return run.pk, created
    task = import_string(str(schedule.task))
    result = task.enqueue(*schedule.args, **schedule.kwargs)
    return str(result.id), True


# -- the operator's verbs --------------------------------------------------------------


def run_now(name: str) -> tuple[str, bool]:
    """Start a schedule's run (or task) now, outside its ticks: (the run's id, whether it is new).

    For a task on another backend the id is that backend's (:func:`runs_here` says which).
    ``KeyError`` naming the schedules there are, for a name settings do not declare.
    """
    schedule = _declared(name)
    now = db.now()
    sync(now)
    return _start_and_record(schedule, now, now, _runs_here(schedule))


def runs_here(name: str) -> bool:
    """Whether schedule ``name``'s runs are this app's runs (a job, or a task on this app's backend).

    ``KeyError`` as :func:`run_now`.
    """
    return _runs_here(_declared(name))


def _declared(name: str) -> Schedule:
    schedules, _ = declared()
    schedule = schedules.get(name)
    if schedule is None:
        raise KeyError(
            f"no schedule {name!r} in JOBRUNS['SCHEDULES'] (there are: {', '.join(sorted(schedules)) or 'none'})"
        )
    return schedule


def pause(name: str) -> bool:
    """Pause a schedule: no tick starts until it is unpaused. Whether it was active."""
    now = db.now()
    return bool(
        JobSchedule.objects.using(db.alias())
        .filter(name=name, paused_at__isnull=True)
        .update(paused_at=now, updated_at=now)
    )


def unpause(name: str) -> bool:
    """Unpause a schedule: its next tick is the first after now (the ticks it missed paused do not start)."""
    schedules, _ = declared()
    schedule = schedules.get(name)
    now = db.now()
    fields: dict[str, Any] = {"paused_at": None, "updated_at": now}
    if schedule is not None:
        fields["next_tick"] = schedule.next_after(now)
    return bool(JobSchedule.objects.using(db.alias()).filter(name=name, paused_at__isnull=False).update(**fields))


def last_run(row: JobSchedule) -> JobRun | None:
    """The run a schedule's last tick started or joined, if it is still kept."""
    if row.last_run_id is None:
        return None
    return JobRun.objects.using(db.alias()).filter(pk=row.last_run_id).first()
