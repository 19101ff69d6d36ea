"""Operators steer live runs: cancel, pause, unpause, retry now."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections

from django_jobruns import (
    cancel_job_run,
    pause_job_run,
    restart_job_run,
    retry_job_run_now,
    run_due_jobs,
    start_job_run,
    unpause_job_run,
)
from django_jobruns.exceptions import JobRunsError
from django_jobruns.models import JobRun, JobStep, Status
from django_jobruns.signals import run_cancelled
from tests import jobs
from tests.conftest import effect_lines

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_ends_a_live_run_frees_its_key_and_keeps_its_record(clock):
    def handler(p):
        p.step(f"s{p.cursor}", lambda: 1)
        if p.cursor == 1:
            p.step("fails", lambda: 1 / 0)
        return {"cursor": (p.cursor or 0) + 1}

    jobs.BEHAVIOUR["cancel"] = handler
    run, _ = start_job_run("tests.scripted", instance="cancel", payload={"a": 1})
    run_due_jobs(now=clock)
    clock.advance(hours=1)
    run_due_jobs(now=clock)  # fails in step "fails": the ledger holds "s1" and the failed step
    seen = []
    run_cancelled.connect(lambda sender, **kw: seen.append(kw), weak=False, dispatch_uid="t")
    try:
        cancelled = cancel_job_run(run, reason="upstream is deleting records")
    finally:
        run_cancelled.disconnect(dispatch_uid="t")
    before = JobRun.objects.get(pk=run.pk)
    assert cancelled.status == before.status == Status.CANCELLED
    assert before.ended_at is not None and before.live is None and before.lease_holder is None
    assert before.lease_fence == run.lease_fence + 3  # two claims, then the cancel
    assert before.cursor == "1" and "upstream is deleting records" in before.last_error
    assert set(JobStep.objects.filter(run=run).values_list("step", flat=True)) == {"s1", "fails"}
    assert seen and seen[0]["run_id"] == run.pk and seen[0]["reason"] == "upstream is deleting records"
    clock.advance(hours=1)
    assert run_due_jobs(now=clock).attempted == 0, "a cancelled run is never driven"
    fresh, created = start_job_run("tests.scripted", instance="cancel")
    assert created and fresh.pk != run.pk
    with pytest.raises(JobRunsError, match=f"run {run.pk} is cancelled; only a live run can be cancelled"):
        cancel_job_run(run)


def test_cancel_refuses_a_finished_run_and_an_unknown_one():
    jobs.BEHAVIOUR["done"] = lambda p: {"done": True}
    run, _ = start_job_run("tests.scripted", instance="done")
    run_due_jobs()
    with pytest.raises(JobRunsError, match="is done; only a live run can be cancelled"):
        cancel_job_run(run)
    with pytest.raises(JobRunsError, match="no run has the id"):
        cancel_job_run("01NOSUCHRUN")
    # An id no database holds is one no run has (PostgreSQL raised its DataError for the NUL).
    for verb in (cancel_job_run, pause_job_run, restart_job_run):
        with pytest.raises(JobRunsError, match="no run has the id"):
            verb(run.pk + "\x00")
    assert JobRun.objects.get(pk=run.pk).status == Status.DONE


def test_a_cancel_reason_any_text_is_recorded_escaped_where_a_database_cannot_hold_it():
    """An operator's reason pasted from anywhere (NUL: PostgreSQL refused it; a lone surrogate: every database)."""
    for number, reason in enumerate(["pasted \x00 from a dump", "half a pair " + chr(0xD800), "long " * 5000]):
        run, _ = start_job_run("tests.walk", instance=f"reason-{number}", payload={"log": "/dev/null"})
        cancel_job_run(run, reason=reason)
        row = JobRun.objects.get(pk=run.pk)
        assert row.status == Status.CANCELLED, reason[:30]
        assert row.last_error.startswith("cancelled: ") and len(row.last_error) <= 10_000
    assert [JobRun.objects.get(instance=f"reason-{n}").last_error[:30] for n in range(2)] == [
        "cancelled: pasted \\x00 from a ",
        "cancelled: half a pair \\ud800",
    ]


