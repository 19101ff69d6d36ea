"""The drive: one bounded pass that claims due runs, runs their passes, releases them.

Safe with any number of workers on any number of hosts: a run is driven only
under a claim (:mod:`.claims`: one conditional UPDATE that compares the fence
read with the due rows and sets a new one), every write of its pass carries
that fence, and the lease is given back in ``finally``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from . import conf, db, keepalive, telemetry
from .claims import Claim, Claimed
from .crew import Crew
from .due import due_rows
from .exceptions import InvalidDriveOptions
from .following import Following, Line, claim_failed, claim_together, drive_line, give_back
from .holders import default_holder, holder_name
from .models import JobRun, Status
from .options import DriveOptions, StopSignal, drive_clock, lease_length, positive_int
from .outcomes import TRANSIENT, Outcome, summary
from .passes import PassObserver as PassObserver  # the drive's hook for testing tools
from .passes import load_ledger, observing, run_pass
from .registry import Job, lookup
from .report import Count, DriveReport
from .schedules import look_at_schedules, until_next_tick
from .store import notify, watchdog
from .store.base import DueRow

__all__ = [
    "DriveOptions",
    "DriveReport",
    "PassObserver",
    "default_holder",
    "drive_run",
    "observing",
    "run_due_jobs",
]

logger = logging.getLogger("django_jobruns")


def run_due_jobs(
    *,
    limit: int | None = None,
    max_passes: int | None = None,
    holder: str | None = None,
    lease_ttl: timedelta | float | None = None,
    concurrency: int = 1,
    jobs: Iterable[Job | str] | None = None,
    stop: StopSignal | None = None,
    now: Callable[[], datetime] | None = None,
    max_seconds: float | None = None,
    queues: Iterable[str] | None = None,
) -> DriveReport:
    """Claim up to ``limit`` due runs, run up to ``max_passes`` passes of each, release them.

    Without ``max_seconds`` this is one bounded pass over what is due now, at
    most ``max_passes`` (default 1) passes per run. With ``max_seconds`` the
    drive keeps working until that many seconds are spent: further passes of
    the runs it holds (``max_passes``, default unlimited, then caps the passes
    per claim), and runs that become due meanwhile; when nothing is due it
    waits for work -- woken by NOTIFY on PostgreSQL, polling elsewhere -- and
    ``stop`` ends the wait at once. Then it finishes the pass in flight,
    releases, and returns.

    ``limit`` and ``lease_ttl`` default to ``JOBRUNS["DRIVE_LIMIT"]`` (50) and
    ``JOBRUNS["LEASE_TTL"]`` (30 s); a job's own ``@job(lease=…)`` wins
    over either. Options that cannot mean what they say raise
    :class:`InvalidDriveOptions` before anything is claimed. A run's failure
    never escapes: it is recorded on the run and reported in ``errors``.
    """
    db.refuse_callers_transaction()
    options = DriveOptions.from_arguments(
        limit=limit,
        max_passes=max_passes,
        holder=holder,
        lease_ttl=lease_ttl,
        concurrency=concurrency,
        jobs=jobs,
        stop=stop,
        now=now,
        max_seconds=max_seconds,
        queues=queues,
    )
    if isinstance(options.clock, db.InjectedClock):
        started = options.clock()
        if not isinstance(started, datetime) or timezone.is_naive(started):
            raise InvalidDriveOptions(f"now() must return an aware datetime, got {started!r}")

    report = DriveReport()
    if options.asked_to_stop():
        report.stopped = True
        return report
    if not options.jobs:
        return report
    with telemetry.traced_drive(options.holder) as traced:
        _drive(report, options, traced)
    if options.asked_to_stop():
        report.stopped = True  # asked to stop while its last pass ran (D18)
    return report


def _drive(report: DriveReport, options: DriveOptions, traced: telemetry.Traced | None) -> DriveReport:
    with Crew(options.concurrency) as crew:  # threads and their connections kept for the whole drive
        if options.budget is None:
            _round_on_a_live_connection(report, options, None, traced, crew)
            return report
        deadline = time.monotonic() + options.budget
        with notify.Waiter(options.stop, options.statement_bound) as waiter:
            while True:
                worked = _round_on_a_live_connection(report, options, deadline, traced, crew, waiter)
                if report.stopped or options.ending(deadline):
                    break  # asked to stop as the round's last pass ran: no other round begun
                if not worked:
                    waiter.wait(until_next_tick(report, options.clock(), deadline))
                    if options.asked_to_stop():
                        report.stopped = True
                        break
    return report


#: How often a drive's own thread, while its threads work, looks for a NOTIFY to pass on (``_Drive._meanwhile``).
HEAR_SECONDS = 0.05
#: The claims this process holds now (every drive's, every thread's): what a signal's message counts.
_in_flight: set[int] = set()


def in_flight() -> int:
    """How many runs this process is working on now (held under a claim)."""
    return len(_in_flight)


def _round_on_a_live_connection(
    report: DriveReport,
    options: DriveOptions,
    deadline: float | None,
    traced: telemetry.Traced | None,
    crew: Crew,
    waiter: notify.Waiter | None = None,
) -> bool:
    """One round; a connection lost under its due read is replaced and the read made again (D15).

    A run's own errors never reach here (each is reported on its run); what
    does is the database failing under the due read or the clock's reading. A
    drive with a time budget then waits and looks again, for as long as its
    budget lasts; a single pass tries once more on a new connection, and
    otherwise lets the error say the database cannot be reached.
    """
    first: BaseException | None = None
    for attempt in (1, 2):
        if attempt == 2 and options.ending(deadline):
            break  # asked to stop, or the budget spent: no new connection begun past it
        try:
            worked = _Drive(report, options, deadline, traced, crew, waiter).round()
        except TRANSIENT as exc:
            if db.connection().in_atomic_block:
                raise  # the caller's transaction owns the connection
            db.replace_if_broken(options.statement_bound)
            if attempt == 1:
                first = exc
                continue
            if deadline is None:
                raise  # a single pass: the error says the database cannot be reached, once
            logger.warning("the due read failed twice (%s); looking again after a wait", summary(exc))
            return False
        if first is not None:
            logger.warning("the due read failed (%s); made again on a new connection", summary(first))
        return worked
    if first is not None:
        logger.warning(
            "the due read failed (%s) as the drive ended (asked to stop, or its budget spent)", summary(first)
        )
    return False


class _Drive:
    """One round of a drive: the due read, then each run claimed, driven and released."""

    def __init__(
        self,
        report: DriveReport,
        options: DriveOptions,
        deadline: float | None,
        traced: telemetry.Traced | None,
        crew: Crew,
        waiter: notify.Waiter | None = None,
    ) -> None:
        self.crew, self.waiter = crew, waiter
        self.report = report
        self.options = options
        self.deadline = deadline
        self.telemetry = traced.recorder if traced is not None else None
        self.parent = traced.parent if traced is not None else None
        # Twice the limit is read, so a claim another worker wins is made up from the spares (in ``Line``'s order).
        self.scan_max = int(conf.get("SCAN_MAX"))
        self.wanted = min(2 * options.limit, self.scan_max)

    def round(self) -> bool:
        """One pass over what is due now; return whether any run was claimed."""
        with watchdog.bounding(self.options.statement_bound):
            return self._read_and_drive()

    def _read_and_drive(self) -> bool:
        options, report = self.options, self.report
        attempted = report.attempted
        options.clock.refresh()
        line = Line(self._due_now(), options.limit, self.wanted)
        # With a time budget every thread starts, so that a run started while the round's runs go on
        # is taken by a thread that has none (``look_again``); a single pass takes what it read.
        threads = options.concurrency if self.deadline is not None else min(options.concurrency, len(line.pending))
        if threads <= 1 or not line.pending:
            drive_line(self, line)
        else:
            # Windowed: a claim is taken as its work starts, never for the whole line up front, so
            # the tail of a long line does not expire unworked. The round's first runs, one for each
            # thread, are claimed together (one commit) and each thread starts one as it begins. The
            # crew's threads keep their connections for the drive (one per run, or per round, cost
            # more than a no-op task's pass).
            claim_together(self, line, threads)
            hears = self.waiter is not None and self.waiter.listening()
            try:
                every = HEAR_SECONDS if hears else db.CLOCK_REFRESH_SECONDS / 2
                self.crew.run(lambda: self.work_in_thread(line), threads, lambda: self._meanwhile(line), every)
            finally:
                for taken in line.unstarted():
                    give_back(taken.claim, self.release)
        return report.attempted > attempted

    def _due_now(self) -> list[DueRow]:
        """The schedules' due ticks started (S2: their runs are driven with the rest), then the due read."""
        options, report = self.options, self.report
        look_at_schedules(report, options.clock())
        jobs, limited, lease_now = options.jobs, options.limited, options.clock.lease_now()
        return due_rows(jobs, lease_now, self.wanted, self.scan_max, report, options.queues, limited=limited)

    def look_again(self, line: Line) -> DueRow | None:
        """The next row for a thread of a drive with a budget that found its round's line empty (``Line.look_for``)."""
        if self.options.concurrency == 1 or self.deadline is None:
            return None  # one thread: the next round is the same look; no budget: one look (D1)
        return line.look_for(self._due_now, self.stopping, notify.POLL_SECONDS)

    def _meanwhile(self, line: Line) -> None:
        """While the threads work: the clock read again as it ages, a NOTIFY passed on to threads waiting for work."""
        db.read_clock_again(self.options.clock)
        if self.waiter is not None and self.waiter.heard():
            line.wake()

    def stopping(self) -> bool:
        """Whether to take no further run or pass: the stop signal is set, or the time budget spent."""
        if self.options.asked_to_stop():
            self.report.stopped = True
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def ending(self) -> bool:
        """Whether the passes in flight should end early (D18): the stop signal is set, or the budget spent."""
        return self.options.ending(self.deadline)

    def work_in_thread(self, line: Line) -> None:
        """Drive the round's runs one after another until none is left or the drive stops."""
        with watchdog.bounding(self.options.statement_bound), telemetry.attached(self.parent):
            drive_line(self, line)

    def take(self, row: DueRow, job: Job) -> Claimed | None:
        """Claim the run, or ``None``: another holder won it, or the claim's statement failed (said so)."""
        try:
            return Claim.take(row, self.options.holder, self.options.lease_for(job), self.options.clock, job)
        except DatabaseError as exc:
            claim_failed(exc, f"run {row.id}: the claim failed")
            self.report.not_recorded(row.id, f"the claim failed: {summary(exc)}")
            return None

    def handle(self, row: DueRow, taken: Claimed | None, line: Line) -> tuple[bool, Following | None]:
        """Drive one run (``taken``: claimed already): False once told to take no more; the next if claimed with it."""
        stopping, job = self.stopping(), lookup(row.module, row.job)
        if stopping or job is None:  # job None: unregistered since the due read, stepped over
            if taken is not None:
                give_back(taken.claim, self.release)  # claimed as the run before it ended: its work never started
            return not stopping, None
        # Each statement under the claim bounded by half the claim's own lease (D15): a job's short
        # lease under a drive's long one still has its statements cut while its lease holds.
        with watchdog.bounding(self.options.lease_for(job).total_seconds() / 2):
            return self._handle(row, job, taken, line)

    def _handle(self, row: DueRow, job: Job, taken: Claimed | None, line: Line) -> tuple[bool, Following | None]:
        if taken is None:
            if not line.reserve():
                return False, None  # ``limit`` runs taken
            taken = self.take(row, job)
            if taken is None:
                self.report.add(Count.SKIPPED)
                line.unreserve()
                line.contended()
                return True, None
        following = taken.claim.following = line.following(self.options, self.ending)
        try:
            self._drive_claim(row, job, taken)
        except BaseException:
            if following is not None and (claim := following.taken()) is not None:
                give_back(claim.claim, self.release)
            raise
        return True, following

    def _drive_claim(self, row: DueRow, job: Job, taken: Claimed) -> None:
        claim, claimed = taken.claim, taken.row
        claim.drive_stopping = self.ending
        _in_flight.add(id(claim))
        self.report.add(Count.ATTEMPTED)
        if claim.took_over_from is not None:
            self.report.add(Count.TAKEN_OVER)
            if self.telemetry is not None:
                self.telemetry.takeover(job.label)
        released = False
        try:
            # Checked under the claim (the claim's own re-read): only then is the
            # answer stable. The due read was a snapshot, and the run may have
            # been finished or rescheduled out of band since.
            if claimed.run.status != Status.RUNNING or not claimed.due:
                self.report.add(Count.STALE)
                claim.never_started()  # given back in ``finally``
                return
            run = claimed.run
            if claim.took_over_from is not None and job.policy.exhausted(run.attempts):
                # Charging the silent pass used the policy up: a run that kills
                # its worker every time must end, without being tried again.
                self.report.record(run.id, claim.abandon(run), run.title)
                released = True
                return
            try:
                released = self.passes(run, job, claim, load_ledger(run.id, claimed.ledger))
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    # SystemExit, KeyboardInterrupt: the pass was recorded as
                    # failed and its lease given back; let it go.
                    released = True
                raise
        except Exception as exc:
            logger.exception("run %s: the drive could not record its pass", row.id)
            self.report.not_recorded(row.id, summary(exc))
            # A connection the server dropped is replaced before the release
            # and the runs after this one try to use it.
            db.replace_if_broken()
        finally:
            keepalive.forget(claim)  # whatever ended the claim: an abandoned pass's lease must lapse
            if not released and not claim.lost:
                self.release(claim)
            _in_flight.discard(id(claim))

    def passes(self, run: JobRun, job: Job, claim: Claim, ledger: Any) -> bool:
        """Up to ``max_passes`` passes of ``run`` under ``claim`` (D8); return whether the last one released it."""
        max_passes = self.options.max_passes
        for number in range(1, max_passes + 1):
            last = number == max_passes or self.stopping()
            outcome = run_pass(run, job, claim, release=last, ledger=ledger, telemetry=self.telemetry)
            if outcome.status is Outcome.STEPPED_OVER:
                self.report.stepped_over(run.id, outcome, run.title)
                return True
            self.report.record(run.id, outcome, run.title)
            if claim.timed_out:
                self.report.add(Count.TIMED_OUT)
            if outcome.status is not Outcome.ADVANCED or last:
                return True  # every final write released the lease; a lost pass has none to give back
            if self.stopping():
                return False
            # The next pass resumes from what the commit wrote, which the commit
            # also said still held under this claim.
            if run.paused_at is not None:
                return False  # paused by an operator meanwhile: give it back (in ``finally``)
            ledger = {}  # the commit dropped it
        return False

    def release(self, claim: Claim) -> None:
        """Give the lease back; a connection lost under it is replaced and the release made again (D15).

        A release that fails leaves the lease to lapse, and the takeover would
        charge the run a pass that in fact committed: so it is tried twice.
        """
        for attempt in (1, 2):
            try:
                claim.release()
                return
            except TRANSIENT as exc:
                if attempt == 1 and not db.connection().in_atomic_block:
                    logger.warning(
                        "run %s: the release failed (%s); again on a new connection", claim.run_id, summary(exc)
                    )
                    db.replace_if_broken()
                    continue
                self._unreleased(claim)
            except Exception:
                self._unreleased(claim)
            return

    def _unreleased(self, claim: Claim) -> None:
        # Never raised: this runs in a finally that may be unwinding the
        # pass's own error, which is the one the operator needs to see.
        logger.exception("run %s: the lease could not be released; it lapses at its expiry", claim.run_id)
        self.report.add(Count.UNRELEASED)


