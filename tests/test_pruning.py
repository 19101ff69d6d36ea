"""Retention: ``prune_job_runs`` (the command and the function), in bounded batches, finished runs only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, JobStep, Status
from tests.conftest import ROOT, call


def _finished(instance, status, days_ago):
    run, _ = start_job_run("tests.walk", instance=instance)
    ended = timezone.now() - timedelta(days=days_ago)
    JobRun.objects.filter(pk=run.pk).update(status=status, live=None, ended_at=ended)
    return run


@pytest.mark.django_db
def test_prune_deletes_only_old_finished_runs_in_batches():
    old_done = [_finished(f"d{i}", Status.DONE, 40) for i in range(5)]
    old_failed = _finished("f", Status.FAILED, 40)
    JobStep.objects.create(run=old_failed, step="s", result=None, attempts=1, recorded_at=timezone.now())
    recent = _finished("recent", Status.DONE, 1)
    live, _ = start_job_run("tests.walk", instance="live")
    JobRun.objects.filter(pk=live.pk).update(started_at=timezone.now() - timedelta(days=100))
    restarted, _ = start_job_run("tests.walk", instance="f")
    JobRun.objects.filter(pk=restarted.pk).update(restarted_from=old_failed)

    assert call("prune_job_runs", "--older-than", "30", "--dry-run") == (
        "would delete 6 finished run(s) older than 30 day(s)"
    )
    assert JobRun.objects.count() == 9
    assert call("prune_job_runs", "--older-than", "30", "--status", "failed") == (
        "deleted 1 finished run(s) older than 30 day(s)"
    )
    with CaptureQueriesContext(connection) as ctx:
        out = call("prune_job_runs", "--older-than", "30", "--batch-size", "2")
    assert out == "deleted 5 finished run(s) older than 30 day(s)"
    deletes = [
        q
        for q in ctx.captured_queries
        if (q["sql"].startswith("DELETE FROM") and "django_jobruns_jobrun" in q["sql"].split("WHERE")[0])
        or q["sql"].startswith("WITH batch")
    ]  # PostgreSQL: one statement per batch
    done_batches = [q for q in deletes if "done" in q["sql"]]  # one prune per status: done's are these
    assert len(done_batches) == 3, "five runs deleted two at a time"
    assert not JobStep.objects.filter(run=old_failed).exists()
    assert set(JobRun.objects.values_list("pk", flat=True)) == {recent.pk, live.pk, restarted.pk}
    restarted.refresh_from_db()
    assert restarted.restarted_from_id is None and not JobStep.objects.exists()
    assert all(not JobRun.objects.filter(pk=r.pk).exists() for r in old_done)


@pytest.mark.django_db
def test_prune_deletes_a_run_and_the_restart_of_it_in_one_batch():
    first = _finished("lineage", Status.FAILED, 40)
    second = _finished("lineage", Status.FAILED, 40)
    JobRun.objects.filter(pk=second.pk).update(restarted_from=first)
    third = _finished("lineage", Status.FAILED, 1)  # recent: kept, its link to a pruned run cleared
    JobRun.objects.filter(pk=third.pk).update(restarted_from=second)
    assert call("prune_job_runs", "--older-than", "30") == "deleted 2 finished run(s) older than 30 day(s)"
    assert list(JobRun.objects.values_list("pk", "restarted_from")) == [(third.pk, None)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--older-than", "-1"], "expected a number of days >= 0"),
        (["--older-than", "soon"], "expected a number of days, got 'soon'"),
        (["--older-than", "1e10"], "expected at most 36500 days"),
        (["--older-than", "3", "--batch-size", "0"], "expected a batch size from 1 to 100000"),
        (["--older-than", "3", "--status", "running"], "invalid choice: 'running'"),
        ([], "--older-than DAYS is required"),
        (["--status", "failed=30", "--status", "done"], "--status done has no age"),
        (["--status", "failed=-2"], "expected a number of days >= 0"),
    ],
)
def test_prune_refuses_bad_ages_and_live_statuses(args, message):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "prune_job_runs", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.django_db
def test_prune_keeps_failures_longer_than_successes_and_reports_json():
    for i in range(3):
        _finished(f"done-old{i}", Status.DONE, 10)
    _finished("done-new", Status.DONE, 2)
    kept_failure = _finished("failed-10", Status.FAILED, 10)
    _finished("failed-old", Status.FAILED, 100)
    _finished("cancelled-old", Status.CANCELLED, 100)
    out = call("prune_job_runs", "--status", "done=7", "--status", "failed=90", "--status", "cancelled=30", "--json")
    summary = json.loads(out)
    assert summary["deleted"] == 5 and summary["by_status"] == {"done": 3, "failed": 1, "cancelled": 1}
    assert summary["older_than_days"] == {"done": 7, "failed": 90, "cancelled": 30} and summary["dry_run"] is False
    assert set(JobRun.objects.values_list("instance", flat=True)) == {"done-new", "failed-10"}
    assert JobRun.objects.filter(pk=kept_failure.pk).exists()
    assert call("prune_job_runs", "--status", "failed=200", "--status", "done=1") == (
        "deleted 1 finished run(s): failed 0 (older than 200 day(s)), done 1 (older than 1 day(s))"
    )


@pytest.mark.django_db
def test_prune_shows_progress_while_it_runs():
    for i in range(5):
        _finished(f"p{i}", Status.DONE, 40)
    out, err = StringIO(), StringIO()
    call_command("prune_job_runs", "--older-than", "30", "--batch-size", "2", stdout=out, stderr=err)
    lines = err.getvalue().splitlines()
    assert [line.split(" run(s)")[0] for line in lines] == ["… 2", "… 4", "… 5"]
    assert out.getvalue().strip() == "deleted 5 finished run(s) older than 30 day(s)"


@pytest.mark.django_db
def test_prune_json_has_the_same_keys_on_a_dry_run():
    _finished("old", Status.DONE, 10)
    dry = json.loads(call("prune_job_runs", "--older-than", "7", "--json", "--dry-run"))
    real = json.loads(call("prune_job_runs", "--older-than", "7", "--json"))
    assert set(dry) == set(real) and dry["dry_run"] is True and dry["deleted"] == real["deleted"] == 1


@pytest.mark.django_db
def test_a_status_with_its_own_age_keeps_the_other_finished_statuses_at_older_than():
    """``--older-than 7 --status failed=90`` reads "7 days, but 90 for failures": done and cancelled at 7."""
    _finished("done-8", Status.DONE, 8)
    _finished("failed-8", Status.FAILED, 8)
    _finished("failed-91", Status.FAILED, 91)
    _finished("cancelled-8", Status.CANCELLED, 8)
    out = call("prune_job_runs", "--older-than", "7", "--status", "failed=90")
    assert out == (
        "deleted 3 finished run(s): failed 1 (older than 90 day(s)), done 1 (older than 7 day(s)), "
        "cancelled 1 (older than 7 day(s))"
    )
    assert list(JobRun.objects.values_list("instance", flat=True)) == ["failed-8"]


@pytest.mark.django_db
def test_a_bare_status_limits_the_prune_to_the_statuses_named():
    _finished("done-8", Status.DONE, 8)
    _finished("failed-91", Status.FAILED, 91)
    _finished("cancelled-8", Status.CANCELLED, 8)
    summary = json.loads(
        call("prune_job_runs", "--older-than", "7", "--status", "failed=90", "--status", "done", "--json")
    )
    assert summary["older_than_days"] == {"failed": 90, "done": 7}
    assert list(JobRun.objects.values_list("instance", flat=True)) == ["cancelled-8"]
