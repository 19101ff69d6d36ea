"""restart_job_run: a failed run started again as a new run, from scratch or resumed."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

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


def test_restarting_again_while_the_successor_is_live_joins_it(behaviour, clock):
    old = failed_run(behaviour, clock, "live-successor")
    successor, created = restart_job_run(old, resume=True)
    assert created
    again, created = restart_job_run(old)
    assert (again.pk, created) == (successor.pk, False), "joined, as a second start joins the live run"
    assert JobRun.objects.filter(restarted_from=old).count() == 1


def test_a_pruned_successor_still_refuses_a_second_restart(behaviour, clock):
    """The README's retention pattern prunes done runs; the failed run keeps the mark of its restart."""
    from django_jobruns.pruning import prune_job_runs

    old = failed_run(behaviour, clock, "pruned-successor")
    successor, _ = restart_job_run(old)
    behaviour["pruned-successor"] = lambda p: {"done": True}
    run_due_jobs(now=clock)
    assert JobRun.objects.get(pk=successor.pk).status == Status.DONE
    JobRun.objects.filter(pk=successor.pk).update(ended_at=clock.now - timedelta(days=30))
    prune_job_runs(older_than=timedelta(days=7), statuses=[Status.DONE])
    assert not JobRun.objects.filter(pk=successor.pk).exists()
    with pytest.raises(NotRestartable, match=f"already restarted as run {successor.pk}"):
        restart_job_run(old)
    assert JobRun.objects.filter(instance="pruned-successor").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_restarts_create_one_successor(behaviour, clock):
    old = failed_run(behaviour, clock, "racing")
    barrier = threading.Barrier(6)
    results: list[tuple[str, bool] | str] = []

    def restart() -> None:
        barrier.wait()
        try:
            run, created = restart_job_run(old.pk)
            results.append((run.pk, created))
        except NotRestartable as exc:
            results.append(str(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=restart) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    successors = list(JobRun.objects.filter(restarted_from=old).values_list("pk", flat=True))
    assert len(successors) == 1, results
    assert [r for r in results if isinstance(r, tuple) and r[1]] == [(successors[0], True)]
