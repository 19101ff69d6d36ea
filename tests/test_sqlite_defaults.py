"""The embedded default, as `startproject` writes it: DEFERRED transactions, a 5 s timeout, the rollback journal.

These run when the suite runs with ``JOBRUNS_SQLITE_DEFAULTS=1`` (CI does), which
gives the test database exactly those settings. Effects are counted in a log
the step bodies append to, independently of the engine's records.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from django.db import connection, connections

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import JobRun, Status
from tests.conftest import effect_lines, manage

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'sqlite' or connection.settings_dict['OPTIONS'].get('transaction_mode')",
        reason="needs SQLite with the default settings (JOBRUNS_SQLITE_DEFAULTS=1)",
    ),
]

RUNS, PASSES, STEPS = 12, 4, 3


def start_runs(effects):
    for i in range(RUNS):
        start_job_run("tests.walk", instance=f"d{i}", payload={"log": str(effects), "passes": PASSES, "steps": STEPS})


def assert_every_step_ran_once_and_no_run_was_charged(effects):
    with connection.cursor() as cur:
        cur.execute("PRAGMA journal_mode")
        assert cur.fetchone()[0] == "delete", "the default rollback journal"
    runs = list(JobRun.objects.all())
    assert [r.status for r in runs] == [Status.DONE] * RUNS
    assert all(r.attempts == 0 and r.last_error is None for r in runs), [r.last_error for r in runs]
    lines = effect_lines(effects)
    assert len(lines) == RUNS * PASSES * STEPS
    assert [key for key, n in Counter(lines).items() if n > 1] == []


def test_threads_of_one_drive_on_default_sqlite_never_fail_a_pass_on_the_lock(effects):
    start_runs(effects)
    reports = []

    def drive():
        try:
            for _ in range(PASSES * 3):
                reports.append(run_due_jobs(concurrency=4, max_passes=2))
                if not JobRun.objects.filter(status=Status.RUNNING).exists():
                    break
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drive) for _ in range(2)]  # two overlapping drives, four threads each
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.retrying + r.failed for r in reports) == 0
    assert all(r.unrecorded == [] for r in reports), [r.unrecorded for r in reports]
    assert_every_step_ran_once_and_no_run_was_charged(effects)


@pytest.mark.slow
def test_overlapping_worker_processes_on_default_sqlite_never_fail_a_pass_on_the_lock(effects):
    start_runs(effects)
    env = {"JOBRUNS_SQLITE_DEFAULTS": "1"}
    for _round in range(PASSES * 3):
        workers = [
            manage("run_due_jobs", "--concurrency", "4", "--max-passes", "2", "--json", extra_env=env) for _ in range(3)
        ]
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err
            report = json.loads(out)
            assert report["retrying"] == report["failed"] == 0 and report["unrecorded"] == [], report
        if not JobRun.objects.filter(status=Status.RUNNING).exists():
            break
    assert_every_step_ran_once_and_no_run_was_charged(effects)
