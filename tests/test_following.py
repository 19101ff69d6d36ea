"""The next run claimed with the ending write of the one before it: one commit per task (issue 33, D2, D7, D10)."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest
from django.db import connection

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.drive import drive_run
from django_jobruns.models import JobAttempt, JobRun, Status
from tests.conftest import is_postgres, wait_until
from tests.test_costs import _counting_commits


@pytest.mark.django_db(transaction=True)
def test_tasks_driven_one_after_another_cost_one_commit_each_after_the_first(monkeypatch):
    from tests.support import task_functions as t

    results = [t.add.enqueue(i, 1) for i in range(10)]
    commits, counting = _counting_commits(monkeypatch)
    with counting:
        report = run_due_jobs()
    assert report.completed == 10
    assert len(commits) <= 11, commits
    for i, result in enumerate(results):
        result.refresh()
        assert result.return_value == i + 1 and result.errors == [] and len(result.worker_ids) == 1
        (attempt,) = JobAttempt.objects.filter(run_id=result.id)
        assert attempt.number == 1 and attempt.ended_at is not None and attempt.error_class is None


@pytest.mark.django_db(transaction=True)
def test_job_runs_cost_k_plus_one_commits_a_pass_after_the_first(monkeypatch, behaviour):
    def handler(p):
        for i in range(2):
            p.step(f"s{i}", lambda i=i: i)
        return {"done": True}

    runs = []
    for i in range(5):
        behaviour[f"k{i}"] = handler
        runs.append(start_job_run("tests.scripted", instance=f"k{i}")[0])
    commits, counting = _counting_commits(monkeypatch)
    with counting:
        report = run_due_jobs()
    assert report.completed == 5
    # Per run: its two steps and its commit, which also claims the next run; the first claim is its own.
    assert len(commits) <= 5 * 3 + 1, commits
    assert all(r.status == Status.DONE and r.lease_holder is None for r in JobRun.objects.filter(pk__in=runs))


@pytest.mark.django_db(transaction=True)
def test_a_drive_asked_to_stop_during_a_body_claims_nothing_with_its_ending_write():
    from tests.support import task_functions as t

    stop = threading.Event()
    first = t.set_event.enqueue("stop")
    second = t.add.enqueue(1, 2)
    t.EVENTS["stop"] = stop
    try:
        report = run_due_jobs(stop=stop)
    finally:
        t.EVENTS.pop("stop", None)
    assert report.completed == 1 and report.stopped
    first.refresh()
    assert first.status.name == "SUCCESSFUL"
    _untouched_then_run_once(second, 3)


def _untouched_then_run_once(result: Any, value: int) -> None:
    """The task's run as it was enqueued (no lease, no attempt, no record), and the next drive runs it once."""
    run = JobRun.objects.get(pk=result.id)
    assert run.status == Status.RUNNING and run.lease_holder is None and run.lease_expires_at is None
    assert run.attempts == 0 and not JobAttempt.objects.filter(run_id=result.id).exists()
    assert run_due_jobs().completed == 1
    result.refresh()
    assert result.return_value == value and len(result.worker_ids) == 1


@pytest.mark.django_db(transaction=True)
def test_a_run_claimed_as_the_drive_stops_is_given_back_with_its_attempt_record():
    """The stop comes after the ending write held (and claimed the next): the next run is given back unstarted."""
    from tests.support import task_functions as t
    from tests.test_backend import task_finished

    stop = threading.Event()
    first = t.add.enqueue(1, 1)
    second = t.add.enqueue(2, 2)
    seen: list[Any] = []

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result.id)
        if task_result.id == first.id:
            # The ending write of the first held, with the claim of the second in its transaction.
            run = JobRun.objects.get(pk=second.id)
            seen.append((run.lease_holder is not None, JobAttempt.objects.filter(run_id=second.id).count()))
            stop.set()

    task_finished.connect(on_finished)
    try:
        report = run_due_jobs(stop=stop)
    finally:
        task_finished.disconnect(on_finished)
    assert seen[:2] == [first.id, (True, 1)], seen
    assert report.completed == 1 and report.stopped and report.attempted == 1
    _untouched_then_run_once(second, 4)


