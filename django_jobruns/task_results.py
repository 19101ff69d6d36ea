"""A task run as Django's Tasks framework sees it: the framework's names, values as Django stores them, results.

Imports no model at import time (the backend that uses it is loaded while Django reads
``TASKS``, before the app registry may hold this app).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from . import db
from .exceptions import StoppedReporting


@dataclass(frozen=True)
class TaskPayload:
    """What a task run stores as its payload: the task by its path, its arguments, how it was enqueued.

    Stored as compact JSON whose first key is the task's path, so the operator's read finds a
    task's runs by the payload's beginning (:meth:`prefix`).
    """

    task: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: ``run_after`` as ISO text, or ``None``.
    run_after: str | None = None
    takes_context: bool = False

    def to_json(self) -> str:
        fields = {"task": self.task, "args": self.args, "kwargs": self.kwargs, "run_after": self.run_after}
        return json.dumps({**fields, "takes_context": self.takes_context}, separators=(",", ":"))

    @classmethod
    def of(cls, value: Any) -> TaskPayload:
        """A stored payload, decoded tolerantly: what does not fit reads as empty (the run fails, named)."""
        data = value if isinstance(value, Mapping) else {}
        task, args, kwargs, run_after = data.get("task"), data.get("args"), data.get("kwargs"), data.get("run_after")
        return cls(
            task=task if isinstance(task, str) else "",
            args=args if isinstance(args, list) else [],
            kwargs=kwargs if isinstance(kwargs, dict) else {},
            run_after=run_after if isinstance(run_after, str) else None,
            takes_context=bool(data.get("takes_context")),
        )

    @staticmethod
    def prefix(task: str) -> str:
        """How the payloads of ``task``'s runs begin."""
        return json.dumps({"task": task}, separators=(",", ":"))[:-1] + ","


def _framework(name: str) -> Any:
    """A module of Django's Tasks framework: ``django.tasks`` (Django 6), else the ``django_tasks`` backport."""
    try:
        return importlib.import_module(f"django.tasks{name}")
    except ImportError:
        return importlib.import_module(f"django_tasks{name}")


def _normalizer() -> Callable[[Any], Any]:
    """How Django's own backends store arguments and return values: Django 6's, else the backport's."""
    for module in ("django.utils.json", "django_tasks.utils"):
        try:
            found: Callable[[Any], Any] = importlib.import_module(module).normalize_json
        except (ImportError, AttributeError):
            continue
        return found
    raise ImportError("neither django.utils.json nor django_tasks.utils has normalize_json")


normalize_json = _normalizer()

_base = _framework(".base")
_exceptions = _framework(".exceptions")
_signals = _framework(".signals")
BaseTaskBackend: Any = _framework(".backends.base").BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
#: What Django's validation of a task raises (the backport names it ``InvalidTaskError``).
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
#: What ``get_result`` raises for an id that is not a task run of this backend.
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
task_backends: Any = _framework("").task_backends


def json_form(value: Any) -> Any:
    """``value`` as Django's own backends store it (``normalize_json``), then through JSON: what a result reads."""
    return json.loads(json.dumps(normalize_json(value), allow_nan=False))


def build_result(
    run: Any, task: Task, attempts: list[Any], alias: str, payload: TaskPayload | None = None, status: Any = None
) -> Any:
    """A task run as Django's framework reports it: status, errors (never none when FAILED), attempts, value.

    ``payload``: the run's, where the caller has decoded it already; ``status``: the one it reads, where the
    caller knows it (a worker's own task in flight is ``RUNNING``).
    """
    from .models import Status

    payload = TaskPayload.of(run.payload_value) if payload is None else payload
    status = _status(run) if status is None else status
    finished = run.status != Status.RUNNING
    errors = []
    for index, a in enumerate(attempts):
        if a.error_class:
            errors.append(attempt_error(a.error_class, a.traceback))
        elif a.ended_at is None and (finished or index < len(attempts) - 1):
            # Never ended, and another attempt came (or the run ended): its worker died.
            errors.append(_stopped_reporting(a.holder))
    if run.status == Status.CANCELLED:
        errors.append(
            TaskError(
                exception_class_path="django_jobruns.exceptions.Cancelled",
                traceback=run.last_error or "cancelled",
            )
        )
    elif status == TaskResultStatus.FAILED and not errors:
        # A failure no attempt recorded (a takeover that spent the policy): the run's own error.
        text = run.last_error or ""
        errors.append(TaskError(exception_class_path=_class_path_of(text), traceback=text))
    result = TaskResult(
        task=task,
        id=run.id,
        status=status,
        enqueued_at=run.started_at,
        started_at=attempts[0].started_at if attempts else None,
        finished_at=run.ended_at if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        args=payload.args,
        kwargs=payload.kwargs,
        backend=alias,
        errors=errors,
        worker_ids=[a.holder for a in attempts],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", run.cursor_value)
    return result


def attempt_error(error_class: str, traceback: str | None) -> Any:
    """An attempt's error as Django's framework reports it: its class's dotted path and its traceback."""
    return TaskError(exception_class_path=error_class, traceback=traceback or "")


def _stopped_reporting(holder: str) -> Any:
    from .outcomes import stopped_reporting

    path = f"{StoppedReporting.__module__}.{StoppedReporting.__qualname__}"
    return TaskError(exception_class_path=path, traceback=stopped_reporting(holder))


def _class_path_of(error: str | None) -> str:
    """The exception class a run's ``last_error`` names, as a dotted path (the engine's own base, if none)."""
    from . import exceptions

    if error and error.startswith("the pass under holder"):
        return f"{StoppedReporting.__module__}.{StoppedReporting.__qualname__}"
    for name in ("PassTimedOut", "GiveUp", "TaskValueUnstorable"):
        if error and name in error.split("\n", 1)[0]:
            return f"{exceptions.__name__}.{name}"
    return f"{exceptions.__name__}.JobRunsError"


def _status(run: Any) -> Any:
    from .models import Status

    if run.status == Status.DONE:
        return TaskResultStatus.SUCCESSFUL
    if run.status in (Status.FAILED, Status.CANCELLED):
        return TaskResultStatus.FAILED
    if run.is_leased(db.now()):
        return TaskResultStatus.RUNNING
    return TaskResultStatus.READY


def _unimportable(*args: Any, **kwargs: Any) -> None:
    """Stands for a task function that can no longer be imported (its result is still readable)."""
    raise ImportError("the task's function cannot be imported")


def task_of(run: Any, alias: str, payload: TaskPayload | None = None, found: Any = None) -> Task:
    """The ``Task`` a task run was enqueued as (its function imported by its module path).

    ``payload`` and ``found`` (the task its path names): the run's, where the caller has them already.
    """
    payload = TaskPayload.of(run.payload_value) if payload is None else payload
    if found is None:
        try:
            found = import_string(payload.task)
        except (ImportError, ValueError):
            found = None
    if not isinstance(found, Task):
        found = Task(func=_unimportable, backend=alias)
    run_after = parse_datetime(payload.run_after) if payload.run_after else None
    queue_name = run.queue_name or found.queue_name
    backend = alias if alias in task_backends and alias != found.backend else None
    same = (found.priority, found.queue_name) == (run.priority, queue_name) and run_after in (None, found.run_after)
    if backend is None and same:
        return found  # as enqueued with its own defaults (most tasks): ``using`` would copy and validate it again
    return found.using(backend=backend, priority=run.priority, queue_name=queue_name, run_after=run_after)
