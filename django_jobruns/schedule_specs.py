"""Schedules as settings declare them (``JOBRUNS["SCHEDULES"]``): each one parsed and checked (S1).

A schedule names a job (``"job": "app.name"``, ``instance``, ``payload``) or a
task (``"task": "dotted.path"``, ``args``, ``kwargs``), a five-field ``cron``
expression and a ``timezone`` (the project's ``TIME_ZONE`` by default). What is
wrong with one is said naming it (system check ``jobruns.E020``), including what
the schedule's row could not hold. :mod:`django_jobruns.schedules` starts them.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings

from .models import JobSchedule
from .queue_safety import unstorable
from .starts import check_instance

#: The keys a schedule may have, by kind.
_JOB_KEYS = {"job", "cron", "timezone", "instance", "payload"}
_TASK_KEYS = {"task", "cron", "timezone", "args", "kwargs"}
#: The longest name, cron expression and target the schedule's row holds (PostgreSQL and MariaDB refuse more).
NAME_MAX = JobSchedule._meta.get_field("name").max_length or 0
CRON_MAX = JobSchedule._meta.get_field("cron").max_length or 0
TARGET_MAX = JobSchedule._meta.get_field("target").max_length or 0  # "job app.name" or "task dotted.path"


@dataclass(frozen=True)
class Schedule:
    """One schedule as settings declare it, checked."""

    name: str
    cron: str
    zone: zoneinfo.ZoneInfo
    job: str | None = None
    instance: str | None = None
    payload: Any = None
    task: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"job {self.job}" if self.job is not None else f"task {self.task}"

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, in UTC."""
        return next(CronSim(self.cron, moment.astimezone(self.zone))).astimezone(UTC)

    def latest_until(self, moment: datetime) -> datetime | None:
        """The last tick at or before ``moment`` (``None`` if there is none in the past year), in UTC."""
        # cronsim's reverse walk starts strictly before its start: a second later, a tick at ``moment`` counts.
        start = moment.astimezone(self.zone).replace(microsecond=0) + timedelta(seconds=1)
        for tick in CronSim(self.cron, start, reverse=True):
            return tick.astimezone(UTC)
        return None

    def explain(self) -> str:
        """The expression in words (``At 03:00 every day``)."""
        return str(CronSim(self.cron, datetime.now(self.zone)).explain())


def parse(name: Any, spec: Any) -> Schedule:
    """``spec`` (a dict of ``JOBRUNS["SCHEDULES"]``) as a :class:`Schedule`; ``ValueError`` naming what is wrong."""
    where = f"JOBRUNS['SCHEDULES'][{name!r:.100}]"
    if not isinstance(name, str) or not name or len(name) > NAME_MAX or unstorable(name):
        raise ValueError(f"{where}: a schedule's name must be text of 1 to {NAME_MAX} characters a database stores")
    if not isinstance(spec, dict):
        raise ValueError(f"{where} must be a dict, got {type(spec).__name__}")
    if ("job" in spec) == ("task" in spec):
        raise ValueError(f"{where} must name either a 'job' (app_label.name) or a 'task' (a dotted path), not both")
    allowed = _JOB_KEYS if "job" in spec else _TASK_KEYS
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(allowed))}"
        )
    cron = spec.get("cron")
    if not isinstance(cron, str):
        raise ValueError(f"{where}['cron'] must be a five-field cron expression, got {cron!r:.100}")
    if len(cron) > CRON_MAX:  # the schedule's row holds it
        raise ValueError(
            f"{where}['cron'] must be at most {CRON_MAX} characters (a long list of values reads shorter as a range "
            f"or a step: 0-59, */5), got {len(cron)}"
        )
    if len(cron.split()) != 5:
        raise ValueError(f"{where}['cron'] must have five fields (minute hour day month weekday), got {cron!r:.100}")
    zone_name = spec.get("timezone") or settings.TIME_ZONE or "UTC"
    try:
        zone = zoneinfo.ZoneInfo(zone_name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(
            f"{where}['timezone']: no time zone {zone_name!r:.100} (an IANA name: 'Europe/Paris')"
        ) from None
    try:
        CronSim(cron, datetime.now(zone))
    except CronSimError as exc:
        raise ValueError(f"{where}['cron'] does not parse ({exc}): {cron!r:.100}") from None
    if "job" in spec:
        job, instance = spec["job"], spec.get("instance")
        if not isinstance(job, str) or "." not in job or len(job) > TARGET_MAX - len("job ") or unstorable(job):
            raise ValueError(f"{where}['job'] must be a job's label, 'app_label.name', got {job!r:.100}")
        if instance is not None:
            try:
                check_instance(instance)
            except ValueError as exc:
                raise ValueError(f"{where}['instance']: {exc}") from None
        return Schedule(name, cron, zone, job=job, instance=instance, payload=spec.get("payload"))
    task, args, kwargs = spec["task"], spec.get("args", ()), spec.get("kwargs", {})
    if not isinstance(task, str) or "." not in task or len(task) > TARGET_MAX - len("task ") or unstorable(task):
        raise ValueError(
            f"{where}['task'] must be a task's dotted path of at most {TARGET_MAX - len('task ')} characters, "
            f"got {task!r:.100}"
        )
    if not isinstance(args, (list, tuple)):
        raise ValueError(f"{where}['args'] must be a list, got {type(args).__name__}")
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise ValueError(f"{where}['kwargs'] must be a dict with text keys, got {kwargs!r:.100}")
    return Schedule(name, cron, zone, task=task, args=tuple(args), kwargs=dict(kwargs))


def declared() -> tuple[dict[str, Schedule], list[str]]:
    """The schedules of ``JOBRUNS["SCHEDULES"]`` that parse, and what is wrong with the others."""
    configured = (getattr(settings, "JOBRUNS", None) or {}).get("SCHEDULES") or {}
    if not isinstance(configured, dict):
        return {}, [f"JOBRUNS['SCHEDULES'] must be a dict of name -> schedule, got {type(configured).__name__}"]
    cached = _parsed.get("declared")
    if cached is not None and cached[0] is configured and cached[1] == len(configured):
        return cached[2], cached[3]  # the same settings object as the last look: parsed already
    found: dict[str, Schedule] = {}
    problems = []
    for name, spec in configured.items():
        try:
            found[name] = parse(name, spec)
        except ValueError as exc:
            problems.append(str(exc))
    # Kept with the dict it was parsed from (the reference keeps its id from being reused): a drive
    # looks every round, and a thousand expressions take milliseconds to parse.
    _parsed["declared"] = (configured, len(configured), found, problems)
    return found, problems


_parsed: dict[str, tuple[Any, int, dict[str, Schedule], list[str]]] = {}
