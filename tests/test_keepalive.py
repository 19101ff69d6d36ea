"""Keep-alive (D17), ``p.stopping`` (D18) and a pass's time limit (D19), with real worker processes.

A body runs far longer than its lease; another drive runs meanwhile; the
effects each body leaves (a per-test log, apart from the engine's records)
count how often it ran. FIFOs tell the test when a worker is inside a body.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_jobruns import cancel_job_run, job, keepalive, pause_job_run, run_due_jobs, start_job_run
from django_jobruns.conf import DEFAULTS
from django_jobruns.models import JobRun, JobStep, Status
from django_jobruns.registry import unregister
from django_jobruns.store import sentinel
from tests.conftest import ROOT, effect_lines, manage, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 5


def report_of(worker) -> dict:
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    report: dict = json.loads(out)
    return report


def entered(fifo: Path) -> int:
    """Block until a worker opens ``fifo`` for writing (it is inside the body); return its pid."""
    with open(fifo) as announced:
        return int(announced.readline())


def let_go(fifo: Path) -> None:
    with open(fifo, "w"):
        pass


def fifos(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / f"{name}.fifo" for name in names]
    for path in paths:
        os.mkfifo(path)
    return paths


def test_the_default_lease_is_short_and_a_timeout_bounds_a_pass():
    assert timedelta(seconds=5) <= DEFAULTS["LEASE_TTL"] <= timedelta(seconds=60)
    assert DEFAULTS["TIMEOUT"] == timedelta(hours=1)


@pytest.mark.slow
def test_a_step_body_three_leases_long_runs_once_and_is_never_taken_over(tmp_path, effects):
    """D17: a second drive polling for 3 leases while the holder's step runs takes nothing; the step runs once."""
    fifo, release = fifos(tmp_path, "entered", "release")
    run, _ = start_job_run(
        "tests.blocking",
        instance="long",
        payload={"log": str(effects), "fifo": str(fifo), "release": str(release), "marker": str(tmp_path / "m")},
    )
    holder = manage("run_due_jobs", "--json", "--lease-ttl", str(LEASE), "--holder", "A")
    assert entered(fifo) == holder.pid
    other = manage("run_due_jobs", "--json", "--lease-ttl", str(LEASE), "--holder", "B", "--max-seconds", "15.5")
    theirs = report_of(other)  # 3 leases of looking for due runs, the holder's body running all along
    let_go(release)
    ours = report_of(holder)
    assert theirs["attempted"] == 0 and theirs["taken_over"] == 0, theirs
    assert ours["completed"] == 1 and ours["lost"] == 0, ours
    run.refresh_from_db()
    assert run.status == Status.DONE and run.attempts == 0
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "first": 1, "second": 1}


