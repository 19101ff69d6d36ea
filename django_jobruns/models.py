"""The two tables: ``JobRun`` (the durable record) and ``JobStep`` (the ledger)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from ulid import ULID


def new_run_id() -> str:
    """Return a new ULID as text: unique, and sortable by creation time."""
    return str(ULID())


class Status(models.TextChoices):
    RUNNING = "running", "running"
    """Live: a drive pass will take it (a killed run stays here)."""
    DONE = "done", "done"
    """Finished: the handler said ``done``."""
    FAILED = "failed", "failed"
    """Given up: a retry policy was exhausted; the last ledger is kept as evidence."""
    CANCELLED = "cancelled", "cancelled"
    """Stopped by an operator (``cancel_job_run``): terminal, the key freed, record and ledger kept."""


#: The start of the warning a run gets when a drive steps over it: no job of its name is
#: registered in that process, or its task cannot be imported there (the admin finds them by it).
UNREGISTERED_WARNING = "job not registered"

#: The runs so marked, as a filter (:meth:`JobRunQuerySet.marked_unregistered`).
MARKED_UNREGISTERED = Q(last_warning__isnull=False, last_warning__startswith=UNREGISTERED_WARNING)

#: The statuses a run ends in: ``ended_at`` stamped, the live key freed.
TERMINAL = (Status.DONE, Status.FAILED, Status.CANCELLED)


class JobRunQuerySet(models.QuerySet["JobRun"]):
    def live(self) -> JobRunQuerySet:
        """Runs still running: at most one per key."""
        return self.filter(status=Status.RUNNING)

    def finished(self) -> JobRunQuerySet:
        """Runs that reached ``done``, ``failed`` or ``cancelled``."""
        return self.filter(status__in=TERMINAL)

    def for_key(self, module: str, job: str, instance: str) -> JobRunQuerySet:
        return self.filter(module=module, job=job, instance=instance)

    def due(self, now: datetime) -> JobRunQuerySet:
        """Running, unpaused runs whose backoff has passed and whose lease is free: :meth:`JobRun.is_due` in SQL.

        The drive reads them :meth:`in_due_order`. Its cost does not grow with
        the finished runs the table retains: the read is a range over the runs
        in flight (the ``jobruns_due_at`` index, in due order, on every database).
        """
        return self.filter(
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now),
            status=Status.RUNNING,
            paused_at__isnull=True,
        )

    def leased(self, now: datetime) -> JobRunQuerySet:
        """Running runs held under a live lease at ``now``: :meth:`JobRun.is_leased` in SQL."""
        return self.filter(status=Status.RUNNING, lease_holder__isnull=False, lease_expires_at__gt=now)

    def lapsed(self, now: datetime) -> JobRunQuerySet:
        """Running runs whose holder's lease lapsed unreleased (it stopped reporting): :meth:`JobRun.is_lapsed`."""
        return self.filter(status=Status.RUNNING, lease_holder__isnull=False, lease_expires_at__lte=now)

    def backing_off(self, now: datetime) -> JobRunQuerySet:
        """Running runs waiting out a backoff (or a task's ``run_after``) at ``now``: :meth:`JobRun.is_backing_off`."""
        return self.filter(status=Status.RUNNING, next_attempt_at__gt=now)

    def paused(self) -> JobRunQuerySet:
        """Running runs an operator paused: :attr:`JobRun.is_paused`."""
        return self.filter(status=Status.RUNNING, paused_at__isnull=False)

    def marked_unregistered(self) -> JobRunQuerySet:
        """Runs a drive stepped over and marked (no job of their name registered there, or a task it could not import).

        Spelled with ``last_warning IS NOT NULL``, which the prefix implies, so
        that SQLite reads them from the index of the warned runs (``jobruns_warned``).
        """
        return self.filter(MARKED_UNREGISTERED)

    def in_due_order(self) -> JobRunQuerySet:
        """In the order runs became due (``due_at``: a start, a committed pass, a backoff's end), then by id (D9).

        So live runs take turns: a run that just committed a pass queues behind
        the runs that were waiting. Higher ``priority`` first (a task's; job runs
        have 0).
        """
        return self.order_by("-priority", "due_at", "id")


