"""``JobRun.due_at``: when a run became due, said once (D9, D1).

Live runs take turns; the health lag is counted from when a run became due; a
drive limited to some queues or jobs asks the database for those only; the
migration fills the live runs of a table that had none.
"""

from __future__ import annotations

import importlib
import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import TASKS_MODULE, JobRun, Status
from tests.support import task_functions as t

pytestmark = pytest.mark.django_db(transaction=True)


def test_live_runs_take_turns_a_run_that_committed_queues_behind_the_waiting(behaviour):
    """Three live walks, two slots per drive: every one of them gets passes (none waits for the others to end)."""
    passes: list[str] = []

    def walk(p: Any) -> dict[str, Any]:
        passes.append(p.run.instance)
        return {"cursor": (p.cursor or 0) + 1}  # never done: a long walk

    for name in ("a", "b", "c"):
        behaviour[name] = walk
        start_job_run("tests.scripted", instance=name)
    for _ in range(10):
        run_due_jobs(limit=2, max_passes=1)
    counts = {name: passes.count(name) for name in "abc"}
    assert min(counts.values()) >= 6, counts  # 20 passes shared in turn: 7, 7, 6


def test_a_run_that_just_committed_is_due_from_then_and_one_backing_off_from_its_backoffs_end(behaviour, clock):
    behaviour["one"] = lambda p: {"cursor": 1}
    run, _ = start_job_run("tests.scripted", instance="one")
    run_due_jobs(now=clock)
    run.refresh_from_db()
    assert run.due_at == clock.now
    behaviour["one"] = lambda p: 1 / 0
    clock.advance(minutes=1)
    run_due_jobs(now=clock)
    run.refresh_from_db()
    assert run.next_attempt_at is not None and run.due_at == run.next_attempt_at > clock.now
    JobRun.objects.filter(pk=run.pk).update(next_attempt_at=clock.now, due_at=clock.now)
    behaviour["one"] = lambda p: {"done": True}
    run_due_jobs(now=clock)
    run.refresh_from_db()
    assert run.status == Status.DONE and run.due_at is None


def health(*args: str) -> int:
    try:
        call_command("job_runs", "--health", *args, stdout=StringIO(), stderr=StringIO())
    except Exception:
        return 1
    return 0


def test_a_busy_healthy_system_is_healthy_whatever_the_age_of_its_runs(behaviour):
    """A run driven a moment ago is not late, though it started long before --max-lag."""
    behaviour["old"] = lambda p: {"cursor": (p.cursor or 0) + 1}
    run, _ = start_job_run("tests.scripted", instance="old")
    long_ago = timezone.now() - timedelta(hours=2)
    JobRun.objects.filter(pk=run.pk).update(started_at=long_ago, due_at=long_ago)
    assert health("--max-lag", "60") == 1  # waiting since two hours: a drive is missing
    run_due_jobs()  # driven: due again from now
    assert health("--max-lag", "60") == 0


def _backlog(count: int, queue: str) -> None:
    """``count`` due tasks of ``queue``, inserted at once, due before anything started after them."""
    now = timezone.now() - timedelta(minutes=1)
    payload = json.dumps(
        {"task": "tests.support.task_functions.noop_task", "args": [], "kwargs": {}}, separators=(",", ":")
    )
    JobRun.objects.bulk_create(
        [
            JobRun(
                id=f"0{i:025d}",
                module=TASKS_MODULE,
                job="default",
                instance=f"0{i:025d}",
                payload=payload,
                started_at=now,
                updated_at=now,
                due_at=now,
                queue_name=queue,
            )
            for i in range(count)
        ]
    )


def test_a_worker_of_one_queue_runs_its_tasks_behind_any_backlog_of_others():
    _backlog(600, "default")
    emails = [t.send_email.enqueue(f"{n}@example.com") for n in range(3)]
    report = run_due_jobs(queues=["emails"])
    assert report.completed == 3, report
    for result in emails:
        result.refresh()
        assert result.status == "SUCCESSFUL"


def test_a_drive_limited_to_one_job_runs_it_behind_any_backlog_of_others(behaviour):
    _backlog(600, "default")
    behaviour["mine"] = lambda p: {"done": True}
    start_job_run("tests.scripted", instance="mine")
    report = run_due_jobs(jobs=["tests.scripted"])
    assert report.completed == 1, report


def test_the_migration_fills_the_live_runs_and_leaves_the_finished_ones(behaviour, clock):
    fill = importlib.import_module("django_jobruns.migrations.0017_due_at").fill
    live, _ = start_job_run("tests.walk", instance="live")
    backing, _ = start_job_run("tests.walk", instance="backing")
    ended, _ = start_job_run("tests.walk", instance="ended")
    later = timezone.now() + timedelta(hours=1)
    JobRun.objects.filter(pk=backing.pk).update(next_attempt_at=later)
    JobRun.objects.filter(pk=ended.pk).update(status=Status.DONE, live=None, ended_at=timezone.now())
    JobRun.objects.update(due_at=None)  # as the column was added: empty

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection  # type: ignore[attr-defined]
    fill(None, editor)
    live.refresh_from_db()
    backing.refresh_from_db()
    ended.refresh_from_db()
    assert live.due_at == live.updated_at
    assert backing.due_at == later
    assert ended.due_at is None


@pytest.mark.parametrize(
    "word, python",
    [
        ("leased", lambda run, now: run.is_leased(now)),
        ("lapsed", lambda run, now: run.is_lapsed(now)),
        ("backing_off", lambda run, now: run.is_backing_off(now)),
        ("paused", lambda run, now: run.is_paused),
        ("marked_unregistered", lambda run, now: run.is_marked_unregistered),
        ("due", lambda run, now: run.is_due(now)),
    ],
)
def test_each_state_word_is_one_rule_in_python_and_the_orm(word, python, clock):
    """Every state word once: the QuerySet method and its Python twin on JobRun find the same runs."""
    now = clock.now
    runs = [start_job_run("tests.walk", instance=f"s{i}")[0] for i in range(9)]
    later, earlier = now + timedelta(minutes=5), now - timedelta(minutes=5)
    JobRun.objects.filter(pk=runs[1].pk).update(lease_holder="h", lease_expires_at=later, lease_fence=1)
    JobRun.objects.filter(pk=runs[2].pk).update(lease_holder="h", lease_expires_at=earlier, lease_fence=1)
    JobRun.objects.filter(pk=runs[3].pk).update(next_attempt_at=later, due_at=later)
    JobRun.objects.filter(pk=runs[4].pk).update(next_attempt_at=earlier, due_at=earlier)
    JobRun.objects.filter(pk=runs[5].pk).update(paused_at=earlier)
    JobRun.objects.filter(pk=runs[6].pk).update(last_warning="job not registered in the process that drove it")
    JobRun.objects.filter(pk=runs[7].pk).update(
        status=Status.DONE, live=None, ended_at=now, lease_holder="h", lease_expires_at=later, due_at=None
    )
    JobRun.objects.filter(pk=runs[8].pk).update(last_warning="pass committed with completed steps it never asked for")
    method = getattr(JobRun.objects, word)
    orm = set((method(now) if word not in ("paused", "marked_unregistered") else method()).values_list("pk", flat=True))
    assert orm == {run.pk for run in JobRun.objects.all() if python(run, now)}
    assert orm, f"the fixture has runs that are {word}"
