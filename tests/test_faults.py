"""Faults beyond kills: a terminated connection, a paused worker (SIGSTOP), a missing database."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import JobRun, JobStep, Status
from tests.conftest import Clock, effect_lines, manage

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def blocking_run(tmp_path, effects, instance):
    entered, release = tmp_path / "entered.fifo", tmp_path / "release.fifo"
    os.mkfifo(entered)
    os.mkfifo(release)
    run, _ = start_job_run(
        "tests.blocking",
        instance=instance,
        payload={
            "log": str(effects),
            "fifo": str(entered),
            "release": str(release),
            "marker": str(tmp_path / "marker"),
        },
    )
    return run, entered, release


@pytest.mark.skipif(
    "os.environ.get('DATABASE_URL', '').split(':')[0] not in ('postgres', 'postgresql')",
    reason="pg_terminate_backend is PostgreSQL's",
)
def test_connection_terminated_mid_pass_is_reported_and_the_run_is_intact(tmp_path, effects):
    run, entered, release = blocking_run(tmp_path, effects, "terminated")
    worker = manage("run_due_jobs", extra_env={"PGAPPNAME": "jobruns-victim"})
    with open(entered) as fifo:
        assert int(fifo.readline()) == worker.pid
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", ["jobruns-victim"]
        )
        assert cur.fetchall() == [(True,)]
    with open(release, "w"):
        pass
    out, err = worker.communicate(timeout=60)
    # The step's record failed with the connection: the engine's own
    # bookkeeping, not the job, so no attempt is charged. Django replaced the
    # connection, the lease was given back on the new one, and the command
    # says the pass went unrecorded (exit 1, for the scheduler to surface).
    assert worker.returncode == 1, err
    assert out.startswith("attempted=1 advanced=0 completed=0 retrying=0 failed=0 ")
    # The driver's wording of a terminated connection varies with timing (the
    # server's message, or the closed socket found first); its class does not.
    unrecorded = re.search(rf"^run {run.id}: the pass could not be recorded: (\w+): (.*)$", err, re.M)
    assert unrecorded is not None, err
    assert unrecorded[1] in ("OperationalError", "InterfaceError"), err
    after = JobRun.objects.get(pk=run.pk)
    assert after.status == Status.RUNNING and after.cursor is None and after.attempts == 0
    assert after.last_error is None and after.next_attempt_at is None
    assert after.lease_holder is None
    assert JobStep.objects.get(run=run, step="before").result is not None
    report = run_due_jobs()
    assert report.completed == 1
    # "first" ran again (its memo never committed); "before" did not.
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "first": 2, "second": 1}


def test_worker_paused_past_its_lease_is_fenced_out(tmp_path, effects):
    run, entered, release = blocking_run(tmp_path, effects, "paused")
    worker = manage("run_due_jobs", "--json", "--lease-ttl", "60", "--holder", "paused-worker")
    with open(entered) as fifo:
        assert int(fifo.readline()) == worker.pid
    worker.send_signal(signal.SIGSTOP)
    try:
        held = JobRun.objects.get(pk=run.pk)
        # Another holder, whose clock is past the paused worker's lease, takes the run and finishes it.
        report = run_due_jobs(holder="rescuer", now=Clock(held.lease_expires_at + timedelta(seconds=1)))
        assert report.completed == 1
        finished = JobRun.objects.get(pk=run.pk)
    finally:
        worker.send_signal(signal.SIGCONT)
    with open(release, "w"):
        pass
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    paused = json.loads(out)
    assert paused["lost"] == 1 and paused["completed"] == 0 and paused["advanced"] == 0
    after = JobRun.objects.get(pk=run.pk)
    assert (after.status, after.cursor, after.counters, after.updated_at, after.lease_fence) == (
        finished.status,
        finished.cursor,
        finished.counters,
        finished.updated_at,
        finished.lease_fence,
    )
    assert json.loads(after.counters) == {"passes": 1}
    assert not JobStep.objects.filter(run=run).exists()