class JobRun(models.Model):
    """One run of a job: its key, its progress, its outcome and its lease.

    JSON is kept as text on purpose: a row restored from a hand-edited dump may
    hold text that does not parse, and it must still be readable (the operator
    read decodes tolerantly) and runnable (as a failed pass).
    """

    id = models.CharField(primary_key=True, max_length=26, default=new_run_id, editable=False)
    module = models.CharField(max_length=100)
    job = models.CharField(max_length=100)
    instance = models.CharField(max_length=200, default="default")
    # True while running, NULL once finished. Part of the unique key below:
    # NULLs never collide, so only live runs occupy it, on every backend.
    live = models.BooleanField(null=True, default=True, editable=False)
    payload = models.TextField(default="null")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    cursor = models.TextField(null=True, blank=True)
    counters = models.TextField(default="{}")
    #: Failed attempts of the pass in flight: reset when a pass commits (the retry policy counts these).
    attempts = models.IntegerField(default=0)
    #: Every failed pass over the run's life, silent ones (a takeover's charge) included: never reset.
    failed_passes = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(null=True, blank=True)
    last_warning = models.TextField(null=True, blank=True)
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    #: When the run became due: its start (a task's ``run_after``), its last committed pass, its
    #: backoff's end; NULL once it ended. The due order, and what "waiting since" counts from (D9).
    #: Set by every insert of the app and by ``save()``; a running row bulk-inserted by hand must set it.
    due_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    #: Set while an operator holds the run (``pause_job_run``): not due, key kept.
    paused_at = models.DateTimeField(null=True, blank=True)
    lease_holder = models.CharField(max_length=255, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_fence = models.BigIntegerField(default=0)
    # Lineage and the ledger are kept consistent by the app's own writes (a
    # restart, pruning's batched deletes), not by database constraints: a
    # constraint check per deleted row is what made retention slow at
    # millions of runs.
    #: The run this one was restarted or resumed as (at most one: set with the
    #: successor's insert, by a conditional UPDATE, so the database enforces it).
    #: Kept after the successor is pruned.
    restarted_as = models.CharField(max_length=26, null=True, blank=True, editable=False)
    restarted_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="restarts", db_constraint=False
    )
    # Django's Tasks framework (``django_jobruns.backend``): a task run's
    # priority (-100..100; job runs 0) and queue (job runs none). Added with a
    # database default and as a nullable column: no table rewrite.
    priority = models.SmallIntegerField(default=0, db_default=0)
    queue_name = models.CharField(max_length=100, null=True, blank=True)
    #: The trace context (W3C, as JSON) of the start's span, when OpenTelemetry
    #: traced it: each pass's span links to it (``django_jobruns.telemetry``).
    trace_context = models.TextField(null=True, blank=True, editable=False)

    objects = JobRunQuerySet.as_manager()

    class Meta:
        verbose_name = "job run"
        permissions = [
            ("restart_jobrun", "Can restart or resume a failed job run as a new run"),
            ("steer_jobrun", "Can cancel, pause, unpause or retry now a live job run"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["module", "job", "instance", "live"], name="jobruns_one_live_run"),
            # The live key and the status say the same thing, always: a run
            # occupies its key exactly while it is running.
            models.CheckConstraint(
                condition=Q(status=Status.RUNNING, live=True) | (~Q(status=Status.RUNNING) & Q(live__isnull=True)),
                name="jobruns_live_iff_running",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "id", "next_attempt_at"], name="jobruns_due"),
            models.Index(fields=["module", "job", "instance", "id"], name="jobruns_key"),
            # The operator's pages and retention, at millions of retained runs:
            # job_runs(instance=) newest first; started/ended date ranges; and
            # prune's "ended before" (live runs have no ended_at, so a range of
            # this index holds finished runs only).
            models.Index(fields=["instance", "id"], name="jobruns_instance"),
            models.Index(fields=["started_at"], name="jobruns_started"),
            models.Index(fields=["ended_at"], name="jobruns_ended"),
            models.Index(fields=["status", "ended_at"], name="jobruns_prune"),
        ]
        # Not declared here, made by migrations for the backends that have them:
        # the due read's index in due order (``jobruns_due_at``, 0017: partial
        # on PostgreSQL and SQLite, plain on MariaDB) and the overview's partial indexes of the runs held under a
        # lease and the paused runs (``jobruns_held``, ``jobruns_paused``, 0015;
        # plain indexes on MariaDB/MySQL, where Django warns of conditions), and
        # the warned runs, where the job filter finds jobs not registered
        # (``jobruns_warned``, 0016).

    def __str__(self) -> str:
        state = "paused" if self.status == Status.RUNNING and self.paused_at is not None else self.status
        return f"{self.module}.{self.job}[{self.instance}] {self.id} ({state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A running run inserted by hand (a test, a shell) is due from its backoff's end, else its start.
        if self._state.adding and self.due_at is None and self.status == Status.RUNNING:
            self.due_at = self.next_attempt_at or self.started_at
        super().save(*args, **kwargs)

    @property
    def is_task(self) -> bool:
        """Whether this run is a task of Django's Tasks framework (``django_jobruns.backend``)."""
        return self.module == TASKS_MODULE

    @property
    def task_path(self) -> str | None:
        """A task run's function, by its module path (``None`` for a job run)."""
        payload = self.payload_value if self.is_task else None
        return payload.get("task") if isinstance(payload, dict) else None

    @property
    def title(self) -> str:
        """What logs and operators call the run's work: a task's module path, else ``"app_label.job"``."""
        path = self.task_path if self.is_task else None
        return path if isinstance(path, str) and path else f"{self.module}.{self.job}"

    # The JSON fields are stored as text (a hand-edited row that does not parse
    # must still be readable); these give them decoded, ``None`` where absent
    # or unreadable.

    @property
    def payload_value(self) -> Any:
        """The payload the run was started with, decoded (``None`` if it was started without one)."""
        return _decoded(self.payload)

    @property
    def cursor_value(self) -> Any:
        """The cursor the last committed pass handed forward, decoded (``None`` before the first)."""
        return _decoded(self.cursor)

    @property
    def counters_value(self) -> dict[str, Any]:
        """The run's counters, decoded: ``run.counters_value["imported"]``."""
        value = _decoded(self.counters)
        return value if isinstance(value, dict) else {}

    @property
    def label(self) -> str:
        return f"{self.module}.{self.job}"

    def lease_free(self, now: datetime) -> bool:
        """Whether no claim holds the run at ``now``: never leased, released, or lapsed (an expired claim is unheld)."""
        return self.lease_expires_at is None or self.lease_expires_at <= now

    def is_leased(self, now: datetime) -> bool:
        return (
            self.status == Status.RUNNING
            and self.lease_holder is not None
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def is_lapsed(self, now: datetime) -> bool:
        return (
            self.status == Status.RUNNING
            and self.lease_holder is not None
            and self.lease_expires_at is not None
            and self.lease_expires_at <= now
        )

    def is_backing_off(self, now: datetime) -> bool:
        return self.status == Status.RUNNING and self.next_attempt_at is not None and self.next_attempt_at > now

    @property
    def is_paused(self) -> bool:
        return self.status == Status.RUNNING and self.paused_at is not None

    @property
    def is_marked_unregistered(self) -> bool:
        return self.last_warning is not None and self.last_warning.startswith(UNREGISTERED_WARNING)

    def is_due(self, now: datetime) -> bool:
        """Whether a drive may take the run at ``now``: the one definition of due.

        Running, not paused, past its backoff, its lease free. When it became due is ``due_at``,
        the due order.
        ``JobRun.objects.due(now)`` is its ORM form and the store's due read its
        SQL form; ``tests/test_drive.py`` holds the three equal.
        """
        return (
            self.status == Status.RUNNING
            and self.paused_at is None
            and (self.next_attempt_at is None or self.next_attempt_at <= now)
            and self.lease_free(now)
        )


class JobStep(models.Model):
    """A step of the pass in flight, recorded as it completes or fails.

    ``result`` NOT NULL is what means completed (a step returning nothing stores
    the JSON text ``null``); a step that raised keeps a NULL result and its
    attempt count. The rows are dropped when the pass commits.
    """

    # No index of its own: the unique (run, step) constraint leads with run.
    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False)
    step = models.CharField(max_length=255)
    result = models.TextField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(null=True, blank=True)
    recorded_at = models.DateTimeField()

    class Meta:
        verbose_name = "job step"
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="jobruns_one_row_per_step")]

    def __str__(self) -> str:
        return self.step

    @property
    def completed(self) -> bool:
        return self.result is not None

    @property
    def result_value(self) -> Any:
        """The step's return value, decoded (``None`` before it completed, or if unreadable)."""
        return _decoded(self.result)


