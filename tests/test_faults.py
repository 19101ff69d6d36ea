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
from tests.conftest import Clock, effect_lines, manage, wait_until
from tests.support import task_functions
from tests.support.task_functions import end_own_connection

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


@pytest.mark.parametrize("lapsed", ["by the rescuer's clock", "for real"])
def test_worker_paused_past_its_lease_is_fenced_out(tmp_path, effects, lapsed):
    """Stopped (SIGSTOP) inside a step past its lease, its run taken over and finished, then resumed: the
    worker goes on, its writes are refused (D3, D11) and it reports the pass lost. For real, the lease
    lapses while it is stopped: its sentinel, which ends a process frozen while running (a body holding
    the interpreter's lock), reads that it is stopped and leaves it."""
    run, entered, release = blocking_run(tmp_path, effects, "paused")
    lease = "5" if lapsed == "for real" else "60"
    worker = manage("run_due_jobs", "--json", "--lease-ttl", lease, "--holder", "paused-worker")
    with open(entered) as fifo:
        assert int(fifo.readline()) == worker.pid
    worker.send_signal(signal.SIGSTOP)
    try:
        if lapsed == "for real":
            rescuer = manage("run_due_jobs", "--lease-ttl", "5", "--holder", "rescuer", "--max-seconds", "15", "--json")
            out, err = rescuer.communicate(timeout=120)
            assert rescuer.returncode == 0 and json.loads(out)["completed"] == 1, err
        else:
            held = JobRun.objects.get(pk=run.pk)
            # Another holder, whose clock is past the paused worker's lease, takes the run and finishes it.
            report = run_due_jobs(holder="rescuer", now=Clock(held.lease_expires_at + timedelta(seconds=1)))
            assert report.completed == 1
        finished = JobRun.objects.get(pk=run.pk)
    finally:
        worker.send_signal(signal.SIGCONT)
    # Let its body go on once it reads ``release`` again (it may have been stopped just before), unless it ended.
    wait_until(lambda: _released(release) or worker.poll() is not None, "the worker to read its release or end")
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
    assert [step for _, step in effect_lines(effects)] == ["before", "first", "first", "second"]


def _released(fifo: str | os.PathLike[str]) -> bool:
    """Whether a reader had ``fifo`` open and was let go (its writer opened and closed): ``False`` if none had."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def _alive(backends: list[int]) -> list[int]:
    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [backends])
        return [pid for (pid,) in cur.fetchall()]


@pytest.mark.skipif(
    "os.environ.get('DATABASE_URL', '').split(':')[0] not in ('postgres', 'postgresql')",
    reason="pg_terminate_backend is PostgreSQL's",
)
def test_a_threads_kept_connection_the_server_ended_between_rounds_is_replaced_and_every_run_driven(behaviour):
    """``--concurrency``'s threads keep their connections while the drive waits; the server may end them meanwhile."""
    import threading

    from django.db import connections, transaction
    from django.db.backends.signals import connection_created

    backends: list[int] = []
    lock = threading.Lock()

    def record(sender, connection, **kwargs):
        if threading.current_thread().name.startswith("jobruns_"):
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                with lock:
                    backends.append(cur.fetchone()[0])

    together = threading.Barrier(2, timeout=30)

    def first(p):
        together.wait()  # both runs in flight at once: each of the two threads has opened its connection
        return {"done": True}

    def start(prefix: str, handler) -> None:
        with transaction.atomic():  # both due at once: a round of two rows, driven on the threads
            for i in range(2):
                behaviour[f"{prefix}{i}"] = handler
                start_job_run("tests.scripted", instance=f"{prefix}{i}")

    def done(prefix: str) -> bool:
        return JobRun.objects.filter(instance__startswith=prefix, status=Status.DONE, lease_holder=None).count() == 2

    stop, reports = threading.Event(), []

    def drive() -> None:
        try:
            reports.append(run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop))
        finally:
            connections.close_all()

    start("first", first)
    connection_created.connect(record)
    worker = threading.Thread(target=drive)
    try:
        worker.start()
        wait_until(lambda: done("first"), "the first two runs done")
        kept = list(backends)
        assert len(kept) == 2, kept  # a connection for each of the round's two threads
        with connection.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [kept])
        wait_until(lambda: not _alive(kept), "the two backends gone")
        # Its NOTIFY wakes the drive; its threads find their connections ended.
        start("second", lambda p: {"done": True})
        wait_until(lambda: done("second"), "the second two runs done on new connections")
    finally:
        stop.set()
        worker.join(timeout=120)
        connection_created.disconnect(record)
    assert not worker.is_alive()
    assert reports[0].completed == 4, reports[0]
    assert len(backends) > 2, backends  # the ended connections were replaced
    assert not JobRun.objects.exclude(status=Status.DONE).exists()


networked = pytest.mark.skipif("connection.vendor == 'sqlite'", reason="a server that ends its sessions")


@networked
def test_a_step_body_that_ends_its_own_connection_and_raises_is_charged_until_the_run_fails(behaviour, clock):
    """The failure is the body's: recorded on a new connection, charged, so the run ends instead of looping."""
    calls: list[int] = []

    def handler(p):
        def body():
            calls.append(1)
            end_own_connection(swallow=False)

        p.step("ends", body)
        return {"done": True}

    behaviour["ends-raising"] = handler
    run, _ = start_job_run("tests.scripted", instance="ends-raising")
    reports = []
    for _ in range(4):
        reports.append(run_due_jobs(now=clock))
        clock.advance(hours=2)  # past any backoff
    run.refresh_from_db()
    assert [r.unrecorded for r in reports] == [[], [], [], []], reports
    assert run.status == Status.FAILED and len(calls) == 3, (run.status, len(calls), run.last_error)
    assert "step 'ends' failed (attempt 3 of 3)" in run.last_error
    assert JobStep.objects.get(run=run, step="ends").attempts == 3


@networked
@pytest.mark.parametrize("where", ["step", "handler"])
def test_a_body_that_ends_its_own_connection_and_goes_on_has_its_pass_recorded_on_a_new_one(behaviour, clock, where):
    """A body that caught the error and went on: its step's result and its pass are written, once."""
    calls: list[int] = []

    def body():
        calls.append(1)
        end_own_connection(swallow=True)
        return 7

    def handler(p):
        got = p.step("ends", body) if where == "step" else body()
        return {"cursor": got, "done": True}

    behaviour[f"ends-{where}"] = handler
    run, _ = start_job_run("tests.scripted", instance=f"ends-{where}")
    report = run_due_jobs(now=clock)
    run.refresh_from_db()
    assert report.unrecorded == [] and report.completed == 1, report
    assert (run.status, run.cursor_value, len(calls)) == (Status.DONE, 7, 1)


@networked
@pytest.mark.parametrize("swallow", [True, False])
def test_a_task_that_ends_its_own_connection_ends_as_django_says(swallow):
    """SUCCESSFUL with its value when it went on; FAILED with its error once its retries are spent."""
    result = task_functions.ends_its_connection.enqueue(swallow)
    reports = [run_due_jobs() for _ in range(3)]
    result.refresh()
    assert [r.unrecorded for r in reports] == [[], [], []], reports
    if swallow:
        assert (result.status, result.return_value, len(result.worker_ids)) == ("SUCCESSFUL", "went on", 1)
    else:
        assert (result.status, len(result.errors)) == ("FAILED", 3), (result.status, result.errors)
        assert {e.exception_class_path.rsplit(".", 1)[-1] for e in result.errors} <= {
            "OperationalError",
            "InterfaceError",
        }
