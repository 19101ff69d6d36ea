"""The drive: one bounded pass that claims due runs, runs their passes, releases them.

Safe with any number of workers on any number of hosts: a run is driven only
under a claim (one conditional UPDATE that compares the fence read with the
due rows and sets a new one), every write of its pass carries that fence, and
the lease is given back in ``finally``.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.utils import timezone

from . import conf, db, transitions, waiting
from .exceptions import InvalidDriveOptions
from .models import JobRun, Status
from .passes import TRANSIENT, Claim, Outcome, PassOutcome, _summary, fail_abandoned, load_ledger, run_pass
from .passes import PassObserver as PassObserver  # the drive's hook for testing tools
from .passes import observing as observing
from .registry import Job, get_job, lookup, registered_jobs
from .retry import as_timedelta
from .store import ClaimedRow, store

logger = logging.getLogger("django_jobruns")

_holder_lock = threading.Lock()
_holder: tuple[int, str] | None = None


class StopSignal(Protocol):
    def is_set(self) -> bool: ...


def default_holder() -> str:
    """Return this process's holder name: host, pid and a random suffix.

    Per process, never per deployment: the holder is what tells a renewal from
    a theft, so two workers sharing one would take claims from each other.
    Recomputed after a fork, since the child is another worker.
    """
    global _holder
    pid = os.getpid()
    with _holder_lock:
        if _holder is None or _holder[0] != pid:
            _holder = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}")
        return _holder[1]


class Count(enum.Enum):
    """The drive's own counts (the passes' outcomes are counted by :class:`Outcome`)."""

    ATTEMPTED = "attempted"
    SKIPPED = "skipped"
    STALE = "stale"
    LOST = "lost"
    UNRELEASED = "unreleased"
    UNREGISTERED = "unregistered"
    TAKEN_OVER = "taken_over"


@dataclass
class DriveReport:
    """What one ``run_due_jobs`` call did."""

    attempted: int = 0
    advanced: int = 0
    completed: int = 0
    retrying: int = 0
    failed: int = 0
    skipped: int = 0
    stale: int = 0
    lost: int = 0
    unreleased: int = 0
    #: Due runs stepped over because no job of this process is registered under their key.
    unregistered: int = 0
    #: Runs taken over from a holder whose lease lapsed unreleased (its pass was charged).
    taken_over: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stopped: bool = False
    #: Runs whose pass could not be recorded at all (the database failed under
    #: it): nothing was written, and the run is taken again by a later drive.
    unrecorded: list[tuple[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    COUNTS = (
        "attempted",
        "advanced",
        "completed",
        "retrying",
        "failed",
        "skipped",
        "stale",
        "lost",
        "unreleased",
        "unregistered",
        "taken_over",
    )
    #: Counts the one-line summary shows only when they are not zero.
    RARE = ("unregistered", "taken_over")

    def add(self, count: Count) -> None:
        with self._lock:
            if count is Count.ATTEMPTED:
                self.attempted += 1
            elif count is Count.SKIPPED:
                self.skipped += 1
            elif count is Count.STALE:
                self.stale += 1
            elif count is Count.LOST:
                self.lost += 1
            elif count is Count.UNRELEASED:
                self.unreleased += 1
            elif count is Count.UNREGISTERED:
                self.unregistered += 1
            elif count is Count.TAKEN_OVER:
                self.taken_over += 1

    def record(self, run_id: str, outcome: PassOutcome) -> None:
        with self._lock:
            status = outcome.status
            if status is Outcome.ADVANCED:
                self.advanced += 1
            elif status is Outcome.COMPLETED:
                self.completed += 1
            elif status is Outcome.RETRYING:
                self.retrying += 1
            elif status is Outcome.FAILED:
                self.failed += 1
            elif status is Outcome.LOST:
                self.lost += 1
            if outcome.error is not None:
                self.errors.append((run_id, outcome.error))
            if outcome.warning is not None:
                self.warnings.append(f"run {run_id}: {outcome.warning}")

    def not_recorded(self, run_id: str, message: str) -> None:
        with self._lock:
            self.unrecorded.append((run_id, message))

    def __getitem__(self, key: str) -> Any:
        if key not in self.COUNTS and key not in ("errors", "warnings", "stopped", "unrecorded"):
            raise KeyError(key)
        return getattr(self, key)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: getattr(self, name) for name in self.COUNTS}
        data["errors"] = [list(pair) for pair in self.errors]
        data["warnings"] = list(self.warnings)
        data["stopped"] = self.stopped
        data["unrecorded"] = [list(pair) for pair in self.unrecorded]
        return data

    def summary(self) -> str:
        counts = " ".join(f"{name}={getattr(self, name)}" for name in self.COUNTS if name not in self.RARE)
        rare = "".join(f" {name}={getattr(self, name)}" for name in self.RARE if getattr(self, name))
        return f"{counts} stopped={'yes' if self.stopped else 'no'}{rare}"


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDriveOptions(f"{name} must be a whole number >= 1, got {value!r}")
    if value < 1:
        raise InvalidDriveOptions(f"{name} must be >= 1, got {value}: it would drive nothing while reporting success")
    return value


def _lease_ttl(value: Any) -> timedelta:
    ttl = as_timedelta(conf.get("LEASE_TTL") if value is None else value)
    if ttl is None:
        raise InvalidDriveOptions(f"lease_ttl must be a timedelta or a number of seconds, got {value!r}")
    if ttl <= timedelta(0):
        raise InvalidDriveOptions(
            f"lease_ttl must be positive, got {value!r}: a lease that is already expired is one every "
            "worker can take at once"
        )
    return ttl


def _holder_name(value: Any) -> str:
    if value is None:
        return default_holder()
    if not isinstance(value, str) or not value.strip():
        raise InvalidDriveOptions(
            f"holder must be non-empty text, got {value!r}: it tells a renewal from a theft, "
            "so use something per process, such as a pod name plus a pid"
        )
    if len(value) > 255:
        raise InvalidDriveOptions(f"holder must be at most 255 characters, got {len(value)}")
    return value


def _selected_jobs(value: Any) -> list[Job]:
    if value is None:
        return registered_jobs()
    if isinstance(value, (str, Job)):
        value = [value]
    try:
        refs = list(value)
    except TypeError:
        raise InvalidDriveOptions(f"jobs must be a list of jobs or 'app_label.name' strings, got {value!r}") from None
    if not refs:
        raise InvalidDriveOptions("jobs is empty: pass None to drive every registered job")
    return [get_job(ref) for ref in refs]


def _clock(value: Any) -> Callable[[], datetime]:
    if value is None:
        return db.database_clock()
    if not callable(value):
        raise InvalidDriveOptions(f"now must be a callable returning an aware datetime, got {value!r}")
    return value  # type: ignore[no-any-return]


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
    ``JOBRUNS["LEASE_TTL"]`` (5 minutes); a job's own ``@job(lease=…)`` wins
    over either. Options that cannot mean what they say raise
    :class:`InvalidDriveOptions` before anything is claimed. A run's failure
    never escapes: it is recorded on the run and reported in ``errors``.
    """
    limit = _positive_int(conf.get("DRIVE_LIMIT") if limit is None else limit, "limit")
    budget = _budget(max_seconds)
    if max_passes is None:
        max_passes = 1 if budget is None else _UNLIMITED
    max_passes = _positive_int(max_passes, "max_passes")
    concurrency = _positive_int(concurrency, "concurrency")
    ttl = _lease_ttl(lease_ttl)
    holder = _holder_name(holder)
    selected = _selected_jobs(jobs)
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise InvalidDriveOptions(f"stop must be a threading.Event (or have is_set()), got {stop!r}")
    clock = _clock(now)  # last: without ``now`` it reads the database's clock
    started = clock()
    if not isinstance(started, datetime) or timezone.is_naive(started):
        raise InvalidDriveOptions(f"now() must return an aware datetime, got {started!r}")

    report = DriveReport()
    if stop is not None and stop.is_set():
        report.stopped = True
        return report
    if not selected:
        return report
    if budget is None:
        _round(report, selected, holder, ttl, clock, max_passes, stop, limit, concurrency, None)
        return report
    deadline = time.monotonic() + budget
    with waiting.Waiter(stop) as waiter:
        while True:
            worked = _round(report, selected, holder, ttl, clock, max_passes, stop, limit, concurrency, deadline)
            if report.stopped or time.monotonic() >= deadline:
                break
            if not worked:
                waiter.wait(deadline)
                if stop is not None and stop.is_set():
                    report.stopped = True
                    break
    return report