@pytest.mark.django_db(transaction=True)
def test_a_next_run_another_worker_took_meanwhile_is_not_claimed_again(behaviour):
    """Another holder drives the next run to its end while this drive's first pass runs: skipped, run once."""
    done = []

    def second(p):
        done.append("second")
        return {"done": True}

    def first(p):
        worker = threading.Thread(target=lambda: (drive_run(runs[1], holder="other"), _close()))
        worker.start()
        worker.join()
        return {"done": True}

    behaviour["a"], behaviour["b"] = first, second
    runs = [start_job_run("tests.scripted", instance=name)[0].id for name in ("a", "b")]
    report = run_due_jobs()
    assert done == ["second"]
    assert report.completed == 1 and report.skipped == 1
    assert JobRun.objects.get(pk=runs[1]).status == Status.DONE


def _close() -> None:

    connection.close()


class _RowHeld:
    """Another transaction holding a run's row ``FOR UPDATE``, on a thread of its own, until released."""

    def __init__(self) -> None:
        self.locked, self.unlock = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None

    def hold(self, run_id: str) -> None:
        """Lock the row; return once it is held."""
        self.thread = threading.Thread(target=self._hold, args=(run_id,))
        self.thread.start()
        assert self.locked.wait(timeout=30)

    def _hold(self, run_id: str) -> None:
        from django.db import connections, transaction

        try:
            with transaction.atomic():
                list(JobRun.objects.select_for_update().filter(pk=run_id))
                self.locked.set()
                self.unlock.wait(timeout=60)
        finally:
            connections.close_all()

    def release(self) -> None:
        self.unlock.set()
        if self.thread is not None:
            self.thread.join()


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="a row lock held FOR UPDATE needs row locks")
@pytest.mark.django_db(transaction=True)
def test_a_next_run_whose_row_another_transaction_holds_locked_does_not_hold_the_last_runs_commit(behaviour):
    """The claim riding with the first run's commit passes over a locked row instead of waiting for it."""
    held = _RowHeld()

    def first(p):
        held.hold(runs[1])
        return {"done": True}

    behaviour["a"], behaviour["b"] = first, lambda p: {"done": True}
    runs = [start_job_run("tests.scripted", instance=name)[0].id for name in ("a", "b")]
    before = JobRun.objects.get(pk=runs[1])
    try:
        # Unbounded by the lock's wait: a statement waiting on the row would be cut at half the lease.
        report = run_due_jobs(lease_ttl=60)
    finally:
        held.release()
    assert report.completed == 1 and report.skipped == 1 and report.unrecorded == [], report
    assert JobRun.objects.get(pk=runs[0]).status == Status.DONE
    after = JobRun.objects.get(pk=runs[1])
    assert after.lease_fence == before.lease_fence and after.lease_holder is None and after.attempts == 0
    assert run_due_jobs().completed == 1


