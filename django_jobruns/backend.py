"""Django's Tasks framework on this engine: ``"BACKEND": "django_jobruns.backend.JobRunsBackend"`` in ``TASKS``.

Each enqueue is one run of an internal job (one per backend alias), whose
payload names the task's function, its arguments and how it was enqueued. The
drive is the worker: ``manage.py run_due_jobs`` runs task runs beside job runs,
under the same fenced leases, retry policy and takeovers. A task is one pass;
its return value is the run's final cursor. Every claim of a task run leaves an
attempt record (:class:`~django_jobruns.models.JobAttempt`), which gives the
result its worker ids, attempts, start times and errors.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import logging
import traceback
from collections.abc import Callable, Iterable
from datetime import timedelta
from inspect import iscoroutinefunction
from typing import Any

from django.core import checks
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from . import db, telemetry
from .conf import duration
from .exceptions import GiveUp
from .models import TASKS_MODULE, JobAttempt, JobRun, Status, new_run_id
from .registry import Job, add, lookup
from .retry import RetryPolicy


def _framework(name: str) -> Any:
    """A module of Django's Tasks framework: ``django.tasks`` (Django 6), else the ``django_tasks`` backport."""
    try:
        return importlib.import_module(f"django.tasks{name}")
    except ImportError:
        return importlib.import_module(f"django_tasks{name}")


_base = _framework(".base")
_exceptions = _framework(".exceptions")
_signals = _framework(".signals")
BaseTaskBackend: Any = _framework(".backends.base").BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
#: What ``get_result`` raises for an id that is not a task run of this backend.
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished

logger = logging.getLogger("django_jobruns")


_current_pass: contextvars.ContextVar[Any] = contextvars.ContextVar("django_jobruns_task_pass")


class JobRunsTaskContext(TaskContext):  # type: ignore[misc]
    """The context a ``takes_context=True`` task receives: Django's, plus durable steps.

    ``context.step(name, fn)`` runs ``fn`` once for the task: a retried or
    taken-over task returns the recorded result instead of running it again
    (the pass's rules: names unique, results JSON). ``context.count(name)``
    adds to the run's counters, kept when the task succeeds.
    """

    def step(self, name: str, fn: Callable[[], Any], *, retry: RetryPolicy | None = None) -> Any:
        return _current_pass.get().step(name, fn, retry=retry)

    def count(self, name: str, by: int | float = 1) -> None:
        _current_pass.get().count(name, by)

    @property
    def stopping(self) -> bool:
        """Whether the task should end early (D18): cancelled, paused, lease lost, past TIMEOUT, worker stopping."""
        return bool(_current_pass.get().stopping)


class JobRunsBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django's Tasks on django-jobruns: durable, leased, retried, cancellable runs."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.job = register_task_job(alias, self.options)

    # -- enqueue ---------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        for name, value in (("args", args), ("kwargs", kwargs)):
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"the task's {name} must be JSON ({exc}): {task.module_path} was not enqueued"
                ) from None
        payload = {
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "run_after": task.run_after.isoformat() if task.run_after is not None else None,
            "takes_context": task.takes_context,
        }
        with telemetry.starting(f"{TASKS_MODULE}.{self.alias}") as (traced, start):
            run = self._insert(task, payload, start.carrier if start is not None else None)
            if traced is not None and start is not None:
                traced.started(start, run, True)
        from .signals import notify_due

        notify_due()
        result = self._result(run, task, [])
        task_enqueued.send(type(self), task_result=result)
        return result

    def _insert(self, task: Task, payload: dict[str, Any], trace_context: str | None) -> JobRun:
        now = db.now()
        run_id = new_run_id()
        run = JobRun(
            id=run_id,
            module=TASKS_MODULE,
            job=self.alias,
            instance=run_id,  # each enqueue its own run: never coalesced with another
            payload=json.dumps(payload, separators=(",", ":")),
            started_at=now,
            updated_at=now,
            next_attempt_at=task.run_after,
            priority=task.priority,
            queue_name=task.queue_name,
            trace_context=trace_context,
        )
        # One INSERT, in the caller's transaction if there is one: a rollback removes the task.
        run.save(force_insert=True, using=db.alias())
        return run

    # -- results ---------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        run = None
        if isinstance(result_id, str) and len(result_id) == 26:
            run = JobRun.objects.using(db.alias()).filter(pk=result_id, module=TASKS_MODULE, job=self.alias).first()
        if run is None:
            raise TaskResultDoesNotExist(result_id)
        attempts = list(JobAttempt.objects.using(db.alias()).filter(run_id=run.id).order_by("number"))
        return self._result(run, task_of(run, self.alias), attempts)

    def _result(self, run: JobRun, task: Task, attempts: list[JobAttempt]) -> TaskResult:
        payload = run.payload_value if isinstance(run.payload_value, dict) else {}
        errors = [
            TaskError(exception_class_path=a.error_class, traceback=a.traceback or "")
            for a in attempts
            if a.error_class
        ]
        status = _status(run)
        if run.status == Status.CANCELLED:
            errors.append(
                TaskError(
                    exception_class_path="django_jobruns.exceptions.Cancelled",
                    traceback=run.last_error or "cancelled",
                )
            )
        result = TaskResult(
            task=task,
            id=run.id,
            status=status,
            enqueued_at=run.started_at,
            started_at=attempts[0].started_at if attempts else None,
            finished_at=run.ended_at if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
            last_attempted_at=attempts[-1].started_at if attempts else None,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[a.holder for a in attempts],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", run.cursor_value)
        return result

    # -- checks ----------------------------------------------------------------

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:  # the framework's check() returns a list
        from django.apps import apps

        yield from super().check(**kwargs)
        if not apps.is_installed("django_jobruns"):
            yield checks.Error(
                f"the tasks backend {self.alias!r} needs the django_jobruns app",
                hint="add 'django_jobruns' (and 'rangefilter') to INSTALLED_APPS",
                id="jobruns.E010",
            )
        retry = self.options.get("RETRY")
        if retry is not None and not isinstance(retry, RetryPolicy):
            yield checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['RETRY'] must be a RetryPolicy, got {retry!r}", id="jobruns.E011"
            )
        for key in ("LEASE_TTL", "TIMEOUT"):
            if self.options.get(key) is not None:
                try:
                    duration(self.options[key], f"TASKS[{self.alias!r}]['OPTIONS'][{key!r}]")
                except ValueError as exc:
                    yield checks.Error(str(exc), id="jobruns.E012")


def _status(run: JobRun) -> Any:
    if run.status == Status.DONE:
        return TaskResultStatus.SUCCESSFUL
    if run.status in (Status.FAILED, Status.CANCELLED):
        return TaskResultStatus.FAILED
    if run.lease_holder is not None and run.lease_expires_at is not None and run.lease_expires_at > db.now():
        return TaskResultStatus.RUNNING
    return TaskResultStatus.READY


def _unimportable(*args: Any, **kwargs: Any) -> None:
    """Stands for a task function that can no longer be imported (its result is still readable)."""
    raise ImportError("the task's function cannot be imported")


def task_of(run: JobRun, alias: str) -> Task:
    """The ``Task`` a task run was enqueued as (its function imported by its module path)."""
    payload = run.payload_value if isinstance(run.payload_value, dict) else {}
    try:
        found = import_string(payload.get("task", ""))
    except (ImportError, ValueError):
        found = None
    if not isinstance(found, Task):
        found = Task(func=_unimportable, backend=alias)
    run_after = parse_datetime(payload["run_after"]) if payload.get("run_after") else None
    return found.using(priority=run.priority, queue_name=run.queue_name or found.queue_name, run_after=run_after)


# -- the internal job: running one task as one pass ------------------------------


def register_task_job(alias: str, options: dict[str, Any]) -> Job:
    """Register (or refresh) the internal job that runs the tasks of backend ``alias``."""
    retry = options.get("RETRY")
    lease, timeout = (_duration_or_none(options.get(key)) for key in ("LEASE_TTL", "TIMEOUT"))
    return add(Job(_run_task, module=TASKS_MODULE, name=alias, retry=retry, lease=lease, timeout=timeout), replace=True)


def _duration_or_none(value: Any) -> timedelta | None:
    """An option's duration, or ``None`` (the default) for a missing or bad one, which the backend's check names."""
    if value is None:
        return None
    try:
        return duration(value, "option")
    except ValueError:
        return None


