"""The lease (``django_jobruns.claims``), with real threads, processes, signals and row locks.

- one holder at a time, an expired claim unheld (D2); fenced writes (D3);
- a takeover charges the silent pass, and a run that kills its worker every
  time fails after its policy (D10, C4);
- no step body starts on a lapsed lease: renewed if nobody took it, else the
  pass is lost (D11); one clock (D12); a job's own lease (D13);
- a completed step is not run again after SIGKILL (P3).

Effects are counted independently of the engine's records, in a per-test log
that each step body appends to.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import JobRun, JobStep, Status
from django_jobruns.report import DriveReport
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


def lock_waiters(pattern: str) -> int:
    """Connections of this database waiting for a row lock in a statement like ``pattern``, as the server says."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE %s",
                [pattern],
            )
        else:
            cur.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() "
                "AND command = 'Query' AND state = 'Updating' AND info LIKE %s",
                [pattern],
            )
        (count,) = cur.fetchone()
    return int(count)


STEP_WRITE = "%SET %lease_expires_at% = %"


TAKEOVER = "%attempts% + 1%"


def wait_for(condition, what: str, timeout: float = 30) -> None:
    """Poll a condition the server reports (a lock wait) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            with connection.cursor() as cur:
                cur.execute("SHOW PROCESSLIST" if connection.vendor == "mysql" else "SELECT * FROM pg_stat_activity")
                seen = cur.fetchall()
            raise AssertionError(f"timed out waiting for {what}: {seen}")
        time.sleep(0.01)


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="a row lock held FOR UPDATE needs row locks")
def test_takeover_after_a_row_lock_stall_sees_the_memo_committed_just_before_its_claim(effects):
    """A's memo write waits on a row lock past A's lease; B's takeover waits behind it; B must see A's memo."""
    clock_a = Clock()
    clock_b = Clock(clock_a.now + timedelta(seconds=61))
    entered, go = threading.Event(), threading.Event()
    locked, unlock = threading.Event(), threading.Event()
    log = str(effects)

    def s1() -> str:
        jobs.effect(log, "run", "s1")
        if not entered.is_set():
            entered.set()
            go.wait(timeout=30)
        return "s1"

    def handler(p):
        p.step("s1", s1)
        p.step("s2", lambda: jobs.effect(log, "run", "s2"))
        return {"done": True}

    jobs.BEHAVIOUR["stall"] = handler
    run, _ = start_job_run("tests.scripted", instance="stall")
    reports: dict[str, DriveReport] = {}

    def in_thread(name, fn):
        def target():
            try:
                reports[name] = fn()
            finally:
                connections.close_all()

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    def hold_row():
        with transaction.atomic():
            JobRun.objects.select_for_update().get(pk=run.pk)
            locked.set()
            unlock.wait(timeout=60)

    a = in_thread("a", lambda: run_due_jobs(holder="A", lease_ttl=timedelta(seconds=60), now=clock_a))
    try:
        assert entered.wait(timeout=30), "A never entered its step"
        locker = in_thread("locker", hold_row)
        assert locked.wait(timeout=30)
        go.set()  # A's memo write now waits on the locked row
        wait_for(lambda: lock_waiters(STEP_WRITE) == 1, "A's memo write to wait on the row lock")
        clock_a.advance(seconds=61)  # the stall outlasts A's lease, by A's clock too
        b = in_thread("b", lambda: run_due_jobs(holder="B", lease_ttl=timedelta(seconds=60), now=clock_b))
        wait_for(lambda: lock_waiters(TAKEOVER) == 1, "B's claim to wait behind A's write")
    finally:
        go.set()
        unlock.set()
    for thread in (a, locker, b):
        thread.join(timeout=60)
    after = JobRun.objects.get(pk=run.pk)
    ran = Counter(step for _, step in effect_lines(effects))
    assert ran == {"s1": 1, "s2": 1}, f"a completed step ran again: {ran}"
    assert after.status == Status.DONE
    if reports["b"].completed:
        # B took over and saw A's memo; A's next step found the lease taken and did not start.
        assert reports["b"].taken_over == 1 and reports["a"].lost == 1 and reports["a"].completed == 0
    else:
        # Once the lock went, A's renewal (its lease had lapsed by its clock, and nobody had taken the
        # run yet) reached the row before B's claim re-checked it: A kept the run, B's claim was refused.
        assert reports["a"].completed == 1 and reports["b"].skipped == 1 and after.lease_fence == 1


@pytest.mark.slow
def test_a_run_that_kills_its_worker_every_time_fails_after_its_policy(tmp_path, effects):
    """Poison: each pass SIGKILLs its worker. Each takeover charges the silent pass; the policy ends it (D10)."""
    run, _ = start_job_run("tests.suicidal", instance="poison", payload={"log": str(effects)})
    killed = 0
    for _ in range(jobs.FAST_RETRY.max_attempts + 3):
        worker = manage("run_due_jobs", "--json", "--lease-ttl", "300")
        out, err = worker.communicate(timeout=120)
        if worker.returncode == -signal.SIGKILL:
            killed += 1
            held = JobRun.objects.get(pk=run.pk)
            assert held.status == Status.RUNNING and held.lease_holder is not None
            assert held.attempts == killed - 1, "the takeover charged the pass before it"
            # Time passes: the dead worker's lease lapses.
            JobRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
            continue
        assert worker.returncode == 0, err
        break
    after = JobRun.objects.get(pk=run.pk)
    assert killed == jobs.FAST_RETRY.max_attempts
    assert after.status == Status.FAILED and after.attempts == jobs.FAST_RETRY.max_attempts
    assert after.ended_at is not None and after.live is None and after.lease_holder is None
    assert "stopped reporting and its lease expired" in after.last_error
    # The handler was not invoked once the policy was spent: one "die" per killed worker.
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "die": killed}
    assert '"failed": 1' in out


def test_no_step_body_starts_on_a_lapsed_lease_that_was_taken(effects, clock):
    """A's lease lapses (by its clock) between steps and B takes the run: A's next step never starts (D11)."""
    log = str(effects)
    taken = threading.Event()

    def handler(p):
        p.step("one", lambda: jobs.effect(log, p.run.id, "one"))
        if not taken.is_set():
            taken.set()
            clock.advance(minutes=6)

            def rescue():
                try:
                    run_due_jobs(holder="B", now=clock)
                finally:
                    connections.close_all()

            thread = threading.Thread(target=rescue)
            thread.start()
            thread.join(timeout=60)
        p.step("two", lambda: jobs.effect(log, p.run.id, "two"))
        return {"done": True}

    jobs.BEHAVIOUR["lapsed"] = handler
    run, _ = start_job_run("tests.scripted", instance="lapsed")
    report = run_due_jobs(holder="A", now=clock)
    assert report.lost == 1 and report.completed == 0
    assert JobRun.objects.get(pk=run.pk).status == Status.DONE
    assert Counter(step for _, step in effect_lines(effects)) == {"one": 1, "two": 1}


def test_a_lapsed_lease_nobody_took_is_renewed_before_the_next_step(clock):
    def handler(p):
        p.step("one", lambda: 1)
        clock.advance(minutes=6)  # a long stretch of work between steps
        p.step("two", lambda: 2)
        return {"done": True}

    jobs.BEHAVIOUR["renew"] = handler
    run, _ = start_job_run("tests.scripted", instance="renew")
    report = run_due_jobs(now=clock)
    assert report.completed == 1 and report.lost == 0
    assert JobRun.objects.get(pk=run.pk).status == Status.DONE


def test_a_job_lease_overrides_the_drive_lease(clock):
    from django_jobruns import job
    from django_jobruns.registry import unregister

    seen = []

    @job(lease=timedelta(hours=2))
    def long_lease(p):
        seen.append(JobRun.objects.get(pk=p.run.id).lease_expires_at)
        return {"done": True}

    try:
        start_job_run(long_lease, instance="x")
        assert run_due_jobs(now=clock, lease_ttl=timedelta(minutes=5)).completed == 1
        assert seen == [clock.now + timedelta(hours=2)]
    finally:
        unregister("tests.long_lease")


@pytest.mark.slow
@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite is one host's file: its clock is the host's")
def test_a_worker_whose_clock_runs_ten_minutes_fast_cannot_take_a_live_lease(effects):
    jobs.BEHAVIOUR["held"] = lambda p: {"done": True}
    run, _ = start_job_run("tests.walk", instance="held", payload={"log": str(effects)})
    held_until = timezone.now() + timedelta(minutes=5)
    JobRun.objects.filter(pk=run.pk).update(lease_holder="live-worker", lease_expires_at=held_until, lease_fence=7)
    worker = manage("run_due_jobs", "--json", extra_env={"JOBRUNS_TEST_CLOCK_SKEW": "600"})
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert '"attempted": 0' in out
    after = JobRun.objects.get(pk=run.pk)
    assert (after.lease_holder, after.lease_fence, after.attempts) == ("live-worker", 7, 0)
    assert effect_lines(effects) == []
    # The skew is real in that process: its own clock reads ten minutes ahead.
    shell = manage(
        "shell",
        "-c",
        "from django.utils import timezone; print(timezone.now().isoformat())",
        extra_env={"JOBRUNS_TEST_CLOCK_SKEW": "600"},
    )
    printed, _ = shell.communicate(timeout=120)
    assert datetime.fromisoformat(printed.split()[-1]) > timezone.now() + timedelta(minutes=9)


def test_a_takeover_of_a_lapsed_lease_is_reported(clock):
    jobs.BEHAVIOUR["lapsed"] = lambda p: {"done": True}
    run, _ = start_job_run("tests.scripted", instance="lapsed")
    JobRun.objects.filter(pk=run.pk).update(lease_holder="dead-host:1:ab", lease_expires_at=clock.now - timedelta(1))
    report = run_due_jobs(now=clock)
    assert report.taken_over == 1 and report.completed == 1
