"""Starting runs: a new run, or the live one for the key (coalescing)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, OperationalError, transaction

from . import db, telemetry
from .exceptions import JobRunsError, NotRestartable
from .models import JobRun, Status
from .queue_safety import dump_queue_safe, unstorable
from .registry import Job, get_job
from .signals import notify_due
from .store.deadlocks import TRIES, retry_deadlocks
from .store.errors import is_deadlock

logger = logging.getLogger("django_jobruns")

# How many times an insert may collide with a live run that finishes before it
# can be read. Each retry needs another run to start and finish in between.
_JOIN_TRIES = 10


def check_instance(instance: Any) -> str:
    """``instance`` if a run's row can hold it (non-empty text, at most 200 characters, storable), or ``ValueError``."""
    if not isinstance(instance, str) or not instance or len(instance) > 200:
        raise ValueError(f"instance must be non-empty text of at most 200 characters, got {instance!r:.300}")
    why = unstorable(instance)
    if why is not None:
        raise ValueError(f"instance {instance!r:.300} {why}")
    return instance


class _Taken(Exception):
    """The predecessor was restarted by another call first (raised inside the insert's transaction)."""


def _start_or_join(
    label: str, build: Callable[[], JobRun], *, before_insert: Callable[[JobRun], bool] | None = None
) -> tuple[JobRun, bool]:
    """Insert the run of job ``label`` unless a live one holds its key; under a span when OpenTelemetry traces."""
    with telemetry.starting(label) as (traced, start):
        if traced is None or start is None:
            return _insert_or_join(build, before_insert=before_insert)

        def build_traced() -> JobRun:
            candidate = build()
            candidate.trace_context = start.carrier
            return candidate

        run, created = _insert_or_join(build_traced, before_insert=before_insert)
        traced.started(start, run, created)
        return run, created


def _insert_or_join(
    build: Callable[[], JobRun], *, before_insert: Callable[[JobRun], bool] | None = None
) -> tuple[JobRun, bool]:
    """Insert the run unless a live one holds its key; then return that one.

    The database decides: the unique ``(module, job, instance, live)``
    constraint admits one live run per key, so concurrent starts from any
    number of threads, processes or hosts produce exactly one row.
    ``before_insert`` writes in the insert's transaction (a restart's mark on
    its predecessor); ``False`` from it raises :class:`_Taken` and inserts nothing.
    """
    for _ in range(_JOIN_TRIES):
        candidate = build()
        key = f"{candidate.module}.{candidate.job}[{candidate.instance}]"

        def insert(candidate: JobRun = candidate) -> None:
            with transaction.atomic(using=db.alias()):
                if before_insert is not None and not before_insert(candidate):
                    raise _Taken
                candidate.save(force_insert=True)

        try:
            retry_deadlocks(insert, f"start of {key}")
            return candidate, True
        except IntegrityError:
            runs = JobRun.objects.using(db.alias())
            live = runs.for_key(candidate.module, candidate.job, candidate.instance).filter(live=True).first()
            if live is not None:
                return live, False
            # The live run finished between the insert and the read: try again.
        except OperationalError as exc:
            if is_deadlock(exc):
                raise JobRunsError(
                    f"could not start {key}: the database reported a deadlock {TRIES} times in a row ({exc})"
                ) from exc
            raise
    raise JobRunsError(f"could not start {key}: the key kept changing")


#: Live runs this process has warned about a start with another payload joining them: once each.
_warned_mismatch: dict[str, None] = {}


def _first_mismatch(run_id: str) -> bool:
    """Whether this is the first start with a differing payload to join ``run_id`` here (a bounded memory)."""
    if run_id in _warned_mismatch:
        return False
    if len(_warned_mismatch) >= 10_000:
        _warned_mismatch.pop(next(iter(_warned_mismatch)))
    _warned_mismatch[run_id] = None
    return True


def start_job_run(job: Job | str, *, instance: str = "default", payload: Any = None) -> tuple[JobRun, bool]:
    """Start a run, or join the live one for the key.

    Returns ``(run, created)``. ``created`` is False when a run of this job and
    instance is already running: that run is returned unchanged, payload and
    all. The payload is checked for queue safety before any row exists.
    """
    entry = get_job(job)
    instance = check_instance(instance)
    text = dump_queue_safe(payload, "payload")

    def build() -> JobRun:
        now = db.now()
        return JobRun(
            module=entry.module,
            job=entry.name,
            instance=instance,
            payload=text,
            started_at=now,
            updated_at=now,
            due_at=now,
        )

    run, created = _start_or_join(entry.label, build)
    if created:
        notify_due()
    elif run.payload != text and _first_mismatch(run.id):
        logger.warning(
            "start of %s.%s [%s] joined live run %s, whose payload differs from the one given; the live run "
            "keeps its own (cancel it first to start with the new one)",
            entry.module,
            entry.name,
            instance,
            run.id,
        )
    return run, created


def restart_job_run(run: JobRun | str, *, resume: bool = False) -> tuple[JobRun, bool]:
    """Start a failed run again as a new run with the same key and payload.

    The new run has its own id and ledger and records ``restarted_from``. With
    ``resume=True`` it carries the failed run's last committed cursor and
    counters; otherwise it starts from the beginning. A live run for the key is
    joined instead (``created`` False). At most once, enforced by the database:
    restarting a run again joins its successor while that is live, and is
    refused, naming it, once it has ended (pruned or not). Refuses a run that
    is not failed.
    """
    run_id = run.pk if isinstance(run, JobRun) else run
    runs = JobRun.objects.using(db.alias())
    current = None if not isinstance(run_id, str) or unstorable(run_id) else runs.filter(pk=run_id).first()
    if current is None:
        raise NotRestartable(f"no run has the id {run_id!r}")
    if current.status != Status.FAILED:
        raise NotRestartable(f"run {current.id} is {current.status}; only a failed run can be restarted as a new run")
    if current.restarted_as is not None:
        return _restarted_already(current)

    def build() -> JobRun:
        now = db.now()
        return JobRun(
            module=current.module,
            job=current.job,
            instance=current.instance,
            payload=current.payload,
            cursor=current.cursor if resume else None,
            counters=current.counters if resume else "{}",
            restarted_from=current,
            started_at=now,
            updated_at=now,
            due_at=now,
        )

    def mark(successor: JobRun) -> bool:
        # At most once, by the database: of concurrent restarts, the one whose
        # UPDATE finds the mark empty inserts; the others wait for its row lock,
        # find the mark set, and insert nothing. Rolled back with a join.
        return bool(
            runs.filter(pk=current.pk, status=Status.FAILED, restarted_as__isnull=True).update(
                restarted_as=successor.pk
            )
        )

    try:
        run, created = _start_or_join(current.label, build, before_insert=mark)
    except _Taken:
        current.refresh_from_db(fields=["restarted_as"])
        return _restarted_already(current)
    if created:
        notify_due()
    return run, created


def _restarted_already(current: JobRun) -> tuple[JobRun, bool]:
    """Join the live successor of ``current`` (as a second start joins a live run), or refuse, naming it."""
    successor = JobRun.objects.using(db.alias()).filter(pk=current.restarted_as).first()
    if successor is not None and successor.status == Status.RUNNING:
        return successor, False
    # A second restart would repeat the work its successor did.
    refused = NotRestartable(
        f"run {current.id} was already restarted as run {current.restarted_as}; restart that one if it failed"
        + ("" if successor is not None else " (it has since been pruned)")
    )
    refused.successor = current.restarted_as
    raise refused
