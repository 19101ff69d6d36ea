"""Django's Tasks, exactly as Django defines them, with Django's own ImmediateBackend as the reference.

What a task stores and reports (values normalized as Django's backends do), a FAILED result always
with an error, ``.using()`` end to end, attempt records under the claim's fence, async steps, a
rolling deploy's unimportable task, the checks and the worker's queue names.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from django_jobruns import run_due_jobs
from django_jobruns.backend import JobRunsBackend, TaskResultDoesNotExist, TaskResultStatus
from django_jobruns.exceptions import InvalidDriveOptions
from django_jobruns.models import TASKS_MODULE, JobAttempt, JobRun, Status
from tests.conftest import ROOT, manage, worker_env
from tests.support import task_functions as t

_framework = importlib.import_module("django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks")
task_backends: Any = _framework.task_backends
_signals: Any = importlib.import_module(f"{_framework.__name__}.signals")
_exceptions: Any = importlib.import_module(f"{_framework.__name__}.exceptions")
#: Django 6 names it InvalidTask; the backport InvalidTaskError.
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError

pytestmark = pytest.mark.django_db(transaction=True)

ACCEPTED = ["safe", "tuple", "ordered", "defaultdict", "int_keys", "bytes", "big_ints", "deep", "two_mib"]
REFUSED = ["set", "datetime", "nan"]


def reference(task: Any, *args: Any) -> Any:
    """The same task on Django's ImmediateBackend: its result, with its value in its stored (JSON) form."""
    result = task.using(backend="reference").enqueue(*args)
    return result