@pytest.mark.django_db(transaction=True)
def test_a_task_found_stale_under_its_claim_keeps_no_attempt_record_begun_with_it():
    """Paused between the due read and the claim (here: a drive of that one run): given back as stale, no attempt."""
    from django.utils import timezone

    from tests.support import task_functions as t

    result = t.add.enqueue(2, 3)
    JobRun.objects.filter(pk=result.id).update(paused_at=timezone.now())
    report = drive_run(result.id)
    assert report.stale == 1 and report.completed == 0
    assert not JobAttempt.objects.filter(run_id=result.id).exists()
    JobRun.objects.filter(pk=result.id).update(paused_at=None)
    assert run_due_jobs().completed == 1
    result.refresh()
    assert result.return_value == 5 and len(result.worker_ids) == 1
    assert JobAttempt.objects.filter(run_id=result.id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_tasks_claimed_together_as_a_round_begins_each_have_their_attempt_record(monkeypatch):
    """With three threads the round's first three tasks are claimed in one transaction, attempt records begun."""
    from django_jobruns.store import store
    from tests.support import task_functions as t

    together: list[int] = []
    vendor = type(store())
    real = vendor.claim_together

    def counted(self: Any, claims: Any) -> Any:
        found = real(self, claims)
        together.append(sum(claimed is not None for claimed in found))
        return found

    monkeypatch.setattr(vendor, "claim_together", counted)
    results = [t.add.enqueue(i, 1) for i in range(6)]
    report = run_due_jobs(concurrency=3)
    assert report.completed == 6 and together == [3], (report, together)
    for i, result in enumerate(results):
        result.refresh()
        assert result.return_value == i + 1 and result.errors == [] and len(result.worker_ids) == 1
        (attempt,) = JobAttempt.objects.filter(run_id=result.id)
        assert attempt.number == 1 and attempt.ended_at is not None and attempt.error_class is None


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="a row lock held FOR UPDATE needs row locks")
@pytest.mark.django_db(transaction=True)
def test_the_claims_of_a_rounds_first_runs_pass_over_a_row_another_transaction_holds_locked(behaviour):
    """Waiting on the row would hold the rows already claimed in the transaction: it is passed over, as skipped."""
    behaviour["a"], behaviour["b"] = (lambda p: {"done": True}), (lambda p: {"done": True})
    runs = [start_job_run("tests.scripted", instance=name)[0].id for name in ("a", "b")]
    held = _RowHeld()
    held.hold(runs[0])
    try:
        # Unbounded by the lock's wait: a statement waiting on the row would be cut at half the lease.
        report = run_due_jobs(concurrency=2, lease_ttl=60)
    finally:
        held.release()
    assert report.completed == 1 and report.skipped == 1 and report.unrecorded == [], report
    first = JobRun.objects.get(pk=runs[0])
    assert first.lease_fence == 0 and first.lease_holder is None and first.attempts == 0
    assert JobRun.objects.get(pk=runs[1]).status == Status.DONE
    assert run_due_jobs().completed == 1


@pytest.mark.django_db(transaction=True)
def test_when_the_claims_of_a_rounds_first_runs_fail_each_thread_claims_its_own(behaviour, monkeypatch, caplog):
    """The transaction that claims them together fails (the connection dropped): nothing claimed, nothing lost."""
    from django.db import OperationalError

    from django_jobruns.store import store

    def dropped(self: Any, claims: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(type(store()), "claim_together", dropped)
    runs = []
    for name in ("a", "b", "c"):
        behaviour[name] = lambda p: {"done": True}
        runs.append(start_job_run("tests.scripted", instance=name)[0].id)
    report = run_due_jobs(concurrency=3)
    assert report.completed == 3 and report.skipped == 0 and report.unrecorded == [], report
    assert "the claims of the round's first runs failed" in caplog.text
    assert all(r.status == Status.DONE and r.lease_fence == 1 for r in JobRun.objects.filter(pk__in=runs))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_claimed_run_reads_its_datetimes_to_the_microsecond_as_the_orm_does(behaviour, concurrency):
    """Each way a run is claimed (alone, with the last commit, several together) hands the pass the row's times."""
    from datetime import timedelta

    from django.utils import timezone

    seen = {}

    def handler(p):
        row = p._row
        seen[row.id] = (row.started_at, row.next_attempt_at, row.paused_at)
        return {"done": True}

    base = timezone.now() - timedelta(hours=1)
    runs = {}
    for i in range(4):
        behaviour[f"t{i}"] = handler
        run_id = start_job_run("tests.scripted", instance=f"t{i}")[0].pk
        # Times with microseconds that no float of seconds since the epoch holds exactly.
        times = {
            "started_at": base + timedelta(microseconds=123_457 + i),
            "next_attempt_at": base + timedelta(minutes=30, microseconds=999_999 - i),
        }
        assert JobRun.objects.filter(pk=run_id).update(**times)
        runs[run_id] = JobRun.objects.get(pk=run_id)  # as the ORM reads them
    report = run_due_jobs(concurrency=concurrency)
    assert report.completed == 4
    for run_id, run in runs.items():
        started, retry, paused = seen[run_id]
        assert (started, retry, paused) == (run.started_at, run.next_attempt_at, None)
        assert started.microsecond == run.started_at.microsecond and started.utcoffset() == run.started_at.utcoffset()


@pytest.mark.django_db(transaction=True)
def test_a_drive_with_threads_looks_again_for_due_runs_while_its_rounds_long_run_goes_on(behaviour):
    """A round of a drive with threads ended with its longest run: a run due meanwhile waited for it, threads idle."""
    later_due, later_ran, stop = threading.Event(), threading.Event(), threading.Event()
    waited: list[bool] = []

    def long(p: Any) -> dict[str, Any]:
        start_job_run("tests.scripted", instance="later")
        later_due.set()
        waited.append(later_ran.wait(timeout=20))  # driven by the other thread, while this run goes on
        stop.set()
        return {"done": True}

    def short(p: Any) -> dict[str, Any]:
        later_due.wait(timeout=20)  # the round's line is empty as this run ends: the later run is due then
        return {"done": True}

    def later(p: Any) -> dict[str, Any]:
        later_ran.set()
        return {"done": True}

    behaviour.update({"a-long": long, "b-short": short, "later": later})
    for instance in ("a-long", "b-short"):  # due in this order: a round of both, one thread each
        start_job_run("tests.scripted", instance=instance)
    report = run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop)
    assert waited == [True]
    assert report.completed == 3 and report.skipped == 0
    assert JobRun.objects.filter(status=Status.DONE).count() == 3


