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
import functools
import logging
import re
import sys
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from functools import partial
from inspect import iscoroutinefunction
from typing import Any, NamedTuple

from django.core import checks
from django.db import transaction
from django.utils.module_loading import import_string

from . import conf, db, telemetry
from .attempts import Attempt, Finished, begin_attempt
from .conf import duration
from .exceptions import GiveUp, TaskExited, TaskNotImportable, TaskValueUnstorable
from .observers import AbandonPass
from .queue_safety import unstorable
from .registry import Job, add, lookup
from .retry import RetryPolicy
from .task_results import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskPayload,
    TaskResult,
    attempt_error,
    build_result,
    json_form,
    task_backends,
    task_enqueued,
    task_finished,
    task_of,
    task_started,
)
from .task_results import InvalidTask as InvalidTask
from .task_results import TaskError as TaskError
from .task_results import TaskResultDoesNotExist as TaskResultDoesNotExist
from .task_results import TaskResultStatus as TaskResultStatus
from .task_results import normalize_json as normalize_json

# No model is imported here at import time: a project that names this backend in
# TASKS without the app in INSTALLED_APPS must get the check that says so
# (jobruns.E010), not a traceback from every command.
#: The app label of the internal jobs that run tasks (``models.TASKS_MODULE``; repeated, not imported).
TASKS_MODULE = "django_jobruns_tasks"
#: The options this backend reads from ``TASKS[alias]["OPTIONS"]``.
OPTIONS = ("RETRY", "LEASE_TTL", "TIMEOUT")
#: What a result id looks like: a ULID, as the runs' ids are (uppercase Crockford base 32).
_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")


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
        if _in_event_loop():
            raise TypeError(
                f"context.step({name!r}, ...) was called in an async task: use `await context.astep(name, fn)`, "
                "which records the step from the worker's own thread"
            )
        return _current_pass.get().step(name, fn, retry=retry)

    async def astep(self, name: str, fn: Callable[[], Any], *, retry: RetryPolicy | None = None) -> Any:
        """``step`` for an ``async def`` task: ``fn`` a coroutine function or a plain one, run once for the task."""
        from asgiref.sync import async_to_sync, sync_to_async

        p = _current_pass.get()
        body = async_to_sync(fn) if iscoroutinefunction(fn) else fn
        # The step's records are written on the worker's own thread and connection (the pass's).
        return await sync_to_async(p.step, thread_sensitive=True)(name, body, retry=retry)

    def count(self, name: str, by: int | float = 1) -> None:
        _current_pass.get().count(name, by)

    @property
    def stopping(self) -> bool:
        """Whether the task should end early (D18): cancelled, paused, lease lost, past TIMEOUT, worker stopping."""
        return bool(_current_pass.get().stopping)