def drive_run(
    run_id: str,
    *,
    max_passes: int = 1,
    holder: str | None = None,
    lease_ttl: timedelta | float | None = None,
    now: Callable[[], datetime] | None = None,
) -> DriveReport:
    """Claim and drive one given run, if it is due; the drive of ``run_due_jobs`` for a single run.

    For tests and tools that must not touch the other runs in the table.
    Raises ``LookupError`` for an unknown id.
    """
    db.refuse_callers_transaction()
    options = DriveOptions(
        limit=1,
        max_passes=positive_int(max_passes, "max_passes"),
        holder=holder_name(holder),
        lease_ttl=lease_length(lease_ttl),
        concurrency=1,
        jobs=(),
        stop=None,
        clock=drive_clock(now),
        budget=None,
    )
    run = JobRun.objects.using(db.alias()).filter(pk=run_id).first()
    if run is None:
        raise LookupError(f"no run has the id {run_id!r}")
    report = DriveReport()
    with watchdog.bounding(options.statement_bound):
        # The holder of a lapsed lease is charged (a takeover); a live lease refuses the plain claim (skipped).
        lapsed = run.lease_expires_at is not None and run.lease_expires_at <= options.clock()
        held_by = run.lease_holder if lapsed else None
        row = DueRow(run.id, run.lease_fence, run.module, run.job, held_by, run.queue_name, run.priority, run.due_at)
        with telemetry.traced_drive(options.holder) as traced, Crew(1) as crew:
            _Drive(report, options, None, traced, crew).handle(row, None, Line([], options.limit))
    return report