#: ``max_passes`` with a time budget and no cap of its own: the budget bounds the passes.
_UNLIMITED = 10**9


def _budget(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidDriveOptions(f"max_seconds must be a positive number of seconds, got {value!r:.100}")
    if value > 86_400:
        raise InvalidDriveOptions(f"max_seconds must be at most a day (86400), got {value!r}")
    return float(value)


def _round(
    report: DriveReport,
    selected: list[Job],
    holder: str,
    ttl: timedelta,
    clock: Callable[[], datetime],
    max_passes: int,
    stop: StopSignal | None,
    limit: int,
    concurrency: int,
    deadline: float | None,
) -> bool:
    """One pass over what is due now; return whether any run was claimed."""
    scan_max = int(conf.get("SCAN_MAX"))
    attempted = report.attempted
    # Twice the limit is read, so a claim another worker wins is made up from
    # the spares. Runs are taken oldest first; once a claim is lost to another
    # worker, the rest of the window is taken in random order, so workers
    # started together stop racing each other for the same next run.
    rows = _due_rows(selected, clock(), min(2 * limit, scan_max), scan_max, report)
    drive = _Drive(report, holder, ttl, clock, max_passes, stop, limit, deadline)
    if concurrency == 1 or len(rows) <= 1:
        pending = list(rows)
        contended = False
        while pending:
            skipped_before = report.skipped
            if not drive.handle(*pending.pop(0)):
                break
            if report.skipped > skipped_before and not contended:
                contended = True
                random.shuffle(pending)
    else:
        # Windowed: a claim is taken as its work starts, never for the whole
        # batch up front, so the tail of a long batch does not expire unworked.
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="jobruns") as pool:
            for _ in pool.map(lambda row: drive.handle_in_thread(*row), rows):
                pass
    return report.attempted > attempted