def _decoded(text: str | None) -> Any:
    try:
        return json.loads(text) if text is not None else None
    except (TypeError, ValueError, RecursionError):
        return None


#: The app label of the internal jobs that run the tasks of Django's Tasks
#: framework (``django_jobruns.backend``): one job per backend alias.
TASKS_MODULE = "django_jobruns_tasks"


class JobAttempt(models.Model):
    """One claim of a task run (``django_jobruns.backend``): who worked it, when, and how it ended.

    Written by the pass itself as it begins and ends, outside the run's fence:
    a pass killed mid-way leaves its record without an end, and its worker is
    still counted among the task's ``worker_ids``.
    """

    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="task_attempts", db_constraint=False)
    number = models.IntegerField()
    holder = models.CharField(max_length=255)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    #: The exception's class as a dotted path, and its traceback (the task's own).
    error_class = models.CharField(max_length=255, null=True, blank=True)
    traceback = models.TextField(null=True, blank=True)

    class Meta:
        verbose_name = "task attempt"

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.run_id}"


class JobSchedule(models.Model):
    """The state of one schedule of ``JOBRUNS["SCHEDULES"]`` (S1): its next tick, the last, its last run.

    The schedule itself -- its cron expression, timezone, job or task -- is
    declared in settings and deployed with the code; this row is what the
    drives share. ``next_tick`` is the compare-and-set column: a drive that
    finds it due advances it, in the transaction that starts the tick's run,
    only if it is still the value it read, so each tick starts once however
    many drives see it (S2).
    """

    name = models.CharField(max_length=200, primary_key=True)
    #: What it starts, as last synced from settings: ``job app.name`` or ``task dotted.path``.
    target = models.CharField(max_length=300)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64)
    next_tick = models.DateTimeField(null=True, blank=True)
    last_tick = models.DateTimeField(null=True, blank=True)
    #: The run the last tick started or joined (a plain id: runs are pruned, the schedule stays).
    last_run_id = models.CharField(max_length=26, null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    #: Set when the schedule is no longer in settings (S5): it stops; its runs are kept.
    removed_at = models.DateTimeField(null=True, blank=True)
    #: Ticks that started a run or enqueued a task, and those that joined a live run instead (S3).
    ticks = models.IntegerField(default=0, db_default=0)
    joined = models.IntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField()

    class Meta:
        verbose_name = "job schedule"
        ordering = ("name",)
        indexes = [models.Index(fields=["next_tick"], name="jobruns_schedule_next")]
        permissions = [("steer_jobschedule", "Can run now, pause and unpause job schedules")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_active(self) -> bool:
        return self.paused_at is None and self.removed_at is None
