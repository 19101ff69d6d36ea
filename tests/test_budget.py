"""A drive with a time budget (D14): it uses the budget, takes work that arrives, and waits when idle."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.exceptions import InvalidDriveOptions
from django_jobruns.models import JobRun, Status
from django_jobruns.signals import run_completed
from tests import jobs
from tests.conftest import Clock

pytestmark = pytest.mark.django_db(transaction=True)


class StopWhen:
    """A stop signal set by a receiver of run_completed once ``count`` runs completed."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.done = 0
        self.event = threading.Event()

    def __enter__(self) -> threading.Event:
        run_completed.connect(self.completed, weak=False, dispatch_uid="stop-when")
        return self.event

    def __exit__(self, *exc) -> None:
        run_completed.disconnect(dispatch_uid="stop-when")

    def completed(self, sender, **kwargs) -> None:
        self.done += 1
        if self.done >= self.count:
            self.event.set()


def test_with_a_budget_every_pass_of_every_run_is_driven_in_one_call():
    jobs.BEHAVIOUR.update(
        {f"b{i}": (lambda p: {"cursor": (p.cursor or 0) + 1, "done": p.cursor == 4}) for i in range(3)}
    )
    for i in range(3):
        start_job_run("tests.scripted", instance=f"b{i}")
    with StopWhen(3) as stop:
        report = run_due_jobs(max_seconds=60, stop=stop, limit=2)
    assert report.completed == 3 and report.advanced == 3 * 4 and report.stopped
    assert JobRun.objects.filter(status=Status.DONE).count() == 3


def test_without_a_budget_it_stays_one_bounded_pass():
    jobs.BEHAVIOUR["one"] = lambda p: {"cursor": (p.cursor or 0) + 1}
    start_job_run("tests.scripted", instance="one")
    report = run_due_jobs()
    assert report.advanced == 1 and report.attempted == 1


class FastClock(Clock):
    """Once started, every reading is ten minutes after the last: a backoff ends while the drive still runs."""

    running = False

    def __call__(self):
        if self.running:
            self.advance(minutes=10)
        return self.now


def test_a_budgeted_drive_takes_runs_that_become_due_meanwhile_backoffs_included():
    clock = FastClock()
    calls = []

    def flaky(p):
        calls.append(1)
        if len(calls) == 1:
            clock.running = True
            raise ConnectionError("upstream down")
        return {"done": True}

    jobs.BEHAVIOUR["flaky"] = flaky
    start_job_run("tests.scripted", instance="flaky")
    with StopWhen(1) as stop:
        report = run_due_jobs(max_seconds=60, stop=stop, now=clock)
    assert report.retrying == 1 and report.completed == 1 and len(calls) == 2


def test_a_waiting_drive_is_woken_by_a_start_and_stops_at_once_on_its_signal():
    stop = threading.Event()
    reports = []

    def drive():
        try:
            reports.append(run_due_jobs(max_seconds=600, stop=stop))
        finally:
            connections.close_all()

    jobs.BEHAVIOUR["woken"] = lambda p: (stop.set(), {"done": True})[1]
    thread = threading.Thread(target=drive)
    thread.start()
    try:
        if connection.vendor == "postgresql":
            # The drive found nothing and LISTENs: observe it, then start.
            with connection.cursor() as cur:
                for _ in range(600):
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN django_jobruns'")
                    if cur.fetchone()[0]:
                        break
                    threading.Event().wait(0.05)
                else:
                    raise AssertionError("the drive never listened")
        start_job_run("tests.scripted", instance="woken")
        thread.join(timeout=60)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    (report,) = reports
    assert report.completed == 1 and report.stopped


def test_budget_and_passes_are_checked_before_anything_is_claimed():
    bad: Any
    for bad in (0, -1, float("nan"), float("inf"), "5", True, 10**6):
        with pytest.raises(InvalidDriveOptions, match="max_seconds"):
            run_due_jobs(max_seconds=bad)
    with pytest.raises(InvalidDriveOptions, match="max_passes"):
        run_due_jobs(max_seconds=5, max_passes=0)


def test_max_passes_caps_the_passes_per_claim_within_a_budget():
    jobs.BEHAVIOUR["capped"] = lambda p: {"cursor": (p.cursor or 0) + 1, "done": p.cursor == 5}
    run, _ = start_job_run("tests.scripted", instance="capped")
    with StopWhen(1) as stop:
        report = run_due_jobs(max_seconds=60, max_passes=2, stop=stop)
    # Claimed three times, two passes each (the last one completing): the cap is per claim.
    assert report.completed == 1 and report.attempted == 3 and report.advanced == 5
    assert JobRun.objects.get(pk=run.pk).lease_fence == 3