DueRow = tuple[str, int, str, str, "str | None"]


def _due_rows(selected: list[Job], now: datetime, limit: int, scan_max: int, report: DriveReport) -> list[DueRow]:
    """Read the oldest due runs of the selected jobs, until ``limit`` are found.

    ``limit`` counts runnable runs, not rows read: runs of jobs this process
    does not drive (another deployment's, or a registration since removed) are
    stepped over, never failed, and the read pages past them -- at most
    ``scan_max`` rows, so a table full of them cannot turn a drive into a scan.
    The filter stays in Python so the read is a plain range of the due index.
    """
    wanted = {entry.key for entry in selected}
    found: list[DueRow] = []
    scanned = 0
    after: tuple[Any, str] | None = None
    while len(found) < limit and scanned < scan_max:
        # Pages of at least 50 rows, so that a small limit behind many orphans
        # costs a few reads rather than one per orphan.
        page = min(max(limit, 50), scan_max - scanned)
        batch = store().due(now, after, page)
        scanned += len(batch)
        for row in batch:
            if (row[2], row[3]) in wanted:
                found.append((row[0], row[1], row[2], row[3], row[4]))
            elif lookup(row[2], row[3]) is None:
                report.add(Count.UNREGISTERED)
        if len(batch) < page:
            break  # the end of the due runs
        after = (batch[-1][5], batch[-1][0])
    return found[:limit]