def _in_event_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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

    def validate_task(self, task: Task) -> None:
        """Django's validation, first refusing a ``run_after`` that is not a datetime."""
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            raise InvalidTask(
                f"run_after must be an aware datetime, not {type(task.run_after).__name__}: {task.run_after!r:.80}"
            )
        super().validate_task(task)
        fault = _column_fault(task.queue_name, "queue_name")
        if fault is not None:  # with ``QUEUES: []`` Django takes any name; the insert would refuse it
            raise InvalidTask(f"queue_name {task.queue_name!r:.80} {fault}")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        values = []
        for name, value in (("args", list(args)), ("kwargs", dict(kwargs))):
            try:
                values.append(json_form(value))  # normalized as Django's own backends do
            except (TypeError, ValueError, RecursionError) as exc:
                # The class Django's own refusal raises (a ValueError for bytes that are not text), so code
                # that catches it catches this; a structure nested past the recursion limit is a TypeError.
                refused = ValueError if isinstance(exc, ValueError) else TypeError
                raise refused(f"the task's {name} must be JSON ({exc}): {task.module_path} was not enqueued") from None
        args, kwargs = values
        payload = TaskPayload(
            task=task.module_path,
            args=args,
            kwargs=kwargs,
            run_after=task.run_after.isoformat() if task.run_after is not None else None,
            takes_context=task.takes_context,
        )
        with telemetry.starting(f"{TASKS_MODULE}.{self.alias}") as (traced, start):
            run = self._insert(task, payload, start.carrier if start is not None else None)
            if traced is not None and start is not None:
                traced.started(start, run, True)
        from .signals import notify_due

        notify_due()
        result = self._result(run, task, [])
        # Sent when the enqueue commits: a task whose transaction rolls back was never enqueued.
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=db.alias())
        return result

    def _insert(self, task: Task, payload: TaskPayload, trace_context: str | None) -> Any:
        from .models import JobRun, new_run_id

        now = db.now()
        run_id = new_run_id()
        run = JobRun(
            id=run_id,
            module=TASKS_MODULE,
            job=self.alias,
            instance=run_id,  # each enqueue its own run: never coalesced with another
            payload=payload.to_json(),
            started_at=now,
            updated_at=now,
            next_attempt_at=task.run_after,
            due_at=task.run_after or now,  # run_after is its first due time
            priority=task.priority,
            queue_name=task.queue_name,
            trace_context=trace_context,
        )
        # One INSERT, in the caller's transaction if there is one: a rollback removes the task.
        run.save(force_insert=True, using=db.alias())
        return run

    # -- results ---------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        from .models import JobAttempt, JobRun

        run = None
        # A ULID, exactly: no database sees a NUL, and a lowercase id is not found on MariaDB alone.
        if isinstance(result_id, str) and _ULID.fullmatch(result_id):
            run = JobRun.objects.using(db.alias()).filter(pk=result_id, module=TASKS_MODULE, job=self.alias).first()
        if run is None:
            raise TaskResultDoesNotExist(result_id)
        attempts = list(JobAttempt.objects.using(db.alias()).filter(run_id=run.id).order_by("number", "id"))
        return self._result(run, task_of(run, self.alias), attempts)

    def _result(
        self, run: Any, task: Task, attempts: list[Any], payload: TaskPayload | None = None, status: Any = None
    ) -> TaskResult:
        return build_result(run, task, attempts, self.alias, payload, status)

    # -- checks ----------------------------------------------------------------

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:  # the framework's check() returns a list
        from django.apps import apps

        yield from super().check(**kwargs)
        if not apps.is_installed("django_jobruns"):
            yield checks.Error(
                f"the tasks backend {self.alias!r} needs the django_jobruns app",
                hint="add 'django_jobruns' (and 'rangefilter') to INSTALLED_APPS, then run migrate",
                id="jobruns.E010",
            )
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            yield checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS'] has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(OPTIONS)}",
                id="jobruns.E013",
            )
        retry = self.options.get("RETRY")
        if retry is not None and not isinstance(retry, RetryPolicy):
            yield checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['RETRY'] must be a RetryPolicy, got {retry!r}", id="jobruns.E011"
            )
        fault = _column_fault(self.alias, "job")  # the alias names the internal job of the backend's runs
        if fault is not None:
            yield checks.Error(f"the TASKS key {self.alias!r:.80} {fault}", id="jobruns.E014")
        for name in self.queues:
            fault = _column_fault(name, "queue_name")
            if fault is not None:
                message = f"TASKS[{self.alias!r}]['QUEUES'] has {name!r:.80}, which {fault}"
                yield checks.Error(message, id="jobruns.E014")
        for key in ("LEASE_TTL", "TIMEOUT"):
            if self.options.get(key) is not None:
                try:
                    duration(self.options[key], f"TASKS[{self.alias!r}]['OPTIONS'][{key!r}]")
                except ValueError as exc:
                    yield checks.Error(str(exc), id="jobruns.E012")


@checks.register(checks.Tags.compatibility)
def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """This backend's checks where Django's Tasks framework does not run them.

    Registered when this module is imported (a project's code naming the backend loads it).
    Django 6 runs every backend's ``check()`` once ``django.tasks`` is imported, which this
    module does; the ``django-tasks`` backport on Django 5.2 only when it is in
    ``INSTALLED_APPS``, which it need not be: then the backends are checked here.
    """
    import importlib.util

    from django.apps import apps

    if importlib.util.find_spec("django.tasks") is not None or apps.is_installed("django_tasks"):
        return []
    return [message for alias in conf.task_backends() for message in task_backends[alias].check()]


# -- the internal job: running one task as one pass ------------------------------


def register_task_job(alias: str, options: dict[str, Any]) -> Job:
    """Register (or refresh) the internal job that runs the tasks of backend ``alias``."""
    retry = options.get("RETRY") if isinstance(options.get("RETRY"), RetryPolicy) else None
    lease, timeout = (_duration_or_none(options.get(key)) for key in ("LEASE_TTL", "TIMEOUT"))
    job = Job(_run_task, module=TASKS_MODULE, name=alias, retry=retry, lease=lease, timeout=timeout)
    job.on_claim = begin_attempt  # the attempt record begun in the claim's transaction
    return add(job, replace=True)


def _column_lengths() -> dict[str, int]:
    from django.apps import apps

    # A task defined while the apps load (an app's module imported first) is checked by the insert alone.
    return _installed_column_lengths() if apps.apps_ready else {}


@functools.cache
def _installed_column_lengths() -> dict[str, int]:
    from django.apps import apps

    if not apps.is_installed("django_jobruns"):
        return {}  # no row to hold them: jobruns.E010 names the missing app
    from .models import JobRun

    return {
        "job": JobRun._meta.get_field("job").max_length or 0,
        "queue_name": JobRun._meta.get_field("queue_name").max_length or 0,
    }


def _column_fault(text: str, field: str) -> str | None:
    """Why ``JobRun.<field>`` cannot hold ``text`` (said after it), or ``None``."""
    longest = _column_lengths().get(field, sys.maxsize)
    if len(text) > longest:
        return f"is longer than the {longest} characters this backend stores"
    return unstorable(text)


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
    for alias, params in conf.task_backends().items():
        if lookup(TASKS_MODULE, alias) is None:
            register_task_job(alias, params.get("OPTIONS", {}))


