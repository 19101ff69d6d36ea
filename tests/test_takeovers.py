"""Faults real deployments bring (D10, D11, P9, P11): stalls, poison runs, exits, unstorable errors.

Effects are counted independently of the engine's records, in a per-test log
that each step body appends to.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_jobruns import RetryPolicy, run_due_jobs, start_job_run
from django_jobruns.drive import DriveReport
from django_jobruns.models import JobRun, JobStep, Status
from tests import jobs
from tests.conftest import Clock, effect_lines, manage

pytestmark = pytest.mark.django_db(transaction=True)


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


# A's step record: the heartbeat (MariaDB) or the heartbeat-and-insert statement (PostgreSQL);
# B's takeover claim, which charges the silent pass.
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


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_a_step_that_exits_is_recorded_and_does_not_starve_the_runs_behind_it(exc, clock):
    def exits(p):
        p.step("leave", lambda: (_ for _ in ()).throw(exc))
        return {"done": True}

    jobs.BEHAVIOUR["exits"] = exits
    jobs.BEHAVIOUR["behind"] = lambda p: {"done": True}
    first, _ = start_job_run("tests.scripted", instance="exits")
    behind, _ = start_job_run("tests.scripted", instance="behind")
    with pytest.raises(type(exc)):
        run_due_jobs(now=clock, limit=5)
    recorded = JobRun.objects.get(pk=first.pk)
    assert recorded.status == Status.RUNNING and recorded.attempts == 1
    assert recorded.last_error.startswith(f"step 'leave' failed (attempt 1 of 3): {type(exc).__name__}")
    assert recorded.lease_holder is None and recorded.next_attempt_at > clock.now
    assert JobStep.objects.get(run=first, step="leave").attempts == 1
    # The next drive goes on with the run behind it; the one that exited waits out its backoff.
    report = run_due_jobs(now=clock, limit=5)
    assert report.completed == 1 and JobRun.objects.get(pk=behind.pk).status == Status.DONE


def test_a_handler_that_calls_sys_exit_is_recorded_and_the_exit_goes_on():
    run, _ = start_job_run("tests.scripted", instance="sysexit")
    jobs.BEHAVIOUR["sysexit"] = lambda p: sys.exit(4)
    with pytest.raises(SystemExit) as caught:
        run_due_jobs()
    assert caught.value.code == 4
    after = JobRun.objects.get(pk=run.pk)
    assert after.attempts == 1 and after.last_error.startswith("SystemExit: 4") and after.lease_holder is None


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.parametrize(
    "error, expect",
    [
        (ValueError("bad\x00byte"), "ValueError: bad\\x00byte"),
        (ValueError("lone \udc80 surrogate"), "ValueError: lone \\udc80 surrogate"),
        (Unprintable(), "Unprintable (its message could not be printed)"),
        (ValueError("x" * 5_000_000), "ValueError: xxx"),
    ],
    ids=["nul", "surrogate", "unprintable", "megabytes"],
)
def test_every_failure_is_recordable_and_the_steps_own_policy_applies(error, expect, clock):
    def handler(p):
        p.step("upstream", lambda: (_ for _ in ()).throw(error), retry=RetryPolicy(max_attempts=1))
        return {"done": True}

    jobs.BEHAVIOUR["unstorable"] = handler
    run, _ = start_job_run("tests.scripted", instance="unstorable")
    report = run_due_jobs(now=clock)
    after = JobRun.objects.get(pk=run.pk)
    # The step's policy allows one attempt: the run fails now, with the error as it could be stored.
    assert report.failed == 1 and report.unrecorded == []
    assert after.status == Status.FAILED and after.attempts == 1
    assert expect in after.last_error and len(after.last_error) <= 10_000
    step = JobStep.objects.get(run=run, step="upstream")
    assert step.attempts == 1 and expect in step.last_error and len(step.last_error) <= 10_000


def test_a_step_inside_the_handlers_own_transaction_is_refused(effects, clock):
    def handler(p):
        with transaction.atomic():
            p.step("inside", lambda: jobs.effect(str(effects), "run", "inside"))
        return {"done": True}

    jobs.BEHAVIOUR["atomic"] = handler
    run, _ = start_job_run("tests.scripted", instance="atomic")
    report = run_due_jobs(now=clock)
    after = JobRun.objects.get(pk=run.pk)
    assert report.failed == 1 and after.status == Status.FAILED
    assert "inside a transaction the handler opened" in after.last_error
    assert effect_lines(effects) == []


def test_a_step_called_after_its_pass_ended_is_refused(clock):
    kept = []

    def handler(p):
        kept.append(p)
        return {"done": True}

    jobs.BEHAVIOUR["late"] = handler
    start_job_run("tests.scripted", instance="late")
    assert run_due_jobs(now=clock).completed == 1
    from django_jobruns.exceptions import StepOutsidePass

    with pytest.raises(StepOutsidePass, match="after its pass ended"):
        kept[0].step("late", lambda: 1)


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
    # Its own clock still stamps what it starts: the skew is real in that process.
    starter = manage(
        "start_job_run", "tests.walk", "--instance", "stamped", extra_env={"JOBRUNS_TEST_CLOCK_SKEW": "600"}
    )
    starter.communicate(timeout=120)
    assert JobRun.objects.get(instance="stamped").started_at > timezone.now() + timedelta(minutes=9)