class _Drive:
    def __init__(
        self,
        report: DriveReport,
        holder: str,
        ttl: timedelta,
        clock: Callable[[], datetime],
        max_passes: int,
        stop: StopSignal | None,
        limit: int,
        deadline: float | None = None,
    ) -> None:
        self.slots = limit
        self.slots_lock = threading.Lock()
        self.report = report
        self.holder = holder
        self.ttl = ttl
        self.clock = clock
        self.max_passes = max_passes
        self.stop = stop
        self.deadline = deadline

    def stopping(self) -> bool:
        """Whether to take no further run or pass: the stop signal is set, or the time budget spent."""
        if self.stop is not None and self.stop.is_set():
            self.report.stopped = True
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def handle_in_thread(self, run_id: str, fence: int, module: str, job_name: str, held_by: str | None) -> bool:
        try:
            return self.handle(run_id, fence, module, job_name, held_by)
        finally:
            db.connection().close()

    def claim(self, run_id: str, fence: int, ttl: timedelta, held_by: str | None) -> tuple[Claim, ClaimedRow] | None:
        """Take the run if nobody claimed it since it was read, or their claim expired.

        ``held_by`` is the holder the due read saw on a lapsed lease: the claim
        is then a takeover, which charges that holder's silent pass.
        """
        now = self.clock()
        takeover = (
            None
            if held_by is None
            else (
                f"the pass under holder {held_by!r} stopped reporting and its lease expired "
                "(counted as a failed attempt)"
            )
        )
        row = store().claim(run_id, fence, self.holder, now, now + ttl, takeover=takeover)
        if row is None:
            return None
        return Claim(run_id, self.holder, fence + 1, ttl, self.clock, now + ttl), row

    def handle(self, run_id: str, fence: int, module: str, job_name: str, held_by: str | None = None) -> bool:
        """Drive one run; return False once the stop signal says to take no more."""
        if self.stopping():
            return False
        job = lookup(module, job_name)
        if job is None:  # unregistered since the due read: step over it
            return True
        with self.slots_lock:
            if self.slots == 0:
                return False  # ``limit`` runs taken
            self.slots -= 1
        try:
            taken = self.claim(run_id, fence, job.lease or self.ttl, held_by)
        except TRANSIENT as exc:
            # A lock wait that timed out, a dropped connection: nothing was
            # claimed. Say so and go on with the other runs.
            logger.warning("run %s: the claim failed: %s", run_id, _summary(exc))
            self.report.not_recorded(run_id, f"the claim failed: {_summary(exc)}")
            db.replace_if_broken()
            taken = None
        if taken is None:
            self.report.add(Count.SKIPPED)
            with self.slots_lock:
                self.slots += 1
            return True
        claim, row = taken
        self.report.add(Count.ATTEMPTED)
        if held_by is not None:
            self.report.add(Count.TAKEN_OVER)
        released = False
        try:
            # Checked under the claim (the claim's own re-read): only then is the
            # answer stable. The due read was a snapshot, and the run may have
            # been finished or rescheduled out of band since.
            if row.run.status != Status.RUNNING or not row.due:
                self.report.add(Count.STALE)
                return True
            run = row.run
            if held_by is not None and (job.retry or conf.default_retry()).exhausted(run.attempts):
                # Charging the silent pass used the policy up: a run that kills
                # its worker every time must end, without being tried again.
                outcome = fail_abandoned(run, claim, held_by)
                self.report.record(run_id, outcome)
                released = True
                return True
            ledger = load_ledger(run_id, row.ledger) if row.ledger is not None else None
            for number in range(1, self.max_passes + 1):
                last = number == self.max_passes or self.stopping()
                try:
                    outcome = run_pass(run, job, claim, release=last, ledger=ledger)
                except BaseException as exc:
                    if not isinstance(exc, Exception):
                        # SystemExit, KeyboardInterrupt: the pass was recorded
                        # as failed and its lease given back; let it go.
                        released = True
                    raise
                self.report.record(run_id, outcome)
                if outcome.status is not Outcome.ADVANCED or last:
                    # Every final write released the lease; a lost pass has none to give back.
                    released = True
                    break
                if self.stopping():
                    break
                # The next pass resumes from what the commit wrote, which the
                # commit also said still held under this claim.
                if run.paused_at is not None:
                    break  # paused by an operator meanwhile: give it back (in ``finally``)
                ledger = {}  # the commit dropped it
        except Exception as exc:
            logger.exception("run %s: the drive could not record its pass", run_id)
            self.report.not_recorded(run_id, _summary(exc))
            # A connection the server dropped is replaced before the release
            # and the runs after this one try to use it.
            db.replace_if_broken()
        finally:
            if not released:
                self.release(claim)
        return True

    def release(self, claim: Claim) -> None:
        try:
            claim.write(**transitions.released())
        except Exception:
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
    max_passes = _positive_int(max_passes, "max_passes")
    ttl = _lease_ttl(lease_ttl)
    holder = _holder_name(holder)
    clock = _clock(now)
    row = (
        JobRun.objects.using(db.alias())
        .filter(pk=run_id)
        .values_list("lease_fence", "module", "job", "lease_holder", "lease_expires_at")
        .first()
    )
    if row is None:
        raise LookupError(f"no run has the id {run_id!r}")
    report = DriveReport()
    fence, module, job_name, held_by, expires = row
    if held_by is not None and (expires is None or expires > clock()):
        held_by = None  # held: the plain claim is refused (skipped)
    _Drive(report, holder, ttl, clock, max_passes, None, 1).handle(run_id, fence, module, job_name, held_by)
    return report
