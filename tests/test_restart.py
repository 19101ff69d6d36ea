"""restart_job_run: a failed run started again as a new run, from scratch or resumed."""

from __future__ import annotations

import pytest

from django_jobruns import GiveUp, restart_job_run, run_due_jobs, start_job_run
from django_jobruns.exceptions import JobRunsError, NotRestartable
from django_jobruns.models import JobRun, JobStep, Status
from tests import jobs

pytestmark = pytest.mark.django_db


def failed_run(behaviour, clock, instance="r"):
    """A run that committed two passes, then failed for good on the third."""

    def handler(p):
        position = p.cursor or 0
        p.step(f"s{position}", lambda: position)
        p.count("pages")
        if position == 2:
            raise ConnectionError("provider down")
        return {"cursor": position + 1}

    behaviour[instance] = handler
    run, _ = start_job_run("tests.scripted", instance=instance, payload={"supplier": 7})
    for _ in range(5):
        run_due_jobs(now=clock)
        clock.advance(hours=2)
    run.refresh_from_db()
    assert run.status == Status.FAILED and run.cursor == "2"
    return run


def test_restart_starts_a_new_run_from_scratch(behaviour, clock):
    old = failed_run(behaviour, clock)
    new, created = restart_job_run(old)
    assert created and new.pk != old.pk
    assert (new.module, new.job, new.instance, new.payload) == (old.module, old.job, old.instance, old.payload)
    assert new.cursor is None and new.counters == "{}" and new.status == Status.RUNNING
    assert new.restarted_from_id == old.pk
    assert JobStep.objects.filter(run=old).exists() and not JobStep.objects.filter(run=new).exists()
    old.refresh_from_db()
    assert old.status == Status.FAILED, "the failed run stays as evidence"


def test_resume_carries_the_last_committed_cursor_and_counters(behaviour, clock):
    old = failed_run(behaviour, clock)
    new, created = restart_job_run(old.pk, resume=True)
    assert created and new.cursor == "2" and new.counters == old.counters == '{"pages":2}'
    seen = []
    behaviour[old.instance] = lambda p: seen.append(p.cursor) or {"done": True}
    run_due_jobs(now=clock)
    assert seen == [2]


def test_restart_joins_a_live_run_for_the_key(behaviour, clock):
    old = failed_run(behaviour, clock)
    live, _ = start_job_run("tests.scripted", instance=old.instance)
    joined, created = restart_job_run(old)
    assert not created and joined.pk == live.pk and joined.restarted_from_id is None


@pytest.mark.parametrize("status", [Status.RUNNING, Status.DONE, Status.CANCELLED])
def test_restart_refuses_a_run_that_is_not_failed(status):
    run, _ = start_job_run("tests.walk", instance="nf")
    JobRun.objects.filter(pk=run.pk).update(status=status, live=True if status == Status.RUNNING else None)
    before = JobRun.objects.count()
    with pytest.raises(NotRestartable, match=f"is {status}; only a failed run"):
        restart_job_run(run)
    assert JobRun.objects.count() == before
    with pytest.raises(JobRunsError, match="no run has the id"):
        restart_job_run("01NOTARUN")


def test_a_failed_run_is_restarted_at_most_once(clock):
    jobs.BEHAVIOUR["once"] = lambda p: (_ for _ in ()).throw(GiveUp("bad"))
    run, _ = start_job_run("tests.scripted", instance="once")
    run_due_jobs(now=clock)
    successor, created = restart_job_run(run, resume=True)
    assert created
    jobs.BEHAVIOUR["once"] = lambda p: {"done": True}
    run_due_jobs(now=clock)
    assert JobRun.objects.get(pk=successor.pk).status == Status.DONE
    for resume in (False, True):
        with pytest.raises(NotRestartable, match=f"already restarted as run {successor.pk}") as caught:
            restart_job_run(run, resume=resume)
        assert caught.value.successor == successor.pk
    assert JobRun.objects.filter(instance="once").count() == 2