def _run_task(p: Any) -> dict[str, Any]:
    """One pass of a task run: import the function, call it, hand back its return value as the final cursor.

    The value is stored as Django's own backends store it (``normalize_json``); one with no JSON
    form fails the task at once, its body having run once. The attempt's record is written under
    the claim's fence, so a worker that lost its lease records and signals nothing.
    """
    from .models import JobAttempt

    run_id, alias = p.run.id, p.run.job
    payload = TaskPayload.of(p.payload)
    path = payload.task
    try:
        task = import_string(path)
    except (ImportError, ValueError) as exc:
        # A rolling deploy: newer code enqueued it, this worker runs older code. Not a failure of the
        # task: stepped over and named, and a worker that can import it runs it.
        Attempt(p).never_started()
        raise TaskNotImportable(f"the task {path!r} cannot be imported here ({exc})") from None
    attempt = Attempt(p)
    if not isinstance(task, Task):
        error = TypeError(f"{path!r} is not a task (decorate it with @task)")
        attempt.end(error)
        raise GiveUp(f"the task {path!r} cannot be run: {error}")
    backend = task_backends[alias] if alias in task_backends else None
    sender = type(backend) if backend is not None else JobRunsBackend
    takes_context = payload.takes_context
    signalled = task_started.has_listeners(sender) or task_finished.has_listeners(sender)
    result = None
    if (takes_context or signalled) and isinstance(backend, JobRunsBackend):
        # Built only when someone looks at it: the task's context, a receiver of the signals. Every
        # attempt is read for the context and for a retried attempt; a first attempt of a task without
        # a context is the one in flight, so no read is on the way of every task.
        attempts: list[Any]
        if takes_context or attempt.number > 1:
            attempts = list(JobAttempt.objects.using(db.alias()).filter(run_id=run_id).order_by("number", "id"))
        else:
            attempts = [_InFlight(holder=p.holder, started_at=attempt.began)]
        task_in_flight = task_of(p._row, alias, payload, task)
        result = backend._result(p._row, task_in_flight, attempts, payload, TaskResultStatus.RUNNING)
    args, kwargs = list(payload.args), dict(payload.kwargs)
    token = _current_pass.set(p)
    try:
        if result is not None:
            # As Django's own backends: a receiver that raises keeps the body from running. Here it fails
            # the attempt with its error, recorded (django-tasks-db's worker does the same).
            task_started.send(sender, task_result=result)
        if takes_context:
            args = [JobRunsTaskContext(task_result=result), *args]
        if iscoroutinefunction(task.func):
            from asgiref.sync import async_to_sync

            call = partial(async_to_sync(task.func), *args, **kwargs)
        else:
            call = partial(task.func, *args, **kwargs)
        raw = db.ending_its_transactions(call, "the task")
        try:
            value = json_form(raw)
        except (TypeError, ValueError, RecursionError) as exc:
            # Permanent: no retry gives the value a JSON form, and a retry would repeat the body's effects.
            attempt.end(exc, _finished(sender, result, TaskResultStatus.FAILED))
            raise TaskValueUnstorable(f"the task's return value has no JSON form: {exc}") from exc
        from .queue_safety import dump_task_value

        stored = dump_task_value(value)  # Django's rules, not a job cursor's; a stored result's size
        p._claim.check_timeout()  # a task that ran past its TIMEOUT is a failed attempt (D19)
    except BaseException as exc:
        attempt.end(exc, _finished(sender, result, TaskResultStatus.FAILED))
        if not isinstance(exc, Exception | KeyboardInterrupt | AbandonPass):
            # Django's own backends fail the task and go on; a job's handler that exits stops the drive (P9).
            raise TaskExited(f"the task raised {type(exc).__name__}: {exc!r:.200}") from exc
        raise
    finally:
        _current_pass.reset(token)
    attempt.end(None, _finished(sender, result, TaskResultStatus.SUCCESSFUL, value))
    return {"cursor": stored, "done": True}


def _finished(sender: Any, result: Any, status: Any, value: Any = None) -> Finished | None:
    """``task_finished`` for ``result``, sent once the pass's ending write held (a lost claim signals nothing).

    As Django's own backends send it: ``finished_at`` the attempt's end and, when it failed, its error
    among ``errors`` (as the attempt's record stores it).
    """
    if result is None:
        return None

    def send(error_class: str | None, traceback: str | None, ended_at: datetime) -> None:
        object.__setattr__(result, "status", status)
        object.__setattr__(result, "finished_at", ended_at)
        if error_class is not None:
            result.errors.append(attempt_error(error_class, traceback))
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", value)
        # The ending write has committed: a receiver that raises is logged (``django.dispatch``), the other
        # receivers still hear it, and neither the task's outcome nor the drive is touched.
        task_finished.send_robust(sender, task_result=result)

    return send


class _InFlight(NamedTuple):
    """The attempt in flight, as a task's result reads an attempt record (the record itself is not read)."""

    holder: str
    started_at: datetime
    ended_at: datetime | None = None
    error_class: str | None = None
    traceback: str | None = None