def _runs_then_stop(behaviour: dict[str, Any], count: int, stop: threading.Event) -> None:
    """``count`` runs; the last to end sets ``stop``."""
    finished: list[str] = []
    lock = threading.Lock()

    def handler(p: Any) -> dict[str, Any]:
        with lock:
            finished.append(p.run.instance)
            if len(finished) == count:
                stop.set()
        return {"done": True}

    for i in range(count):
        behaviour[f"t{i}"] = handler
        start_job_run("tests.scripted", instance=f"t{i}")


@pytest.mark.django_db(transaction=True)
def test_a_look_again_that_fails_ends_the_round_as_its_runs_end_and_the_drive_goes_on(behaviour, monkeypatch, caplog):
    from django.db import OperationalError

    from django_jobruns import drive
    from django_jobruns.due import due_rows as real

    stop, reads = threading.Event(), []

    def due_rows(*args: Any, **kwargs: Any) -> Any:
        reads.append(threading.current_thread().name)
        if len(reads) == 2:  # the first look again, from a thread of the drive
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(drive, "due_rows", due_rows)
    _runs_then_stop(behaviour, 6, stop)
    with caplog.at_level("WARNING", logger="django_jobruns"):
        report = run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop)
    assert report.completed == 6 and report.errors == [] and report.unrecorded == []
    assert reads[1].startswith("jobruns")  # the look that failed was a thread's, not the round's
    said = [record.getMessage() for record in caplog.records if "the due read failed" in record.getMessage()]
    assert said == [
        "the due read failed (OperationalError: server closed the connection unexpectedly); "
        "made again as the round ends"
    ], said


@pytest.mark.django_db(transaction=True)
def test_a_thread_with_no_run_reads_what_is_due_once_a_poll_while_another_threads_run_goes_on(behaviour, monkeypatch):
    """A thread that found nothing waits between looks: it must not read what is due again and again."""
    import time

    from django_jobruns import drive
    from django_jobruns.due import due_rows as real
    from django_jobruns.store import notify

    every = 0.05
    monkeypatch.setattr(notify, "POLL_SECONDS", every)
    reads: list[float] = []
    enough, stop = threading.Event(), threading.Event()

    def due_rows(*args: Any, **kwargs: Any) -> Any:
        reads.append(time.monotonic())
        if len(reads) == 6:
            enough.set()
        return real(*args, **kwargs)

    def long(p: Any) -> dict[str, Any]:
        assert enough.wait(timeout=20)  # the other thread's looks while this run goes on
        stop.set()
        return {"done": True}

    monkeypatch.setattr(drive, "due_rows", due_rows)
    behaviour.update({"a-long": long, "b-short": lambda p: {"done": True}})
    start_job_run("tests.scripted", instance="a-long")
    start_job_run("tests.scripted", instance="b-short")
    report = run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop)
    assert report.completed == 2
    # The round's read, then the idle thread's looks: none sooner than the poll after the one before.
    gaps = [later - earlier for earlier, later in zip(reads[1:6], reads[2:6], strict=False)]
    assert all(gap >= every * 0.99 for gap in gaps), gaps


