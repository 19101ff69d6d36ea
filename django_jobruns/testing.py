"""Helpers for testing your own jobs.

``drive_to_completion(run)`` drives one run until it is done or failed, skipping
its backoff waits. ``assert_resumable(job)`` proves in one line that a job's
resume is real: it runs the job once straight through, then again with a
simulated crash after every step boundary of every pass, and fails -- saying
exactly what went wrong -- if a completed step ran again, if a memo went unused
(a step name that is not a pure function of the payload and prior results), or
if the final cursor or counters differ from the straight run's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from . import passes
from .drive import PassObserver, drive_run, observing
from .models import JobRun, Status
from .outcomes import Outcome, PassOutcome
from .registry import Job, get_job
from .starts import start_job_run

__all__ = ["assert_resumable", "drive_to_completion"]


def drive_to_completion(
    run: JobRun | str,
    *,
    max_passes: int = 1000,
    now: Callable[[], datetime] | None = None,
    allow_failure: bool = False,
) -> JobRun:
    """Drive ``run`` pass after pass until it finishes; return it fresh from the database.

    Backoff waits are skipped: the clock handed to the drive jumps to each retry
    as it comes due. Raises ``AssertionError`` if the run is still running after
    ``max_passes`` passes, and -- unless ``allow_failure`` -- if it ends
    ``failed``, with the run's last error in the message (a test of a failure
    path passes ``allow_failure=True`` and inspects the run).
    """
    run_id = run.pk if isinstance(run, JobRun) else run
    base = now or timezone.now
    skew = timedelta(0)

    def clock() -> datetime:
        return base() + skew

    for _ in range(max_passes):
        current = JobRun.objects.get(pk=run_id)
        if current.status != Status.RUNNING:
            return _finished(current, allow_failure)
        waits = [t for t in (current.next_attempt_at, current.lease_expires_at) if t is not None]
        ahead = max(waits, default=None)
        if ahead is not None and ahead > clock():
            skew += ahead - clock()
        drive_run(run_id, now=clock)
    current = JobRun.objects.get(pk=run_id)
    if current.status == Status.RUNNING:
        raise AssertionError(f"run {run_id} is still running after {max_passes} passes (cursor {current.cursor})")
    return _finished(current, allow_failure)


def _finished(run: JobRun, allow_failure: bool) -> JobRun:
    if run.status == Status.FAILED and not allow_failure:
        raise AssertionError(f"run {run.pk} ({run.label} [{run.instance}]) failed: {run.last_error}")
    return run


class SimulatedCrash(passes.AbandonPass):
    """Raised after a step's memo committed, as if the process died there.

    A BaseException, so neither the drive nor a handler's ``except Exception``
    can swallow it: the pass is abandoned exactly as a killed worker's is (its
    lease lapses, and the takeover charges it).
    """


@dataclass
class _RunState:
    pass_number: int = 0
    position: int = 0
    completed: dict[tuple[int, int], str] = field(default_factory=dict)


@dataclass
class _Observer(PassObserver):
    """Sees every step body of the drives it observes; crashes the pass after the ``crash_after``-th fresh step."""

    crash_after: int | None = None
    fresh_steps: int = 0
    runs: dict[str, _RunState] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    label: str = ""

    def pass_started(self, run: JobRun) -> None:
        self.runs.setdefault(run.id, _RunState()).position = 0

    def step(
        self, p: passes.Pass, name: str, body: Callable[[], Any], perform: Callable[[Callable[[], Any]], Any]
    ) -> Any:
        state = self.runs.setdefault(p.run.id, _RunState())
        position = state.position
        state.position += 1
        key = (state.pass_number, position)
        ran: list[bool] = []

        def watched() -> Any:
            # Checked as the body starts, so a re-run is caught even if its
            # record then fails.
            before = state.completed.get(key)
            where = f"{self.label}: pass {state.pass_number + 1}, step #{position + 1}"
            if before == name:
                self.problems.append(f"{where} {name!r} ran again after it had completed")
            elif before is not None:
                self.problems.append(
                    f"{where} was {before!r} before the crash and {name!r} after it, and ran again: step names "
                    "must be a pure function of the payload and prior results"
                )
            ran.append(True)
            return body()

        result = perform(watched)
        if ran:
            state.completed[key] = name
            self.fresh_steps += 1
            if self.crash_after == self.fresh_steps:
                raise SimulatedCrash(f"simulated crash after step {name!r}")
        return result

    def pass_ended(self, run: JobRun, outcome: PassOutcome) -> None:
        state = self.runs.setdefault(run.id, _RunState())
        if outcome.warning:
            self.problems.append(f"{self.label}: {outcome.warning}")
        if outcome.status in (Outcome.ADVANCED, Outcome.COMPLETED):
            state.pass_number += 1


def _drive(run: JobRun, observer: _Observer, max_passes: int) -> JobRun:
    for _ in range(max_passes):
        try:
            return drive_to_completion(run, max_passes=max_passes, allow_failure=True)
        except SimulatedCrash:
            continue  # the worker "died"; the next drive resumes the run
    raise AssertionError(f"{observer.label}: run {run.pk} kept crashing")


def assert_resumable(
    job: Job | str,
    *,
    payload: Any = None,
    instance: str = "assert-resumable",
    max_passes: int = 1000,
    crash_points: int | None = None,
) -> None:
    """Fail unless ``job`` resumes exactly where it stopped, after a crash at any step boundary.

    Runs the job straight through once, then once more for every step the
    straight run completed, crashing right after that step's memo committed and
    resuming. Raises ``AssertionError`` listing every problem found:

    - a completed step that ran again on resume;
    - a memo left unused by a committed pass (rule P8: a step name that is not a
      pure function of the payload and prior results);
    - a final cursor or counters different from the straight run's, or a run
      that did not finish as the straight run did.

    Each run uses its own instance (``instance``, suffixed), so nothing joins a
    live run of yours. Needs the database (a ``django_db`` test).

    Its cost: a job of n steps is run n + 1 times, and each run replays the steps
    before its crash point, so about n²/2 steps in all (40 steps: some 800).
    ``crash_points=k`` crashes at k boundaries only, spread evenly from the first
    to the last (the same ones every time, so a failure reproduces): k + 1 runs.
    """
    if crash_points is not None and (
        isinstance(crash_points, bool) or not isinstance(crash_points, int) or crash_points < 1
    ):
        raise ValueError(f"crash_points must be a whole number of 1 or more, got {crash_points!r}")
    entry = get_job(job)
    straight = _Observer(label="straight run")
    with observing(straight):
        run, _ = start_job_run(entry, instance=f"{instance}:straight", payload=payload)
        expected = _drive(run, straight, max_passes)
    problems = list(straight.problems)
    boundaries = straight.fresh_steps
    for boundary in _crash_points(boundaries, crash_points):
        observer = _Observer(crash_after=boundary, label=f"crash after step {boundary} of {boundaries}")
        with observing(observer):
            run, _ = start_job_run(entry, instance=f"{instance}:crash-{boundary}", payload=payload)
            final = _drive(run, observer, max_passes)
        problems.extend(observer.problems)
        for column in ("status", "cursor", "counters"):
            want, got = getattr(expected, column), getattr(final, column)
            if column != "status":
                want, got = json.loads(want) if want else want, json.loads(got) if got else got
            if want != got:
                problems.append(f"{observer.label}: final {column} {got!r} differs from the straight run's {want!r}")
    if problems:
        raise AssertionError(
            f"job {entry.label} is not resumable ({len(problems)} problem(s) over {boundaries} crash point(s)):\n- "
            + "\n- ".join(problems)
        )


def _crash_points(boundaries: int, wanted: int | None) -> list[int]:
    """Every step boundary, or ``wanted`` of them spread evenly from the first to the last."""
    if wanted is None or wanted >= boundaries:
        return list(range(1, boundaries + 1))
    if wanted == 1:
        return [boundaries]
    return sorted({round(1 + i * (boundaries - 1) / (wanted - 1)) for i in range(wanted)})
