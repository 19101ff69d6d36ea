"""Django's Tasks framework on this engine: ``django_jobruns.backend.JobRunsBackend``.

The cases Django's own database backend is held to (enqueue, results, refresh,
validation, signals), and what it lacks: retries, a SIGKILLed worker's task
taken over and charged, durable steps across a takeover, cancel.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.backend import JobRunsBackend, TaskResultDoesNotExist, TaskResultStatus
from django_jobruns.models import TASKS_MODULE, JobAttempt, JobRun
from django_jobruns.steering import cancel_job_run
from tests.conftest import manage
from tests.support import task_functions as t

_framework = importlib.import_module("django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks")
task_backends: Any = _framework.task_backends
default_task_backend: Any = _framework.default_task_backend
_exceptions: Any = importlib.import_module(f"{_framework.__name__}.exceptions")
#: Django 6 names it InvalidTask; the backport InvalidTaskError.
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
_signals: Any = importlib.import_module(f"{_framework.__name__}.signals")
task_enqueued, task_started, task_finished = _signals.task_enqueued, _signals.task_started, _signals.task_finished

pytestmark = pytest.mark.django_db(transaction=True)


def capture(signal: Any) -> list[tuple[Any, Any]]:
    received: list[tuple[Any, Any]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        received.append((sender, task_result))

    signal.connect(receiver, weak=False, dispatch_uid=f"test-{id(received)}")
    received.append  # noqa: B018
    return received


def test_the_backend_is_the_one_configured_with_every_capability():
    backend = task_backends["default"]
    assert isinstance(backend, JobRunsBackend) and default_task_backend.alias == "default"
    assert backend.supports_defer and backend.supports_async_task and backend.supports_get_result
    assert backend.supports_priority
    assert list(backend.check()) == []


@pytest.mark.parametrize("task", [t.noop_task, t.noop_task_async])
def test_enqueue_is_one_insert_and_returns_a_ready_result_whose_id_is_the_run(task):
    received = capture(task_enqueued)
    with CaptureQueriesContext(connection) as queries:
        result = task.enqueue(1, two=3)
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].upper().startswith("INSERT")]
    assert len(inserts) == 1, inserts
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert (result.started_at, result.last_attempted_at, result.finished_at, result.attempts) == (None, None, None, 0)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == task and result.args == [1] and result.kwargs == {"two": 3}
    run = JobRun.objects.get(pk=result.id)
    assert (run.module, run.job, run.status) == (TASKS_MODULE, "default", "running")
    assert [r for _, r in received] == [result]


def test_each_enqueue_is_its_own_run_never_coalesced():
    first, second = t.add.enqueue(1, 2), t.add.enqueue(1, 2)
    assert first.id != second.id and JobRun.objects.filter(module=TASKS_MODULE).count() == 2


def test_enqueue_in_a_transaction_that_rolls_back_leaves_no_task():
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        result = t.add.enqueue(1, 2)
        assert JobRun.objects.filter(pk=result.id).exists()
        raise Undo
    assert not JobRun.objects.filter(module=TASKS_MODULE).exists()


def test_arguments_that_are_not_json_are_refused_at_enqueue_and_nothing_is_written():
    with pytest.raises(TypeError, match="JSON"):
        t.noop_task.enqueue(timezone.now())
    with pytest.raises(TypeError, match="JSON"):
        t.noop_task.enqueue(value=object())
    assert not JobRun.objects.filter(module=TASKS_MODULE).exists()


def test_django_validation_refuses_what_it_refuses():
    with pytest.raises(InvalidTask):
        t.noop_task.using(queue_name="nowhere")
    with pytest.raises(InvalidTask):
        t.noop_task.using(priority=101)


def test_get_result_reads_the_run_and_refresh_sees_it_finish():
    result = t.calculate_meaning_of_life.enqueue()
    assert default_task_backend.get_result(result.id) == result
    assert run_due_jobs().completed == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 42 and result.attempts == 1
    assert result.started_at is not None and result.finished_at is not None and result.last_attempted_at is not None
    assert result.worker_ids == [JobAttempt.objects.get(run_id=result.id).holder]


def test_unknown_malformed_and_plain_job_run_ids_raise_task_result_does_not_exist(effects):
    run, _ = start_job_run("tests.walk", payload={"log": str(effects)})
    for result_id in ("123", "0" * 26, run.id, ""):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


def test_async_task_and_async_api():
    from asgiref.sync import async_to_sync

    result = async_to_sync(t.noop_task_async.aenqueue)()
    run_due_jobs()
    fetched = async_to_sync(default_task_backend.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value is None


def test_signals_started_and_finished_are_sent_by_the_drive():
    started, finished = capture(task_started), capture(task_finished)
    result = t.add.enqueue(2, 3)
    run_due_jobs()
    assert [r.id for _, r in started] == [result.id]
    assert [(r.id, r.status) for _, r in finished] == [(result.id, TaskResultStatus.SUCCESSFUL)]
    assert default_task_backend.get_result(result.id).return_value == 5


def test_a_task_starts_running_as_it_was_enqueued_with_its_own_priority_or_the_one_given():
    """The result a ``task_started`` receiver gets reads RUNNING and the task as enqueued: ``using``'s
    priority where one was given, the task itself where nothing was."""
    seen = []

    def receiver(sender, task_result, **kwargs):
        task = task_result.task
        seen.append((task_result.id, task_result.status, task.priority, task.queue_name, task.func))

    task_started.connect(receiver)
    try:
        plain = t.add.enqueue(1, 2)
        urgent = t.add.using(priority=7).enqueue(3, 4)
        mailed = t.add.using(queue_name="emails", priority=-3).enqueue(5, 6)
        run_due_jobs()
    finally:
        task_started.disconnect(receiver)
    running = TaskResultStatus.RUNNING
    assert seen == [  # the higher priority first
        (urgent.id, running, 7, t.add.queue_name, t.add.func),
        (plain.id, running, t.add.priority, t.add.queue_name, t.add.func),
        (mailed.id, running, -3, "emails", t.add.func),
    ]
    assert default_task_backend.get_result(plain.id).task == t.add
    assert default_task_backend.get_result(urgent.id).task == t.add.using(priority=7)
    assert default_task_backend.get_result(mailed.id).task == t.add.using(queue_name="emails", priority=-3)


def test_a_failing_task_is_retried_by_the_policy_and_fails_with_its_own_errors():
    result = t.failing_value_error.enqueue()
    for _ in range(5):
        run_due_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 3
    assert "This task failed due to ValueError" in result.errors[0].traceback
    assert "Traceback" in result.errors[0].traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_a_flaky_task_succeeds_on_a_retry(tmp_path):
    result = t.flaky.enqueue(str(tmp_path / "log"), 1)
    run_due_jobs()
    run_due_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "ok"
    assert result.attempts == 2 and [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"]


def test_run_after_defers_the_task_until_then():
    later = timezone.now() + timedelta(hours=1)
    result = t.add.using(run_after=later).enqueue(1, 2)
    assert run_due_jobs().attempted == 0
    assert default_task_backend.get_result(result.id).task.run_after == later
    report = run_due_jobs(now=lambda: later + timedelta(seconds=1))
    assert report.completed == 1


def test_priority_and_queue_are_stored():
    result = t.send_email.enqueue("ops@example.com")
    run = JobRun.objects.get(pk=result.id)
    assert (run.priority, run.queue_name) == (10, "emails")
    assert default_task_backend.get_result(result.id).task.priority == 10


def test_a_cancelled_task_is_failed_with_the_cancel_as_its_error():
    result = t.add.enqueue(1, 2)
    cancel_job_run(result.id, reason="not needed")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "django_jobruns.exceptions.Cancelled"
    assert run_due_jobs().attempted == 0


@pytest.mark.slow
def test_a_sigkilled_workers_task_is_taken_over_charged_and_skips_its_completed_steps(tmp_path):
    """The first step records, then the worker is SIGKILLed; a later drive takes the task over after the lease."""
    log = str(tmp_path / "steps.log")
    result = t.durable_steps.enqueue(log, True)
    first = manage("run_due_jobs")
    first.communicate(timeout=120)
    assert first.returncode == -9, "the worker was killed inside the task"
    # The lease (5 s) lapses by the database's clock; a drive with a budget takes the task over then.
    second = manage("run_due_jobs", "--max-seconds", "20", "--json")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert json.loads(out)["taken_over"] == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, (result.status, result.errors)
    with open(log) as lines:
        assert lines.read().splitlines() == ["first", "second"], "each step ran once"
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2
    assert result.return_value == {"a": "one", "b": "two", "attempt": 2}
    run = JobRun.objects.get(pk=result.id)
    assert json.loads(run.counters) == {"steps": 2}


def test_the_tasks_runs_are_pruned_with_their_attempts():
    from django_jobruns.pruning import prune_job_runs

    result = t.add.enqueue(1, 2)
    run_due_jobs()
    assert JobAttempt.objects.filter(run_id=result.id).count() == 1
    assert prune_job_runs(older_than=timedelta(0), now=timezone.now() + timedelta(seconds=1)) >= 1
    assert not JobAttempt.objects.filter(run_id=result.id).exists()


def test_worker_process_without_an_enqueue_drives_tasks():
    """A worker that never touched the backend (cron's run_due_jobs) still has the tasks' job registered."""
    result = t.add.enqueue(20, 22)
    worker = manage("run_due_jobs", "--json")
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert json.loads(out)["completed"] == 1
    assert default_task_backend.get_result(result.id).return_value == 42


def test_a_drive_works_only_the_queues_it_is_given_and_job_runs_beside_them(effects):
    default, email = t.add.enqueue(1, 2), t.send_email.enqueue("a@example.com")
    plain, _ = start_job_run("tests.walk", payload={"log": str(effects)})
    report = run_due_jobs(queues=["emails"], limit=10)
    assert report.completed == 2, report.as_dict()  # the email task and the job run
    assert default_task_backend.get_result(email.id).status == TaskResultStatus.SUCCESSFUL
    assert default_task_backend.get_result(default.id).status == TaskResultStatus.READY
    assert JobRun.objects.get(pk=plain.pk).status == "done"
    worker = manage("run_due_jobs", "--queue", "default", "--json")
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0 and json.loads(out)["completed"] == 1, err
    assert default_task_backend.get_result(default.id).return_value == 3


def test_queues_that_cannot_mean_anything_are_refused():
    from django_jobruns.exceptions import InvalidDriveOptions

    queues: Any
    for queues in ([], [""], 5):
        with pytest.raises(InvalidDriveOptions, match="queue"):
            run_due_jobs(queues=queues)


def test_higher_priority_tasks_are_taken_first_then_the_order_they_became_due(effects):
    low = t.add.using(priority=-5).enqueue(1, 1)
    plain, _ = start_job_run("tests.walk", payload={"log": str(effects)})  # a job run: priority 0
    first_high = t.add.using(priority=7).enqueue(2, 2)
    second_high = t.add.using(priority=7).enqueue(3, 3)
    order = []
    for _ in range(4):
        before = {r.id for r in JobRun.objects.filter(status="done")}
        assert run_due_jobs(limit=1).attempted == 1
        order += [r.id for r in JobRun.objects.filter(status="done") if r.id not in before]
    assert order == [first_high.id, second_high.id, plain.id, low.id]


def test_the_admin_lists_task_runs_by_task_filters_queue_and_priority_and_shows_arguments_result_and_errors(
    admin_client,
):
    from django.urls import reverse

    changelist = reverse("admin:django_jobruns_jobrun_changelist")
    done = t.add.enqueue(40, 2)
    failing = t.failing_value_error.enqueue()
    email = t.send_email.enqueue("ops@example.com")
    run_due_jobs(limit=2, queues=["default"])
    page = admin_client.get(changelist).content.decode().replace("<wbr>", "")
    assert "task tests.support.task_functions.add [queue default, priority 0]" in page
    assert "task tests.support.task_functions.send_email [queue emails, priority 10]" in page
    only_emails = admin_client.get(changelist, {"queue": "emails"}).content.decode()
    assert email.id in only_emails and done.id not in only_emails
    high = admin_client.get(changelist, {"priority": "high"}).content.decode()
    assert email.id in high and failing.id not in high

    detail = admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[done.id])).content.decode()
    assert "tests.support.task_functions.add" in detail and "40" in detail and "42" in detail
    detail = admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[failing.id])).content.decode()
    assert "builtins.ValueError" in detail and "This task failed due to ValueError" in detail
    assert "(not finished)" in detail

    # Steering works on task runs as on job runs.
    steer = reverse("admin:django_jobruns_jobrun_steer", args=[email.id])
    assert admin_client.post(steer, {"verb": "cancel"}).status_code == 302
    assert default_task_backend.get_result(email.id).status == TaskResultStatus.FAILED


def test_enqueue_is_logged_once_by_the_framework(caplog):
    import logging

    names = ("django.tasks", "django_tasks")  # Django 6's logger, the backport's
    for name in names:
        caplog.set_level(logging.DEBUG, logger=name)
    result = t.noop_task.enqueue()
    lines = [r.getMessage() for r in caplog.records if r.name in names]
    assert len(lines) == 1 and "enqueued" in lines[0] and result.id in lines[0], lines


def test_give_up_fails_the_task_at_once():
    result = t.gives_up.enqueue()
    run_due_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    assert result.errors[0].exception_class_path == "django_jobruns.exceptions.GiveUp"


def test_a_paused_task_reads_ready_and_is_not_run_until_unpaused():
    from django_jobruns.steering import pause_job_run, unpause_job_run

    result = t.add.enqueue(1, 2)
    pause_job_run(result.id)
    assert run_due_jobs().attempted == 0
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY
    unpause_job_run(result.id)
    assert run_due_jobs().completed == 1


def test_check_names_a_lease_or_retry_that_cannot_work(settings):
    from django_jobruns.registry import unregister

    backend = JobRunsBackend("checked", {"OPTIONS": {"LEASE_TTL": 1, "RETRY": 3}})
    try:
        ids = sorted(message.id for message in backend.check())
    finally:
        unregister(f"{TASKS_MODULE}.checked")
    assert ids == ["jobruns.E011", "jobruns.E012"]