def _first_of_a_pid_namespace() -> list[str]:
    """The command that runs a command as the first process (PID 1) of a new PID namespace, as a container's."""
    command = ["unshare", "--pid", "--fork", "--mount-proc"]
    try:
        subprocess.run([*command, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs util-linux's unshare and the right to make a PID namespace (root)")
    return command


@pytest.mark.slow
@pytest.mark.parametrize("first", ["a process", "a PID namespace's first process"])
def test_a_body_that_holds_the_interpreters_lock_past_its_lease_ends_its_process_before_the_run_is_taken(
    tmp_path, effects, first
):
    """D17 whatever a body does: one call into C holding the interpreter's lock (until another body lets it
    go) stops the keep-alive thread, so the lease lapses while the body runs. The process's sentinel (another
    process) ends it first, printing where the body was; the drive that takes the run over starts its body
    only once the first process is gone, and the first body never goes on. A container's first process, as a
    Kubernetes CronJob runs the drive, ignores SIGKILL from inside its namespace: it is ended all the same."""
    fifo, release = fifos(tmp_path, "entered", "release")
    payload = {"log": str(effects), "fifo": str(fifo), "marker": str(tmp_path / "m"), "release": str(release)}
    prefix = _first_of_a_pid_namespace() if first != "a process" else []
    # A budget: the drive waits for the run, started below once the drive's pid is known.
    drive = ["run_due_jobs", "--lease-ttl", str(LEASE), "--max-seconds", "30"]
    holder = subprocess.Popen(
        [*prefix, sys.executable, str(ROOT / "manage.py"), *drive],
        env=worker_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if prefix:
        payload["watch"] = str(holder.pid)  # unshare, which lives as long as the drive it runs as PID 1
    run, _ = start_job_run("tests.holds_the_lock", instance="frozen", payload=payload)
    assert entered(fifo) == (1 if prefix else holder.pid)
    other = manage("run_due_jobs", "--json", "--lease-ttl", str(LEASE), "--holder", "B", "--max-seconds", "20")
    _, err = holder.communicate(timeout=120)
    theirs = report_of(other)
    assert [step for _, step in effect_lines(effects)] == ["after:gone"]  # not "after:running", nor "held"
    assert holder.returncode == sentinel.EXIT, err  # the sentinel's signal, whose handler is _exit
    assert "holding the interpreter's lock?" in err and "in crunch" in err, err  # where each thread was
    assert theirs["taken_over"] == 1 and theirs["completed"] == 1, theirs
    run.refresh_from_db()
    assert run.status == Status.DONE and run.attempts == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sentinel is Linux's")
def test_a_body_that_closes_every_descriptor_gets_no_word_of_the_sentinels_in_its_own_file(tmp_path):
    """A body that closes every descriptor of its process (``os.closerange``, as code that makes itself a daemon
    does) closes the sentinel's pipe too, and the number is then one of the body's files: the next word is not
    written there. A new sentinel watches the process from that word on; the old one has ended."""
    far = time.monotonic() + 3600
    sentinel.tell(far)
    first, fd = sentinel._running["proc"], sentinel._running["fd"]
    assert first is not None and fd is not None
    mine = tmp_path / "mine"
    opened = os.open(mine, os.O_WRONLY | os.O_CREAT)
    try:
        os.dup2(opened, fd)  # the pipe's end closed, its number now the body's file
        sentinel.tell(far)
        sentinel.tell(None)
    finally:
        os.close(opened)
    assert mine.read_bytes() == b""
    assert sentinel.watching() and sentinel._running["proc"] is not first
    assert first.wait(timeout=30) == 0  # it read the pipe's end: its process was gone, for all it knew
    os.close(fd)  # the body's, which the engine must not have closed for it


@pytest.mark.slow
def test_a_task_three_leases_long_runs_once_and_is_never_taken_over(tmp_path, effects):
    """D17 for a ``@task`` (the backend's LEASE_TTL is 5 s in the test settings)."""
    from tests.support.task_functions import blocking_task

    fifo, release = fifos(tmp_path, "entered", "release")
    result = blocking_task.enqueue(str(effects), str(fifo), str(release))
    holder = manage("run_due_jobs", "--json", "--holder", "A")
    assert entered(fifo) == holder.pid
    other = manage("run_due_jobs", "--json", "--holder", "B", "--max-seconds", "15.5")
    theirs = report_of(other)
    let_go(release)
    ours = report_of(holder)
    assert theirs["attempted"] == 0 and theirs["taken_over"] == 0, theirs
    assert ours["completed"] == 1, ours
    result.refresh()
    assert result.status == "SUCCESSFUL" and result.return_value == "finished"
    assert result.worker_ids == ["A"] and result.errors == []
    assert effects.read_text().splitlines() == [f"started {holder.pid}"]


@pytest.mark.slow
def test_a_killed_worker_with_the_default_lease_is_taken_over_within_75_seconds(tmp_path, effects):
    """D17: with keep-alive the default lease is short, so a SIGKILLed worker's run waits about one lease."""
    fifo, rescued = fifos(tmp_path, "entered", "rescued")
    run, _ = start_job_run(
        "tests.blocking",
        instance="killed",
        payload={"log": str(effects), "fifo": str(fifo), "rescued": str(rescued), "marker": str(tmp_path / "m")},
    )
    doomed = manage("run_due_jobs", "--holder", "doomed")
    assert entered(fifo) == doomed.pid
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=30)
    killed_at = time.monotonic()
    rescuer = manage("run_due_jobs", "--json", "--holder", "rescuer", "--max-seconds", "90")
    assert entered(rescued) == rescuer.pid  # the rescuer is inside the step: it took the run over
    waited = time.monotonic() - killed_at
    rescuer.send_signal(signal.SIGTERM)
    report = report_of(rescuer)
    assert waited <= 75, waited
    assert report["taken_over"] == 1 and report["completed"] == 1, report
    run.refresh_from_db()
    assert run.status == Status.DONE


@pytest.mark.slow
def test_sigterm_during_a_long_step_is_seen_through_stopping_and_the_cursor_reached_is_committed(tmp_path, effects):
    """D18: the first SIGTERM asks the pass to end; the step returns how far it got and the pass commits it."""
    (fifo,) = fifos(tmp_path, "entered")
    run, _ = start_job_run("tests.looping", payload={"log": str(effects), "fifo": str(fifo), "items": 100_000})
    worker = manage("run_due_jobs", "--json", "--holder", "A")
    assert entered(fifo) == worker.pid
    worker.send_signal(signal.SIGTERM)
    report = report_of(worker)
    assert report["advanced"] == 1 and report["stopped"], report
    run.refresh_from_db()
    walked = [step for _, step in effect_lines(effects)]
    assert 0 < run.cursor_value == len(walked) < 100_000
    assert walked == [f"item-{n}" for n in range(run.cursor_value)]
    assert run.status == Status.RUNNING and run.lease_holder is None
    # The next pass goes on from there.
    JobRun.objects.filter(pk=run.pk).update(payload=json.dumps({"log": str(effects), "items": run.cursor_value + 3}))
    later = run_due_jobs(holder="B")
    run.refresh_from_db()
    assert later.completed == 1 and run.status == Status.DONE
    assert len(effect_lines(effects)) == len(walked) + 3


@pytest.mark.slow
def test_a_cancel_during_a_long_step_is_seen_within_one_renewal_and_nothing_is_committed(tmp_path, effects):
    """D17/D18: the renewal finds the fence moved; the pass stops, is reported lost and commits nothing."""
    (fifo,) = fifos(tmp_path, "entered")
    seen = tmp_path / "seen"
    run, _ = start_job_run(
        "tests.looping", payload={"log": str(effects), "fifo": str(fifo), "seen": str(seen), "items": 100_000}
    )
    worker = manage("run_due_jobs", "--json", "--holder", "A")
    assert entered(fifo) == worker.pid
    cancelled_at = time.time()
    cancel_job_run(run, reason="wrong supplier")
    report = report_of(worker)
    assert report["lost"] == 1 and report["advanced"] == 0, report
    assert float(seen.read_text()) - cancelled_at <= LEASE / 3 + 1.0  # one renewal, and the item in hand
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.cursor is None
    assert not JobStep.objects.filter(run=run, result__isnull=False).exists()


@pytest.mark.slow
def test_a_pause_during_a_long_step_is_seen_within_one_renewal_and_the_progress_is_committed(tmp_path, effects):
    """D18: a pause does not move the fence: the pass stops early, commits its cursor, and the run stays paused."""
    (fifo,) = fifos(tmp_path, "entered")
    seen = tmp_path / "seen"
    run, _ = start_job_run(
        "tests.looping", payload={"log": str(effects), "fifo": str(fifo), "seen": str(seen), "items": 100_000}
    )
    worker = manage("run_due_jobs", "--json", "--holder", "A", "--max-passes", "5")
    assert entered(fifo) == worker.pid
    paused_at = time.time()
    pause_job_run(run)
    report = report_of(worker)
    assert report["advanced"] == 1, report
    assert float(seen.read_text()) - paused_at <= LEASE / 3 + 1.0
    run.refresh_from_db()
    assert run.paused_at is not None and run.lease_holder is None
    assert run.cursor_value == len(effect_lines(effects)) > 0


@pytest.mark.slow
def test_a_body_past_its_timeout_that_never_returns_ends_its_worker_before_the_run_is_taken_over(tmp_path, effects):
    """D19: past ``timeout`` the holder stops renewing. A body still running when a quarter of the lease is
    left ends its process, so the drive that takes the run over (charged) never runs it beside that body:
    it was taken over beside the hung thread, and both bodies ran at once."""
    fifo, rescued = fifos(tmp_path, "entered", "rescued")
    # No release: the holder's body waits for ever, as a request with no timeout does.
    payload = {"log": str(effects), "fifo": str(fifo), "rescued": str(rescued), "marker": str(tmp_path / "m")}
    run, _ = start_job_run("tests.overrunning", payload=payload)
    holder = manage("run_due_jobs", "--json", "--holder", "A")
    assert entered(fifo) == holder.pid
    began = time.monotonic()
    rescuer = manage("run_due_jobs", "--json", "--holder", "B", "--max-seconds", "60")
    assert entered(rescued) == rescuer.pid
    waited = time.monotonic() - began
    assert holder.poll() is not None, "the hung body's process had ended before the other drive's body began"
    _, said = holder.communicate(timeout=60)
    assert holder.returncode == sentinel.EXIT_STATUS and "its body has not returned" in said, (holder.returncode, said)
    rescuer.send_signal(signal.SIGTERM)
    theirs = report_of(rescuer)
    assert 5 <= waited <= 5 + LEASE + 5, waited  # its timeout, then at most one lease (and a poll)
    assert theirs["taken_over"] == 1 and theirs["completed"] == 1, theirs
    run.refresh_from_db()
    assert run.status == Status.DONE and run.failed_passes == 1
    assert Counter(step for _, step in effect_lines(effects)) == {"before": 1, "first": 2, "second": 1}


def test_a_body_that_returns_past_its_timeout_is_a_failed_attempt(behaviour):
    """D19: a pass that overran commits nothing of its own; the attempt is charged and retried by the policy."""
    gate = threading.Event()

    @job("slow_returner", timeout=5, lease=20)  # returns long before a quarter of its lease is left
    def slow_returner(p):
        p.step("s", lambda: gate.wait(5.5) or "late")
        return {"cursor": 1, "done": True}

    try:
        run, _ = start_job_run("tests.slow_returner")
        report = run_due_jobs(jobs=["tests.slow_returner"])
        run.refresh_from_db()
        assert report.timed_out == 1 and report.retrying == 1, report
        assert run.status == Status.RUNNING and run.cursor is None and run.attempts == 1
        assert "PassTimedOut" in run.last_error and "timeout of 0:00:05" in run.last_error
        # The step that completed stays memoized: the next attempt does not run it again.
        assert JobStep.objects.get(run=run, step="s").result == '"late"'
    finally:
        unregister("tests.slow_returner")


def test_short_steps_cost_no_renewal_and_a_long_body_is_renewed(behaviour):
    """D17's cost: step records renew the lease; the keep-alive speaks only while a body outlives a third of it."""
    gate = threading.Event()
    behaviour["short"] = lambda p: [p.step(f"s{n}", lambda: n) for n in range(20)] and {"done": True}
    behaviour["long"] = lambda p: p.step("wait", lambda: gate.wait(LEASE * 0.8) or 1) and {"done": True}
    before = keepalive.renewals()
    start_job_run("tests.scripted", instance="short")
    assert run_due_jobs(lease_ttl=LEASE).completed == 1
    assert keepalive.renewals() == before
    start_job_run("tests.scripted", instance="long")
    assert run_due_jobs(lease_ttl=LEASE).completed == 1
    assert keepalive.renewals() - before >= 2  # at a third and at two thirds of the lease


def test_stopping_is_false_in_a_plain_pass_and_a_task_context_offers_it(behaviour):
    seen = []
    behaviour["look"] = lambda p: seen.append(p.stopping) or {"done": True}
    start_job_run("tests.scripted", instance="look")
    run_due_jobs()
    assert seen == [False]


def test_a_stop_signal_set_while_a_body_runs_sets_stopping(behaviour):
    stop = threading.Event()
    seen = []

    def body(p):
        stop.set()  # as the command's SIGTERM handler does
        seen.append(p.stopping)
        return {"cursor": 1}

    behaviour["stop"] = body
    start_job_run("tests.scripted", instance="stop")
    report = run_due_jobs(stop=stop, max_passes=3)
    assert seen == [True] and report.advanced == 1 and report.stopped  # no further pass taken


@pytest.mark.slow
def test_a_task_sees_stopping_on_sigterm_and_returns_what_it_has(tmp_path, effects):
    from tests.support.task_functions import stoppable_task

    (fifo,) = fifos(tmp_path, "entered")
    result = stoppable_task.enqueue(str(effects), str(fifo))
    worker = manage("run_due_jobs", "--json", "--holder", "A")
    assert entered(fifo) == worker.pid
    worker.send_signal(signal.SIGTERM)
    report = report_of(worker)
    assert report["completed"] == 1, report
    result.refresh()
    assert result.status == "SUCCESSFUL" and 0 < result.return_value < 100_000
    assert effects.read_text().splitlines() == [f"stopped {result.return_value}"]


def test_a_body_whose_renewals_fail_is_asked_to_stop_while_its_lease_is_still_its_own(behaviour):
    """Another connection holds the run's row (SQLite: the write lock) so that no renewal can land:
    the body is told to stop (p.stopping) a quarter of a lease before the lease can lapse, so a
    body that checks it has ended before any other drive may take the run over (D17, D18)."""
    started, seen_it, done = threading.Event(), threading.Event(), threading.Event()
    held: dict = {}

    def body(p):
        started.set()
        while not p.stopping and not done.is_set():
            time.sleep(0.02)
        held["seen"] = timezone.now()
        seen_it.set()
        return {"cursor": 1}

    def hold_the_row(run_id):
        try:
            with transaction.atomic():
                JobRun.objects.filter(pk=run_id).update(paused_at=None)  # a row lock; on SQLite the write lock
                held["expires"] = JobRun.objects.get(pk=run_id).lease_expires_at
                seen_it.wait(LEASE * 3)
        finally:
            connections.close_all()

    behaviour["blocked"] = body
    run, _ = start_job_run("tests.scripted", instance="blocked")
    drive = threading.Thread(target=lambda: run_due_jobs(lease_ttl=LEASE) and connections.close_all())
    drive.start()
    assert started.wait(30)
    holder = threading.Thread(target=hold_the_row, args=[run.pk])
    holder.start()
    holder.join(LEASE * 4)
    done.set()
    drive.join(60)
    assert "seen" in held, "the body was never asked to stop"
    # By the one host's clock: the body saw it should stop at least a fifth of a lease before its lease
    # (as the database holds it, renewals blocked) could lapse.
    assert held["expires"] - held["seen"] >= timedelta(seconds=LEASE / 5), (held["expires"], held["seen"])