@pytest.mark.django_db(transaction=True)
def test_a_look_again_passes_over_a_run_another_thread_is_claiming_with_its_commit(behaviour, monkeypatch):
    """A row taken from the line, its claim not yet written, is still due: a look must not give it to another thread."""
    from django_jobruns.following import Line

    popped, looked, stop = threading.Event(), threading.Event(), threading.Event()
    bodies: list[str] = []
    lock = threading.Lock()
    real_following, real_refill = Line.following, Line.refill

    def following(self: Line, *args: Any) -> Any:
        chosen = real_following(self, *args)
        if chosen is not None and chosen.row.id == last.id:
            popped.set()  # the last run taken to be claimed with this thread's commit, not claimed yet
            looked.wait(timeout=20)  # while the other thread, its line empty, looks again
        return chosen

    def refill(self: Line, rows: list[Any]) -> None:
        try:
            real_refill(self, rows)
        finally:
            looked.set()

    def body(p: Any) -> dict[str, Any]:
        with lock:
            bodies.append(p.run.instance)
            second = len(bodies) == 2
        if second:
            popped.wait(timeout=20)  # ends once the other thread's commit has taken the last run
        return {"done": True}

    monkeypatch.setattr(Line, "following", following)
    monkeypatch.setattr(Line, "refill", refill)
    behaviour.update({"a": body, "b": body, "c": body})
    start_job_run("tests.scripted", instance="a")
    start_job_run("tests.scripted", instance="b")
    last = start_job_run("tests.scripted", instance="c")[0]
    reports: list[Any] = []

    def drive() -> None:
        try:
            reports.append(run_due_jobs(concurrency=2, limit=3, max_seconds=120, stop=stop))
        finally:
            connection.close()  # this thread's

    driving = threading.Thread(target=drive)
    driving.start()
    try:
        # Stopped once the runs are done, not by the last body: a drive stopping claims nothing with its commit.
        wait_until(lambda: JobRun.objects.filter(status=Status.DONE).count() == 3, "the three runs done")
    finally:
        stop.set()
        driving.join(timeout=60)
    (report,) = reports
    assert popped.is_set() and looked.is_set()
    assert report.completed == 3 and report.skipped == 0, report
    assert sorted(bodies) == ["a", "b", "c"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("alone", [True, False], ids=["its-only-run", "after-its-other-thread-found-nothing"])
def test_a_drive_with_threads_drives_a_run_started_while_a_long_run_goes_on(behaviour, alone):
    """A long run (a task's body, a long pass) held the round: a run started meanwhile waited for it, threads idle."""
    idle, later_ran, stop = threading.Event(), threading.Event(), threading.Event()
    waited: list[bool] = []

    def long(p: Any) -> dict[str, Any]:
        if not alone:
            idle.wait(timeout=20)  # the short run has ended and its thread found nothing due
        start_job_run("tests.scripted", instance="later")
        waited.append(later_ran.wait(timeout=20))  # driven by another thread, while this run goes on
        stop.set()
        return {"done": True}

    def short(p: Any) -> dict[str, Any]:
        return {"done": True}

    def later(p: Any) -> dict[str, Any]:
        later_ran.set()
        return {"done": True}

    behaviour.update({"a-long": long, "b-short": short, "later": later})
    start_job_run("tests.scripted", instance="a-long")
    if not alone:
        start_job_run("tests.scripted", instance="b-short")

        def watch() -> None:
            try:
                wait_until(lambda: JobRun.objects.filter(status=Status.DONE).count() == 1, "the short run done", 20)
                idle.set()
            finally:
                connection.close()  # this thread's

        threading.Thread(target=watch, daemon=True).start()
    report = run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop)
    assert waited == [True]
    assert report.completed == (2 if alone else 3) and report.skipped == 0