def register_configured_backends() -> None:
    """Register the internal job of every ``TASKS`` backend of this class (at start-up: workers enqueue nothing)."""
    from django.conf import settings

    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if params.get("BACKEND") == "django_jobruns.backend.JobRunsBackend" and lookup(TASKS_MODULE, alias) is None:
            register_task_job(alias, params.get("OPTIONS", {}))


def _run_task(p: Any) -> dict[str, Any]:
    """One pass of a task run: import the function, call it, hand back its return value as the final cursor."""
    run_id, alias = p.run.id, p.run.job
    payload = p.payload if isinstance(p.payload, dict) else {}
    path = payload.get("task", "")
    attempt = _Attempt(run_id, p.attempt)
    attempt.begin(p.holder)
    try:
        task = import_string(path)
        if not isinstance(task, Task):
            raise TypeError(f"{path!r} is not a task (decorate it with @task)")
    except (ImportError, ValueError, TypeError) as exc:
        attempt.end(exc)
        raise GiveUp(f"the task {path!r} cannot be run: {exc}") from None
    backend = task.get_backend() if task.backend == alias else None
    sender = type(backend) if backend is not None else JobRunsBackend
    takes_context = bool(payload.get("takes_context"))
    signalled = task_started.has_listeners(sender) or task_finished.has_listeners(sender)
    result = None
    if (takes_context or signalled) and isinstance(backend, JobRunsBackend):
        # Built only when someone looks at it: the task's context (every attempt, read), a receiver of
        # the signals (the attempt in flight only: no read on the way of every task).
        if takes_context:
            attempts = list(JobAttempt.objects.using(db.alias()).filter(run_id=run_id).order_by("number", "id"))
        else:
            attempts = [JobAttempt(run_id=run_id, number=p.attempt, holder=p.holder, started_at=attempt.began)]
        result = backend._result(p._row, task_of(p._row, alias), attempts)
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
        task_started.send(sender, task_result=result)
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    token = _current_pass.set(p)
    try:
        if takes_context:
            args = [JobRunsTaskContext(task_result=result), *args]
        if iscoroutinefunction(task.func):
            from asgiref.sync import async_to_sync

            value = async_to_sync(task.func)(*args, **kwargs)
        else:
            value = task.func(*args, **kwargs)
        json.dumps(value, allow_nan=False)  # a return value that cannot be stored fails the task here
    except BaseException as exc:
        attempt.end(exc)
        if result is not None:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            task_finished.send(sender, task_result=result)
        raise
    finally:
        _current_pass.reset(token)
    attempt.end(None)
    if result is not None:
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", value)
        task_finished.send(sender, task_result=result)
    return {"cursor": value, "done": True}


class _Attempt:
    """A task run's attempt record, written as the pass begins and as it ends (one statement each, autocommit)."""

    def __init__(self, run_id: str, number: int) -> None:
        self.run_id, self.number = run_id, number
        wrapper = db.connection()
        q = wrapper.ops.quote_name
        self.table = q(JobAttempt._meta.db_table)
        self.q = q

    def begin(self, holder: str) -> None:
        q, wrapper = self.q, db.connection()
        self.began = db.now()
        now = wrapper.ops.adapt_datetimefield_value(self.began)
        with wrapper.cursor() as cur:
            cur.execute(
                f"INSERT INTO {self.table} ({q('run_id')}, {q('number')}, {q('holder')}, {q('started_at')}) "
                "VALUES (%s, %s, %s, %s)",
                [self.run_id, self.number, holder, now],
            )

    def end(self, exc: BaseException | None) -> None:
        q, wrapper = self.q, db.connection()
        now = wrapper.ops.adapt_datetimefield_value(db.now())
        error = traceback_text = None
        if exc is not None:
            error = f"{type(exc).__module__}.{type(exc).__qualname__}"
            traceback_text = "".join(traceback.format_exception(exc))
        with wrapper.cursor() as cur:
            cur.execute(
                f"UPDATE {self.table} SET {q('ended_at')} = %s, {q('error_class')} = %s, {q('traceback')} = %s "
                f"WHERE {q('run_id')} = %s AND {q('number')} = %s AND {q('ended_at')} IS NULL",
                [now, error, traceback_text, self.run_id, self.number],
            )