def stored(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("kind", ACCEPTED)
def test_a_value_django_accepts_succeeds_with_the_same_stored_form(kind, tmp_path):
    log = tmp_path / "log"
    ours = t.echo.enqueue(kind, str(log))
    assert run_due_jobs().completed == 1
    ours.refresh()
    theirs = reference(t.echo, kind)
    assert theirs.status == TaskResultStatus.SUCCESSFUL
    assert ours.status == TaskResultStatus.SUCCESSFUL and ours.errors == []
    assert ours.return_value == stored(theirs.return_value)
    assert log.read_text().splitlines() == [kind]  # the body ran once


def test_a_return_value_over_the_stored_results_cap_fails_the_task_at_once_naming_the_cap(tmp_path, settings):
    """Past ``STEP_RESULT_MAX_BYTES`` no database is sure to hold the pass's write: failed once, not re-run."""
    settings.JOBRUNS = {**getattr(settings, "JOBRUNS", {}), "STEP_RESULT_MAX_BYTES": 1024 * 1024}
    log = tmp_path / "log"
    ours = t.echo.enqueue("two_mib", str(log))
    report = run_due_jobs()
    assert report.failed == 1 and report.retrying == 0, report
    assert run_due_jobs().attempted == 0
    ours.refresh()
    assert ours.status == TaskResultStatus.FAILED and len(ours.errors) == 1
    assert "over the cap of 1048576 (JOBRUNS['STEP_RESULT_MAX_BYTES'])" in ours.errors[0].traceback
    assert log.read_text().splitlines() == ["two_mib"]


@pytest.mark.parametrize("kind", REFUSED)
def test_a_value_with_no_json_form_fails_the_task_at_once_with_its_error(kind, tmp_path):
    log = tmp_path / "log"
    ours = t.echo.enqueue(kind, str(log))
    report = run_due_jobs()
    ours.refresh()
    assert report.failed == 1 and report.retrying == 0, report
    assert ours.status == TaskResultStatus.FAILED and len(ours.errors) == 1
    assert log.read_text().splitlines() == [kind]  # once: no retry repeats the body's effects
    if kind != "nan":  # Django's own refuses these too, with the error it names
        theirs = reference(t.echo, kind)
        assert theirs.status == TaskResultStatus.FAILED
        assert ours.errors[-1].exception_class_path == theirs.errors[-1].exception_class_path


def test_arguments_are_normalized_as_django_does_and_refused_where_it_refuses():
    from collections import OrderedDict

    ours = t.noop_task.enqueue(b"bytes", (1, 2), OrderedDict(a=1))
    theirs = reference(t.noop_task, b"bytes", (1, 2), OrderedDict(a=1))
    assert ours.args == theirs.args == ["bytes", [1, 2], {"a": 1}]
    assert json.loads(JobRun.objects.get(pk=ours.id).payload)["args"] == ["bytes", [1, 2], {"a": 1}]
    with pytest.raises(TypeError, match="must be JSON"):
        t.noop_task.enqueue({1, 2})
    assert JobRun.objects.filter(module=TASKS_MODULE).count() == 1


@pytest.mark.parametrize("value", [b"\xff", {(1, 2): "a tuple key"}, float("nan")], ids=["bytes", "key", "nan"])
def test_an_argument_is_refused_with_the_class_of_error_django_raises_and_nothing_is_written(value):
    """The class of error Django's own refusal raises, so code that catches one catches the other.

    nan: Django's accepts it, but it has no JSON form.
    """
    try:
        reference(t.noop_task, value)
    except (TypeError, ValueError) as exc:
        expected: type[Exception] = type(exc)
    else:
        expected = ValueError  # json's own error for a float JSON cannot hold
    with pytest.raises(expected, match="must be JSON") as refused:
        t.noop_task.enqueue(value)
    assert type(refused.value) is expected
    assert not JobRun.objects.filter(module=TASKS_MODULE).exists()


@pytest.mark.parametrize("when", [timedelta(seconds=5), 5, "2030-01-01T00:00Z"], ids=["timedelta", "int", "str"])
def test_a_run_after_that_is_not_a_datetime_is_refused_naming_it_not_with_a_traceback_from_inside(when):
    with pytest.raises(InvalidTask, match=f"run_after must be an aware datetime, not {type(when).__name__}"):
        t.noop_task.using(run_after=when)
    assert not JobRun.objects.filter(module=TASKS_MODULE).exists()


def test_a_failed_result_always_has_an_error_even_when_no_attempt_recorded_one(tmp_path):
    """A worker killed until the policy is spent: the takeover's charge is the task's error."""
    result = t.hangs_until_killed.using(backend="once").enqueue(str(tmp_path / "log"))
    worker = manage("run_due_jobs", "--holder", "doomed")
    worker.communicate(timeout=60)
    run = JobRun.objects.get(pk=result.id)
    assert run.lease_holder == "doomed"
    later = lambda: run.lease_expires_at + timedelta(seconds=1)  # noqa: E731
    report = run_due_jobs(now=later, holder="rescuer")
    assert report.taken_over == 1
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors, "a FAILED result with no error"
    assert result.errors[-1].exception_class_path == "django_jobruns.exceptions.StoppedReporting"
    assert "doomed" in result.errors[-1].traceback
    assert result.worker_ids == ["doomed"]


def test_using_another_alias_keeps_the_task_context_and_its_retry_policy():
    result = t.which_attempt.using(backend="once").enqueue()
    assert result.backend == "once"
    run_due_jobs()
    result = task_backends["once"].get_result(result.id)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == {"attempt": 1, "backend": "once"}


def finished_as_signalled(enqueue: Any) -> list[Any]:
    """What ``task_finished`` receivers got while ``enqueue`` ran: status, end, errors, value."""
    seen: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        successful = task_result.status == TaskResultStatus.SUCCESSFUL
        errors = [(e.exception_class_path, e.traceback.strip().splitlines()[-1]) for e in task_result.errors]
        seen.append(
            (task_result.status, task_result.finished_at is not None, errors, successful and task_result.return_value)
        )

    _signals.task_finished.connect(receiver, weak=False, dispatch_uid="finished-as-signalled")
    try:
        enqueue()
    finally:
        _signals.task_finished.disconnect(dispatch_uid="finished-as-signalled")
    return seen


def test_a_task_started_receiver_that_raises_fails_the_attempt_with_its_error_and_the_body_never_runs(tmp_path):
    """As Django's own backends: the body does not run. Recorded: the receiver's error, not a record never ended."""

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise RuntimeError("the started receiver broke")

    log = tmp_path / "log"
    _signals.task_started.connect(receiver, weak=False, dispatch_uid="started-raises")
    try:
        ours = t.echo.using(backend="once").enqueue("safe", str(log))
        report = run_due_jobs()
        with pytest.raises(RuntimeError, match="the started receiver broke"):
            reference(t.echo, "safe", str(log))
    finally:
        _signals.task_started.disconnect(dispatch_uid="started-raises")
    assert report.failed == 1 and report.unrecorded == [], report
    ours.refresh()
    assert ours.status == TaskResultStatus.FAILED and len(ours.errors) == 1
    assert ours.errors[0].exception_class_path == "builtins.RuntimeError"
    assert "the started receiver broke" in ours.errors[0].traceback
    assert JobAttempt.objects.get(run_id=ours.id).ended_at is not None
    assert not log.exists(), "neither body ran"


def test_a_task_finished_receiver_that_raises_is_logged_and_neither_the_outcome_nor_the_drive_is_touched(caplog):
    """The ending write has committed: the task stands, the drive goes on, the next receivers still hear it."""
    heard = []

    def breaks(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise RuntimeError("the finished receiver broke")

    def hears(sender: Any, task_result: Any, **kwargs: Any) -> None:
        heard.append(task_result.status)

    _signals.task_finished.connect(breaks, weak=False, dispatch_uid="finished-raises")
    _signals.task_finished.connect(hears, weak=False, dispatch_uid="finished-hears")
    try:
        results = [t.add.enqueue(n, 1) for n in range(3)]
        with caplog.at_level("ERROR"):
            report = run_due_jobs()
    finally:
        _signals.task_finished.disconnect(dispatch_uid="finished-raises")
        _signals.task_finished.disconnect(dispatch_uid="finished-hears")
    assert report.completed == 3 and report.unrecorded == [], report
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert heard == [TaskResultStatus.SUCCESSFUL] * 3
    assert caplog.text.count("the finished receiver broke") >= 3, caplog.text


@pytest.mark.parametrize("task, args", [(t.failing_value_error, ()), (t.add, (2, 3))], ids=["failed", "successful"])
def test_task_finished_carries_the_end_and_the_error_as_djangos_own_backend_sends_them(task, args):
    """A receiver of ``task_finished`` (error reporting, metrics) reads the attempt's end and, when it
    failed, its error, as ImmediateBackend gives them; ``once``: one attempt, so one signal."""

    def ours() -> None:
        task.using(backend="once").enqueue(*args)
        run_due_jobs()

    theirs = finished_as_signalled(lambda: task.using(backend="reference").enqueue(*args))
    assert finished_as_signalled(ours) == theirs
    assert theirs and theirs[0][1], "the reference's own result"


def test_a_retried_attempt_is_signalled_with_the_attempts_before_it_as_get_result_reads_them(tmp_path):
    """A receiver of the second attempt's signals reads two attempts, two workers and the first's error,
    as ``get_result`` does afterwards (the first attempt's signals read one of each)."""
    seen: list[tuple[str, Any, int, list[str], list[str]]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        errors = [error.exception_class_path for error in task_result.errors]
        signal = "finished" if task_result.finished_at else "started"
        seen.append((signal, task_result.status, task_result.attempts, list(task_result.worker_ids), errors))

    for signal in (_signals.task_started, _signals.task_finished):
        signal.connect(receiver, weak=False, dispatch_uid="attempts-as-signalled")
    try:
        result = t.flaky.enqueue(str(tmp_path / "log"), 1)
        assert run_due_jobs(holder="first").retrying == 1
        assert run_due_jobs(holder="second").completed == 1
    finally:
        for signal in (_signals.task_started, _signals.task_finished):
            signal.disconnect(dispatch_uid="attempts-as-signalled")
    result.refresh()
    assert result.worker_ids == ["first", "second"]
    failed, successful = TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL
    down = ["builtins.ConnectionError"]
    assert seen == [
        ("started", TaskResultStatus.RUNNING, 1, ["first"], []),
        ("finished", failed, 1, ["first"], down),
        ("started", TaskResultStatus.RUNNING, 2, ["first", "second"], down),
        ("finished", successful, 2, ["first", "second"], down),
    ]
    assert seen[-1][2:] == (result.attempts, result.worker_ids, [e.exception_class_path for e in result.errors])


def test_a_task_that_leaves_its_transaction_open_fails_at_once_with_that_error_and_the_next_task_commits():
    left = t.leaves_autocommit_off.enqueue()
    t.add.enqueue(2, 3)
    seen = finished_as_signalled(run_due_jobs)
    connection.close()  # what was not committed is gone: read what is durable
    result = task_backends["default"].get_result(left.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1  # not retried: it would again
    assert [e.exception_class_path for e in result.errors] == ["django_jobruns.exceptions.TransactionLeftOpen"]
    assert JobAttempt.objects.get(run_id=left.id).error_class == "django_jobruns.exceptions.TransactionLeftOpen"
    assert sorted(status for status, *_ in seen) == [TaskResultStatus.FAILED, TaskResultStatus.SUCCESSFUL]
    assert JobRun.objects.filter(module=TASKS_MODULE, status=Status.DONE).count() == 1


@pytest.mark.parametrize(
    "task, args, error",
    [(t.exits, (3,), "builtins.SystemExit"), (t.cancelled, (), "asyncio.exceptions.CancelledError")],
    ids=["sys.exit", "CancelledError"],
)
def test_a_task_that_exits_fails_as_djangos_own_backend_fails_it_and_the_worker_goes_on(task, args, error):
    """Django's backends fail such a task and go on (only KeyboardInterrupt stops them): one task's
    ``sys.exit`` must not stop the worker, and so every worker that takes it, once per attempt."""
    theirs = reference(task, *args)
    assert theirs.status == TaskResultStatus.FAILED and theirs.errors[-1].exception_class_path == error
    ours = task.using(backend="once").enqueue(*args)
    behind = t.add.enqueue(2, 3)
    report = run_due_jobs(limit=5)  # does not raise
    assert (report.failed, report.completed) == (1, 1), report
    ours.refresh()
    assert ours.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in ours.errors] == [e.exception_class_path for e in theirs.errors]
    assert task_backends["default"].get_result(behind.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_interrupted_by_ctrl_c_stops_the_worker_as_djangos_own_backend_lets_it_with_its_attempt_recorded():
    with pytest.raises(KeyboardInterrupt):
        reference(t.interrupted)
    ours = t.interrupted.using(backend="once").enqueue()
    with pytest.raises(KeyboardInterrupt):
        run_due_jobs()
    ours.refresh()
    assert ours.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in ours.errors] == ["builtins.KeyboardInterrupt"]
    assert JobRun.objects.get(pk=ours.id).lease_holder is None


def test_a_worker_that_lost_its_lease_records_and_signals_nothing():
    finished: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result.status)

    _signals.task_finished.connect(receiver, weak=False, dispatch_uid="lost-lease")
    try:
        result = t.loses_its_lease.enqueue()
        report = run_due_jobs()
    finally:
        _signals.task_finished.disconnect(dispatch_uid="lost-lease")
    assert report.lost == 1
    assert finished == []
    attempt = JobAttempt.objects.get(run_id=result.id)
    assert attempt.ended_at is None and attempt.error_class is None  # nothing written after the takeover


def test_an_async_task_records_its_steps_with_astep_and_step_names_astep(tmp_path):
    log = tmp_path / "log"
    result: Any = t.async_steps.enqueue(str(log))
    assert run_due_jobs().completed == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == ["fetched", 2]
    assert log.read_text().splitlines() == ["fetch", "save"]
    wrong = t.sync_step_in_async.enqueue()
    run_due_jobs()
    wrong.refresh()
    assert wrong.status in (TaskResultStatus.READY, TaskResultStatus.FAILED)
    assert "astep" in JobRun.objects.get(pk=wrong.id).last_error


def test_a_task_the_worker_cannot_import_is_stepped_over_named_and_run_once_it_can(caplog):
    broken = t.add.enqueue(1, 1)
    run = JobRun.objects.get(pk=broken.id)
    payload = json.loads(run.payload)
    payload["task"] = "tests.support.task_functions.added_by_the_next_release"
    JobRun.objects.filter(pk=run.pk).update(payload=json.dumps(payload))
    behind = t.add.enqueue(2, 2)
    report = run_due_jobs(limit=5)
    assert report.completed == 1 and report.failed == 0 and report.retrying == 0
    assert report.unregistered == 1
    assert report.as_dict()["unregistered_jobs"] == {"tests.support.task_functions.added_by_the_next_release": 1}
    assert "added_by_the_next_release" in caplog.text
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.attempts == 0 and run.lease_holder is None
    assert run.last_warning.startswith("job not registered")
    assert not JobAttempt.objects.filter(run_id=run.pk).exists(), "the record begun with the claim is removed"
    assert task_backends["default"].get_result(behind.id).return_value == 4
    # The release that brings the function: the run is driven as usual.
    t.added_by_the_next_release = t.add  # type: ignore[attr-defined]
    try:
        assert run_due_jobs().completed == 1
    finally:
        del t.added_by_the_next_release  # type: ignore[attr-defined]
    assert task_backends["default"].get_result(broken.id).return_value == 2


def test_get_result_refuses_what_is_not_a_run_id_on_every_database():
    result = t.add.enqueue(1, 2)
    for bad in ["\x00" * 26, result.id.lower(), result.id[:-1] + "!"]:
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(bad)


def test_task_enqueued_is_sent_when_the_enqueue_commits():
    sent: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result.id)

    _signals.task_enqueued.connect(receiver, weak=False, dispatch_uid="on-commit")
    try:
        with transaction.atomic():
            t.noop_task.enqueue()
            assert sent == []
            transaction.set_rollback(True)
        assert sent == []
        kept = t.noop_task.enqueue()
    finally:
        _signals.task_enqueued.disconnect(dispatch_uid="on-commit")
    assert sent == [kept.id]


def test_checks_name_unknown_options_and_bad_durations_without_a_traceback():
    from django_jobruns.registry import unregister

    backend = JobRunsBackend(
        "checked", {"OPTIONS": {"RETRIES": 3, "LEASE_TTL": float("inf"), "TIMEOUT": 1, "RETRY": "x"}}
    )
    try:
        found = {message.id: message.msg for message in backend.check()}
    finally:
        unregister(f"{TASKS_MODULE}.checked")
    assert "'RETRIES'" in found["jobruns.E013"] and "RETRY, LEASE_TTL, TIMEOUT" in found["jobruns.E013"]
    assert set(found) == {"jobruns.E011", "jobruns.E012", "jobruns.E013"}


@pytest.mark.parametrize(
    "name, why",
    [("q" * 101, "longer than the 100 characters"), ("mail\x00", "NUL"), ("mail\udcff", "lone surrogate")],
)
def test_a_queue_name_no_database_holds_is_refused_where_the_task_is_made_not_by_the_insert(name, why):
    """With ``QUEUES: []`` Django takes any queue name; the insert on PostgreSQL and MariaDB did not."""
    from django_jobruns.registry import unregister

    def on_queue(queue_name: str) -> Any:
        """``t.noop_task`` on another queue, unchecked: ``.using()`` would check it against the default backend."""
        task = copy.copy(t.noop_task)
        object.__setattr__(task, "queue_name", queue_name)
        return task

    backend = JobRunsBackend("any_queue", {"QUEUES": [], "OPTIONS": {}})
    try:
        backend.validate_task(on_queue("q" * 100))  # as long as the column holds
        with pytest.raises(InvalidTask, match=why) as refused:
            backend.validate_task(on_queue(name))
        assert "queue_name" in str(refused.value)
        assert JobRun.objects.count() == 0
        checked = {
            message.id: message.msg for message in JobRunsBackend("any_queue", {"QUEUES": ["default", name]}).check()
        }
        assert why in checked["jobruns.E014"] and "QUEUES" in checked["jobruns.E014"]
    finally:
        unregister(f"{TASKS_MODULE}.any_queue")


def test_a_backend_alias_longer_than_the_database_holds_is_a_check_error():
    from django_jobruns.registry import unregister

    alias = "a" * 101
    try:
        found = {message.id: message.msg for message in JobRunsBackend(alias, {}).check()}
    finally:
        unregister(f"{TASKS_MODULE}.{alias}")
    assert "longer than the 100 characters" in found["jobruns.E014"]


@pytest.mark.slow
def test_the_backend_named_without_the_app_installed_is_a_check_error_not_a_traceback(tmp_path):
    settings = tmp_path / "noapp_settings.py"
    settings.write_text(
        "SECRET_KEY = 'x'\nINSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth']\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}\n"
        "TASKS = {'default': {'BACKEND': 'django_jobruns.backend.JobRunsBackend', 'QUEUES': ['default', 'emails']}}\n"
        f"INSTALLED_APPS += {['django_tasks'] if not importlib.util.find_spec('django.tasks') else []}\n"
    )
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "noapp_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    # As a project's code would: its tasks module is imported (a view, a urlconf), then a command runs.
    script = (
        "import django; django.setup(); import tests.support.task_functions; "
        "from django.core.management import execute_from_command_line; execute_from_command_line(['manage', 'check'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "jobruns.E010" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_on_django_5_2_the_backends_checks_run_without_the_backport_installed_as_an_app(tmp_path):
    settings = tmp_path / "nobackport_settings.py"
    settings.write_text(
        "from tests.support.settings import *\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'django_tasks']\n"
        "TASKS = {'default': {'BACKEND': 'django_jobruns.backend.JobRunsBackend', 'OPTIONS': {'LEASE_TTL': 1}}}\n"
    )
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "nobackport_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, str(Path(ROOT) / "manage.py"), "check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "jobruns.E012" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_queue_names_are_checked_against_the_backends_queues_and_star_means_every_queue():
    email = t.send_email.enqueue("a@example.com")
    with pytest.raises(InvalidDriveOptions, match=r"emaisl.*known: default, emails"):
        run_due_jobs(queues=["emaisl"])
    report = run_due_jobs(queues=["*"])
    assert report.completed == 1
    assert task_backends["default"].get_result(email.id).status == TaskResultStatus.SUCCESSFUL


def test_operators_find_and_read_a_task_by_its_path(caplog):
    from io import StringIO

    from django.core.management import call_command

    from django_jobruns import job_runs

    ok = t.flaky.enqueue("/nonexistent/dir/log", 0)  # fails: the log cannot be opened
    done = t.send_email.enqueue("a@example.com")
    report = run_due_jobs(limit=5)
    assert "tests.support.task_functions.flaky" in caplog.text  # the log names the task, not the internal job
    assert report.as_dict()["runs"] == {ok.id: "tests.support.task_functions.flaky"}  # --json names it too
    assert [r.id for r in job_runs(job="tests.support.task_functions.send_email")] == [done.id]
    out = StringIO()
    call_command("job_runs", "--job", "tests.support.task_functions.flaky", stdout=out)
    assert ok.id in out.getvalue() and done.id not in out.getvalue()
    assert "tests.support.task_functions.flaky" in out.getvalue()
    out = StringIO()
    call_command("job_runs", done.id, stdout=out)
    shown = out.getvalue()
    assert "task: tests.support.task_functions.send_email" in shown and "return_value: sent to a@example.com" in shown
    assert "queue: emails" in shown and "priority: 10" in shown and "attempts: 1" in shown
    assert "cursor:" not in shown


def test_a_task_of_a_backend_removed_from_tasks_is_named_with_the_tasks_setting_not_jobs_py(caplog):
    """A TASKS alias removed by a deploy: its tasks wait, and the warning says what is missing (TASKS), not jobs.py."""
    stranded = t.add.enqueue(1, 1)
    JobRun.objects.filter(pk=stranded.id).update(job="retired")  # enqueued on an alias this process lacks
    with caplog.at_level("WARNING", logger="django_jobruns"):
        report = run_due_jobs()
    assert report.unregistered == 1 and report.failed == 0
    said = [r.getMessage() for r in caplog.records if "retired" in r.getMessage()]
    assert said and "TASKS" in said[0] and "jobs.py" not in said[0], said
    warning = JobRun.objects.get(pk=stranded.id).last_warning
    assert "'retired'" in warning and "TASKS setting" in warning and "jobs.py" not in warning, warning


def test_a_task_abandoned_by_its_takeover_keeps_only_the_dead_workers_attempt():
    """A takeover that spends the policy fails the task unrun: the record its claim began goes with it."""
    from django.utils import timezone

    result = t.add.using(backend="once").enqueue(1, 2)  # max_attempts=1
    now = timezone.now()
    JobRun.objects.filter(pk=result.id).update(
        lease_holder="dead-host:1:ab", lease_expires_at=now - timedelta(minutes=1), lease_fence=1
    )
    JobAttempt.objects.create(run_id=result.id, number=1, holder="dead-host:1:ab", started_at=now)
    report = run_due_jobs()
    assert report.failed == 1 and report.taken_over == 1, report
    assert list(JobAttempt.objects.filter(run_id=result.id).values_list("holder", flat=True)) == ["dead-host:1:ab"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.errors, result.errors


def test_an_attempt_whose_error_text_the_database_cannot_hold_is_recorded_escaped_and_its_task_fails_once(tmp_path):
    """P9 for a task's attempt record: PostgreSQL refused the NUL, so the pass was never recorded, the body
    ran at every drive and the task read as never reporting."""
    log = tmp_path / "log"
    result = t.raises_unstorable_text.using(backend="once").enqueue(str(log))
    report = run_due_jobs()
    assert report.failed == 1 and report.unrecorded == [], report
    assert run_due_jobs().attempted == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and log.read_text() == "ran\n"
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert "ValueError: the payload held \\x00 and \\ud800" in error.traceback, error.traceback[-200:]


def test_an_attempt_whose_error_carries_megabytes_is_recorded_with_its_traceback_cut_in_the_middle(tmp_path):
    """On MariaDB the attempt's record was larger than the server's packet: the pass was never recorded and
    a task allowed one attempt ran at every drive."""
    log = tmp_path / "log"
    result = t.raises_a_whole_body.using(backend="once").enqueue(str(log))
    report = run_due_jobs()
    assert report.failed == 1 and report.unrecorded == [], report.unrecorded
    assert run_due_jobs().attempted == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and log.read_text() == "ran\n", "once"
    [error] = result.errors
    assert len(error.traceback) <= 10_000 and error.traceback.startswith("Traceback (most recent call last):")
    assert "characters cut ...]" in error.traceback and error.traceback.endswith("x</html>\n")