@pytest.mark.django_db(transaction=True)
def test_a_round_that_goes_on_has_the_database_clock_read_again_by_the_drives_own_thread(behaviour, monkeypatch):
    """Rounds of a drive with threads no longer end to read the clock: the drive's own thread reads it meanwhile."""
    from django_jobruns import db

    main = threading.main_thread()
    reads = {"main": 0, "at the long run's start": -1}
    twice = threading.Event()
    originals = {cls: cls.refresh for cls in (db.HostClock, db.ServerClock)}

    def counting(cls: Any) -> Any:
        def refresh(self: Any) -> None:
            originals[cls](self)
            if threading.current_thread() is main:
                reads["main"] += 1
                if reads["at the long run's start"] >= 0 and reads["main"] >= reads["at the long run's start"] + 2:
                    twice.set()

        return refresh

    for cls in originals:
        monkeypatch.setattr(cls, "refresh", counting(cls))
    monkeypatch.setattr(db, "CLOCK_REFRESH_SECONDS", 0.1)
    stop = threading.Event()
    read_meanwhile: list[bool] = []

    def long(p: Any) -> dict[str, Any]:
        reads["at the long run's start"] = reads["main"]
        read_meanwhile.append(twice.wait(timeout=20))  # the clock read twice by the drive's own thread meanwhile
        stop.set()
        return {"done": True}

    behaviour.update({"a-long": long, "b-short": lambda p: {"done": True}})
    start_job_run("tests.scripted", instance="a-long")
    start_job_run("tests.scripted", instance="b-short")
    report = run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop)
    assert read_meanwhile == [True]
    assert report.completed == 2


@pytest.mark.django_db(transaction=True)
def test_a_body_that_exits_in_a_thread_ends_the_round_at_once_with_threads_waiting_for_work(behaviour):
    """A thread with no run waits while a run of the round goes on: an exit from that run must not leave it waiting."""
    raised: list[BaseException] = []

    def drive() -> None:
        try:
            run_due_jobs(concurrency=2, limit=2, max_seconds=120)
        except BaseException as exc:
            raised.append(exc)
        finally:
            connection.close()  # this thread's

    behaviour["exits"] = lambda p: sys.exit(4)
    start_job_run("tests.scripted", instance="exits")
    driving = threading.Thread(target=drive, daemon=True)
    driving.start()
    driving.join(timeout=20)  # the budget is 120 s: the exit, not the budget, ends the drive
    assert not driving.is_alive() and len(raised) == 1
    assert isinstance(raised[0], SystemExit) and raised[0].code == 4
    assert JobRun.objects.get().last_error.startswith("SystemExit: 4")


@pytest.mark.django_db(transaction=True)
def test_a_notify_wakes_a_thread_waiting_for_work_while_a_long_run_goes_on(behaviour, monkeypatch):
    """On PostgreSQL a start's NOTIFY reaches a thread of the round that has no run, not only the drive's wait."""
    if not is_postgres():
        pytest.skip("NOTIFY is PostgreSQL's")
    from django_jobruns.store import notify

    monkeypatch.setattr(notify, "POLL_SECONDS", 60.0)  # no look again but for the NOTIFY
    later_ran, stop = threading.Event(), threading.Event()
    waited: list[bool] = []

    def long(p: Any) -> dict[str, Any]:
        start_job_run("tests.scripted", instance="later")
        waited.append(later_ran.wait(timeout=20))
        stop.set()
        return {"done": True}

    def later(p: Any) -> dict[str, Any]:
        later_ran.set()
        return {"done": True}

    behaviour.update({"a-long": long, "later": later})
    start_job_run("tests.scripted", instance="a-long")
    report = run_due_jobs(concurrency=2, limit=2, max_seconds=120, stop=stop)
    assert waited == [True]
    assert report.completed == 2
