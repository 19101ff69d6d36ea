"""Leases and fences with real threads and real worker processes (D2, D3, C4, P3)."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import JobRun, JobStep, Status
from tests import jobs
from tests.conftest import Clock, effect_lines, manage

pytestmark = pytest.mark.django_db(transaction=True)


def test_d2_two_holders_never_hold_one_run_at_once():
    """Threads drive the same due runs at once; no run is ever in two passes at the same moment."""
    lock = threading.Lock()
    in_flight: set[str] = set()
    overlaps: list[str] = []

    def handler(p):
        with lock:
            if p.run.id in in_flight:
                overlaps.append(p.run.id)
            in_flight.add(p.run.id)
        try:
            p.step(f"s{p.cursor}", lambda: JobRun.objects.get(pk=p.run.id).lease_fence)
            return {"cursor": (p.cursor or 0) + 1}
        finally:
            with lock:
                in_flight.discard(p.run.id)

    for i in range(8):
        jobs.BEHAVIOUR[f"d2-{i}"] = handler
        start_job_run("tests.scripted", instance=f"d2-{i}")
    barrier = threading.Barrier(6)
    reports = []

    def worker(n):
        try:
            barrier.wait()
            # Threads of one process share a holder; the fence tells their claims apart.
            reports.append(run_due_jobs(holder="shared" if n % 2 else f"holder-{n}"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    advanced = sum(r.advanced for r in reports)
    assert advanced >= 8 and sum(r.lost for r in reports) == 0
    # Every committed pass moved its run's cursor by one: none was lost or doubled.
    assert sum(int(c) for c in JobRun.objects.values_list("cursor", flat=True)) == advanced


def test_d2_an_expired_claim_counts_as_unheld():
    clock = Clock()
    jobs.BEHAVIOUR["exp"] = lambda p: {"cursor": 1}
    run, _ = start_job_run("tests.scripted", instance="exp")
    JobRun.objects.filter(pk=run.pk).update(
        lease_holder="other", lease_expires_at=clock.now + timedelta(seconds=1), lease_fence=3
    )
    assert run_due_jobs(now=clock).attempted == 0
    clock.advance(seconds=1)
    report = run_due_jobs(now=clock)
    run.refresh_from_db()
    assert report.attempted == 1 and run.lease_fence == 4 and run.cursor == "1"


def test_d3_worker_stalled_past_its_lease_is_fenced_out_and_writes_nothing(effects):
    """A blocks inside a step; B takes the run over and finishes it; A's pass is lost."""
    clock = Clock()
    entered, release = threading.Event(), threading.Event()
    jobs.GATES["stall"] = (entered, release)
    run, _ = start_job_run("tests.blocking", instance="stall", payload={"log": str(effects)})
    reports = {}

    def worker_a():
        try:
            reports["a"] = run_due_jobs(holder="worker-a", lease_ttl=timedelta(minutes=5), now=clock)
        finally:
            connections.close_all()

    a = threading.Thread(target=worker_a)
    a.start()
    try:
        assert entered.wait(timeout=30), "worker A never entered the step"
        held = JobRun.objects.get(pk=run.pk)
        assert held.lease_holder == "worker-a"
        # The step write before the blocking one extended the lease (heartbeat).
        assert held.lease_expires_at == clock.now + timedelta(minutes=5)
        clock.advance(minutes=6)  # A's lease has lapsed; A is still inside the step
        reports["b"] = run_due_jobs(holder="worker-b", now=clock)
        finished = JobRun.objects.get(pk=run.pk)
        assert finished.status == Status.DONE and reports["b"].completed == 1
    finally:
        release.set()
        a.join(timeout=30)
        jobs.GATES.pop("stall", None)
    after = JobRun.objects.get(pk=run.pk)
    assert reports["a"].lost == 1 and reports["a"].attempted == 1
    assert reports["a"].completed == reports["a"].advanced == 0
    assert (after.status, after.cursor, after.counters, after.lease_fence) == (
        finished.status,
        finished.cursor,
        finished.counters,
        finished.lease_fence,
    )
    assert after.updated_at == finished.updated_at and after.lease_holder is None
    assert not JobStep.objects.filter(run=run).exists(), "A wrote no step row after losing the lease"
    # A never reached its "second" step: the fence refused its "first" record.
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "first": 2, "second": 1}


@pytest.mark.slow
def test_d2_three_worker_processes_never_run_a_step_body_twice(effects):
    for i in range(10):
        start_job_run("tests.walk", instance=f"w{i}", payload={"log": str(effects), "passes": 4, "steps": 3})
    for _round in range(10):
        workers = [manage("run_due_jobs", "--max-passes", "2", "--limit", "10", "--json") for _ in range(3)]
        for w in workers:
            out, err = w.communicate(timeout=120)
            assert w.returncode == 0, err
        if not JobRun.objects.filter(status=Status.RUNNING).exists():
            break
    assert JobRun.objects.filter(status=Status.DONE).count() == 10
    lines = effect_lines(effects)
    assert len(lines) == 10 * 4 * 3
    repeated = [key for key, n in Counter(lines).items() if n > 1]
    assert repeated == []
    pids = {line.split()[2] for line in effects.read_text().splitlines()}
    assert len(pids) >= 2, "more than one worker did work"


@pytest.mark.slow
def test_p3_completed_step_is_not_rerun_after_sigkill(tmp_path, effects):
    """A worker killed inside a step is followed by one that resumes without redoing completed steps (C4, P3)."""
    fifo = tmp_path / "entered.fifo"
    os.mkfifo(fifo)
    run, _ = start_job_run(
        "tests.blocking",
        instance="kill",
        payload={"log": str(effects), "fifo": str(fifo), "marker": str(tmp_path / "marker")},
    )
    worker = manage("run_due_jobs", "--lease-ttl", "300", "--holder", "doomed")
    with open(fifo) as entered:  # returns once the worker is inside the step
        pid = int(entered.readline())
    assert pid == worker.pid
    worker.send_signal(signal.SIGKILL)
    worker.communicate(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    killed = JobRun.objects.get(pk=run.pk)
    assert killed.status == Status.RUNNING and killed.lease_holder == "doomed"
    assert JobStep.objects.get(run=run, step="before").result is not None
    # The next drive, once the lease has lapsed by its clock, takes the run again.
    later = Clock(killed.lease_expires_at + timedelta(seconds=1))
    report = run_due_jobs(now=later, holder="rescuer")
    run.refresh_from_db()
    assert report.completed == 1 and run.status == Status.DONE
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "first": 2, "second": 1}
