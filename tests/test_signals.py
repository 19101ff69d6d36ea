"""Signals: pass_committed, run_completed, run_failed — sent after the commit."""

from __future__ import annotations

import pytest

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import JobRun, Status
from django_jobruns.signals import pass_committed, run_completed, run_failed


@pytest.fixture
def received():
    events = []

    def make(name):
        def receiver(sender, **kwargs):
            # Sent after the commit: the row already says what the signal reports.
            status = JobRun.objects.get(pk=kwargs["run_id"]).status
            events.append((name, status, kwargs))

        return receiver

    receivers = {pass_committed: make("pass"), run_completed: make("completed"), run_failed: make("failed")}
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    yield events
    for signal, receiver in receivers.items():
        signal.disconnect(receiver)


@pytest.mark.django_db(transaction=True)
def test_signals_report_passes_completion_and_failure(behaviour, clock, received):
    behaviour["ok"] = lambda p: (p.count("items", 2), {"cursor": (p.cursor or 0) + 1, "done": p.cursor == 1})[1]
    behaviour["bad"] = lambda p: (_ for _ in ()).throw(RuntimeError("provider down"))
    ok, _ = start_job_run("tests.scripted", instance="ok")
    bad, _ = start_job_run("tests.scripted", instance="bad")
    for _ in range(3):
        run_due_jobs(now=clock)
        clock.advance(hours=2)
    names = [(name, kwargs["run_id"]) for name, _, kwargs in received]
    assert names.count(("pass", ok.pk)) == 2 and names.count(("completed", ok.pk)) == 1
    assert names.count(("failed", bad.pk)) == 1 and ("pass", bad.pk) not in names
    completed = next(kwargs for name, _, kwargs in received if name == "completed")
    assert completed["cursor"] == 2 and completed["counters"] == {"items": 4} and completed["instance"] == "ok"
    failed = next((status, kwargs) for name, status, kwargs in received if name == "failed")
    assert failed[0] == Status.FAILED and failed[1]["error"] == "RuntimeError: provider down"


@pytest.mark.django_db
def test_inside_a_transaction_signals_wait_for_its_commit(
    behaviour, clock, received, django_capture_on_commit_callbacks
):
    behaviour["tx"] = lambda p: {"done": True}
    start_job_run("tests.scripted", instance="tx")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run_due_jobs(now=clock)
        assert received == []
    for callback in callbacks:
        callback()
    assert [name for name, _, _ in received] == ["pass", "completed"]


@pytest.mark.django_db(transaction=True)
def test_a_failing_receiver_does_not_disturb_the_drive(behaviour, clock, caplog):
    def broken(sender, **kwargs):
        raise ValueError("receiver bug")

    pass_committed.connect(broken)
    try:
        behaviour["rx"] = lambda p: {"done": True}
        start_job_run("tests.scripted", instance="rx")
        report = run_due_jobs(now=clock)
    finally:
        pass_committed.disconnect(broken)
    assert report.completed == 1
    assert any("receiver of a django_jobruns signal failed" in r.getMessage() for r in caplog.records)