def test_cancel_fences_out_the_pass_in_flight_which_starts_no_further_step(effects):
    entered, release = threading.Event(), threading.Event()
    jobs.GATES["cancel-mid"] = (entered, release)
    run, _ = start_job_run("tests.blocking", instance="cancel-mid", payload={"log": str(effects)})
    reports = {}

    def worker():
        try:
            reports["a"] = run_due_jobs(holder="worker")
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert entered.wait(timeout=30)
        cancel_job_run(run, reason="stop")
    finally:
        release.set()
        thread.join(timeout=30)
        jobs.GATES.pop("cancel-mid", None)
    after = JobRun.objects.get(pk=run.pk)
    assert reports["a"].lost == 1 and reports["a"].completed == 0
    assert after.status == Status.CANCELLED and after.cursor is None and after.counters == "{}"
    # "first" ran (its record was refused); "second" never started.
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "first": 1}
    assert not JobStep.objects.filter(run=run, step="first").exists()


def test_a_paused_run_is_not_due_keeps_its_key_and_goes_on_where_it_stopped(clock):
    jobs.BEHAVIOUR["pause"] = lambda p: {"cursor": (p.cursor or 0) + 1, "done": p.cursor == 2}
    run, _ = start_job_run("tests.scripted", instance="pause")
    run_due_jobs(now=clock)
    paused = pause_job_run(run)
    assert paused.paused_at is not None and paused.status == Status.RUNNING
    assert pause_job_run(run).paused_at == paused.paused_at, "pausing twice changes nothing"
    assert run_due_jobs(now=clock).attempted == 0
    joined, created = start_job_run("tests.scripted", instance="pause")
    assert not created and joined.pk == run.pk
    unpaused = unpause_job_run(run)
    assert unpaused.paused_at is None
    report = run_due_jobs(now=clock, max_passes=5)
    after = JobRun.objects.get(pk=run.pk)
    assert report.completed == 1 and after.cursor == "3" and after.status == Status.DONE
    with pytest.raises(JobRunsError, match="only a live run can be paused"):
        pause_job_run(run)
    with pytest.raises(JobRunsError, match="only a live run can be unpaused"):
        unpause_job_run(run)


def test_a_pass_in_flight_when_paused_finishes_and_the_drive_takes_no_further_pass(clock):
    def handler(p):
        if p.cursor is None:
            pause_job_run(p.run.id)  # an operator, at this moment
        return {"cursor": (p.cursor or 0) + 1}

    jobs.BEHAVIOUR["pause-mid"] = handler
    run, _ = start_job_run("tests.scripted", instance="pause-mid")
    report = run_due_jobs(now=clock, max_passes=5)
    after = JobRun.objects.get(pk=run.pk)
    assert report.advanced == 1 and after.cursor == "1" and after.paused_at is not None
    assert after.lease_holder is None, "the drive gave the paused run back"


def test_retry_now_skips_the_backoff(clock):
    calls = []

    def handler(p):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("upstream down")
        return {"done": True}

    jobs.BEHAVIOUR["retry-now"] = handler
    run, _ = start_job_run("tests.scripted", instance="retry-now")
    assert run_due_jobs(now=clock).retrying == 1
    assert run_due_jobs(now=clock).attempted == 0, "waiting out its backoff"
    assert retry_job_run_now(run).next_attempt_at is None
    assert run_due_jobs(now=clock).completed == 1
    with pytest.raises(JobRunsError, match="only a live run can be retried"):
        retry_job_run_now(run)


def test_a_pause_landing_in_the_last_pass_leaves_no_done_run_marked_paused(clock):
    def handler(p):
        pause_job_run(p.run.id)  # an operator pauses while the last pass runs
        return {"done": True}

    jobs.BEHAVIOUR["paused-last"] = handler
    run, _ = start_job_run("tests.scripted", instance="paused-last")
    assert run_due_jobs(now=clock).completed == 1
    run.refresh_from_db()
    assert run.status == Status.DONE and run.paused_at is None
