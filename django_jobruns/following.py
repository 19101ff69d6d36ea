"""How a drive claims its runs: the next with the ending write of the last; a round's first ones together.

A drive works its runs one after another. Each run's pass ends with one fenced
write (its commit, its failure, its release), and the claim of the next run in
the drive's line rides with that write: one commit for both. A task then costs
one commit, not two, and a run's passes k + 1 commits, not k + 2.

The claim is the ordinary claim (D2): the fence read with the due row compared,
the lease free, a new fence set, and a task's attempt record begun with it. It
is taken as the work before it ends, so the next run's work starts at once
(D7): a claim taken in a batch ahead of its work would be charged as a pass
that stopped reporting (D10) if the worker died before reaching it. Only a
plain claim rides (a due row with no holder recorded); a takeover charges the
silent pass and is taken by its own statement. The claim is not written when
the drive is stopping as the write is made, and one that was written while the
drive stops is given back, with its attempt record. It passes over a row another
transaction holds locked rather than hold the write it rides with. On
PostgreSQL a pass's commit and the claim are one statement (a job run's claim
has no statements of its own to ride along).

With ``--concurrency N`` a round's first runs, one for each of its threads, are
claimed in one transaction (:func:`claim_together`: one commit, not N; on
PostgreSQL one statement), and each thread starts one as it begins; the rest of
the round is claimed as above. With a time budget, a thread that finds the
line empty reads what is due again while the other threads go on, and while
one goes on (:meth:`Line.look_for`): a round never waits for its slowest run,
nor a run started meanwhile for a long one.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from django.db import DatabaseError

from . import db, keepalive
from .claims import Claim, Claimed, claim_riders
from .db import Clock
from .exceptions import DatabaseReadOnly
from .options import DriveOptions
from .outcomes import TRANSIENT, summary
from .registry import Job, lookup
from .report import Count, DriveReport
from .store import errors, store, watchdog
from .store.base import ClaimedRow, ClaimRider, DueRow, PlainClaim, Riders
from .store.statements import Expiry

logger = logging.getLogger("django_jobruns")


class Following(ClaimRider):
    """The claim of ``row``, written as a rider of another claim's ending write (``Claim.following``)."""

    def __init__(self, row: DueRow, job: Job, holder: str, ttl: Any, clock: Clock, skip: Callable[[], bool]) -> None:
        self.row, self.job, self.holder, self.ttl, self.clock, self.skip = row, job, holder, ttl, clock, skip
        self.undo: list[Any] = []
        #: Whether the claim's statement was sent (the drive was not stopping as the write was made).
        self.sent_claim = False
        #: The run as the claim's statement left it, if it took the run.
        self.claimed: ClaimedRow | None = None
        #: Set by the claim it rode with, once that write held (committed): only then is ``claimed`` so.
        self.landed = False
        self.claim: Claimed | None = None

    def __call__(self, cur: Any) -> None:
        """Claim the run on ``cur``, in the ending write's transaction (made again if that is retried)."""
        claim = self.arguments()
        if claim is None:
            return
        also = self.riding(claim)
        # A row another transaction holds locked is passed over, not waited for: the write this rides
        # with (the last run's commit) must not wait on another run's row.
        self.took(store().claim_on(cur, claim, also, skip_locked=True))

    def arguments(self) -> PlainClaim | None:
        self.claimed, self.sent_claim = None, False
        if self.skip():
            return None
        clock = self.clock
        now = clock()
        self.kept_at, self.sent = time.monotonic(), clock.mark()
        self.sent_claim = True
        self.plain = PlainClaim.of(self.row, self.holder, Expiry(clock.lease_now(), self.ttl), now)
        return self.plain

    def riding(self, claim: PlainClaim) -> Riders:
        also, self.undo = claim_riders(self.job, claim)
        return also

    def took(self, claimed: ClaimedRow | None) -> None:
        self.claimed = claimed

    def land(self) -> None:
        """The write this rode with held (committed): the claim, if its statement took the run, is kept alive now."""
        self.landed = True
        if self.claimed is not None:
            self.claim = Claim.taken(
                self.plain, self.claimed, self.ttl, self.clock, sent=self.sent, kept_at=self.kept_at, undo=self.undo
            )

    def taken(self) -> Claimed | None:
        """The claim, if the write it rode with held and its statement took the run."""
        return self.claim if self.landed else None

    def lost_to_another(self) -> bool:
        """Whether the claim was written and found the run taken (or changed) since the due read."""
        return self.landed and self.sent_claim and self.claimed is None


class Line:
    """A round's due rows, in the order its drive takes them, and how many more runs it may take (``limit``).

    Shared by the drive's threads under its lock; refilled by a look again. Runs are taken oldest first.
    Once a claim is lost to another worker, the rest are taken in random order,
    so workers started together stop racing each other for the same next run.
    """

    def __init__(self, rows: list[DueRow], limit: int, wanted: int | None = None) -> None:
        self.pending = list(rows)
        self.limit = self.slots = limit
        self.lock = threading.Lock()
        #: Notified as a look refills the line and as the last run out ends (``worth_looking``'s waits).
        self.changed = threading.Condition(self.lock)
        self.shuffled = False
        #: The ids of the rows taken from the line whose drive has not ended (a look again passes them over).
        self.out: set[str] = set()
        #: One thread at a time looks again (``look_again``); ``looks`` counts the looks made.
        self.looking = threading.Lock()
        self.looks = 0
        #: Rows a read asks for. ``complete``: the last read found fewer (every run due then), or nothing new.
        self.wanted = wanted
        self.complete = wanted is not None and len(rows) < wanted
        self.read_at = time.monotonic()
        #: A look failed, or a thread's drive raised: no other look this round (``wake``).
        self.broken = False
        #: Runs claimed together as the round began, each for a thread to start as it begins (D7).
        self.claimed: list[tuple[DueRow, Claimed]] = []

    def next(self) -> DueRow | None:
        with self.lock:
            return self._pop()

    def _pop(self) -> DueRow | None:
        if not self.pending or self.slots == 0:
            return None  # none left, or ``limit`` runs taken
        return self._take_front()

    def _take_front(self) -> DueRow:
        """The row at the front, out of the line and counted as taken (lock held)."""
        row = self.pending.pop(0)
        self.out.add(row.id)
        return row

    def first(self) -> tuple[DueRow | None, Claimed | None]:
        """A thread's first run: one claimed as the round began, else the next row, to be claimed."""
        with self.lock:
            if self.claimed:
                return self.claimed.pop(0)
            return self._pop(), None

    def ended(self, row: DueRow) -> None:
        """The drive of a row taken from the line has ended: a later look may take the run again."""
        with self.lock:
            self.out.discard(row.id)
            if not self.out:
                self.changed.notify_all()  # threads waiting for work: the round is over

    def look_again(self, look: Callable[[], list[DueRow]]) -> None:
        """``look`` (the due read) made, and what it found put in the line (``refill``); or, if another thread
        looked meanwhile, its look taken instead.

        One thread looks at a time; a thread that finds another looking waits for that look and takes
        what it found. A look that fails ends the round as its runs end; the drive's next round reads again.
        """
        looks = self.looks
        with self.looking:
            if self.looks != looks:
                return  # another thread looked meanwhile
            try:
                self.refill(look())
            except DatabaseError as exc:
                logger.warning("the due read failed (%s); made again as the round ends", summary(exc))
                db.replace_if_broken()
                self.wake(end=True)

    def wake(self, end: bool = False) -> None:
        """The threads waiting for work look again now (a NOTIFY came: a run may have started); with ``end``
        they end, and no look is made again this round (a look failed, a thread's drive raised)."""
        with self.lock:
            self.broken = self.broken or end
            self.read_at = float("-inf")
            self.changed.notify_all()

    def look_for(self, look: Callable[[], list[DueRow]], stopping: Callable[[], bool], every: float) -> DueRow | None:
        """The next row for a thread that found the line empty (``look_again``, ``worth_looking``), or ``None``
        once the round is over or the drive stops."""
        while not stopping():
            row = self.next()
            if row is not None:
                return row
            if not self.worth_looking(every):
                return None
            self.look_again(look)
        return None

    def worth_looking(self, every: float) -> bool:
        """Whether a thread that found the line empty should look again now; False once the round is over.

        A line whose last read found every run due then is read again no sooner than ``every`` after
        it: meanwhile the thread waits, as long as another thread's run goes on (a task's long body, a
        long pass), a run started meanwhile is taken by a thread that has none. The round is over when
        no run of it is out and a look would find nothing new, or it was ended (``wake``).
        """
        with self.changed:
            while not self.broken:
                if self.pending or not self.complete:
                    return True  # runs to take (``limit`` taken: a look gives it anew), or more may be due
                wait = self.read_at + every - time.monotonic()
                if wait <= 0:
                    return True
                if not self.out:
                    return False
                self.changed.wait(wait)
            return False

    def refill(self, rows: list[DueRow]) -> None:
        """A look found ``rows``: they are the line now, less those taken, unless it found nothing new.

        The line's ``limit`` slots are given anew, as for a round.
        """
        with self.lock:
            self.looks += 1
            self.read_at = time.monotonic()
            known = self.out.union(row.id for row in self.pending)
            if not self.pending and all(row.id in known for row in rows):
                self.complete = True  # nothing new: the next look waits for runs to start (``worth_looking``)
                return
            self.complete = self.wanted is not None and len(rows) < self.wanted
            self.pending = [row for row in rows if row.id not in self.out]
            self.slots = self.limit
            self.shuffled = False
            self.changed.notify_all()

    def leading(self, count: int) -> list[tuple[DueRow, Job]]:
        """Up to ``count`` rows from the front of the line to claim together, their slots reserved.

        Only plain claims, and only from the front: the line's order is kept.
        """
        with self.lock:
            taken: list[tuple[DueRow, Job]] = []
            while len(taken) < count and (front := self._plain_front()) is not None:
                taken.append(front)
            return taken

    def _plain_front(self) -> tuple[DueRow, Job] | None:
        """The front row, its slot reserved, if a plain claim can take it: no holder recorded (a takeover
        charges, by a statement of its own) and its job registered here. Lock held."""
        row = self.pending[0] if self.pending else None
        job = lookup(row.module, row.job) if row is not None and row.holder is None else None
        if row is None or job is None or not self._reserve_held():
            return None
        return self._take_front(), job

    def put_back(self, rows: list[DueRow]) -> None:
        """Rows taken by :meth:`leading` whose claim was not made: at the front again, their slots free."""
        with self.lock:
            self.pending[:0] = rows
            self.slots += len(rows)
            self.out.difference_update(row.id for row in rows)

    def unstarted(self) -> list[Claimed]:
        """The runs claimed together that no thread started (a thread that failed first): to give back."""
        with self.lock:
            left, self.claimed = [taken for _, taken in self.claimed], []
            return left

    def reserve(self) -> bool:
        """Take one of the round's slots for a claim about to be made; False once ``limit`` runs are taken."""
        with self.lock:
            return self._reserve_held()

    def _reserve_held(self) -> bool:
        if self.slots == 0:
            return False
        self.slots -= 1
        return True

    def unreserve(self) -> None:
        """The reserved claim was not made, or took nothing: its slot is free again."""
        with self.lock:
            self.slots += 1

    def contended(self) -> None:
        """A claim was lost to another worker: the rest of the line in random order, once."""
        with self.lock:
            if not self.shuffled:
                self.shuffled = True
                random.shuffle(self.pending)

    def following(self, options: DriveOptions, skip: Callable[[], bool]) -> Following | None:
        """The next run, its slot reserved, to be claimed by the ending write of the run claimed now.

        Only a plain claim rides.
        """
        with self.lock:
            front = self._plain_front()
        if front is None:
            return None
        row, job = front
        return Following(row, job, options.holder, options.lease_for(job), options.clock, skip)


class Driver(Protocol):
    """What :func:`drive_line` asks of the drive (``drive._Drive``)."""

    report: DriveReport

    def handle(self, row: DueRow, taken: Claimed | None, line: Line) -> tuple[bool, Following | None]:
        """Drive one run (``taken``: claimed already); False once told to take no more; the next if claimed with it."""
        ...

    def look_again(self, line: Line) -> DueRow | None:
        """The line found empty: a row that another due read found, or ``None`` when the thread's work is over."""
        ...


def drive_line(drive: Driver, line: Line) -> None:
    """Drive the line's runs one after another; each claimed, when it can be, by the write that ends the last.

    The line found empty, the drive may look again (``Driver.look_again``) and go on with what that found.
    """
    row, taken = line.first()
    while row is not None or (row := drive.look_again(line)) is not None:
        try:
            go_on, following = drive.handle(row, taken, line)
        except BaseException:
            line.wake(end=True)  # the threads waiting for work end, and the error ends the round
            raise
        line.ended(row)
        if not go_on:
            return
        if following is None:
            row, taken = line.next(), None
            continue
        row, taken = following.row, following.taken()
        if taken is None:
            line.unreserve()  # reserved when it was chosen: its own claim reserves it again
            if following.lost_to_another():
                drive.report.add(Count.SKIPPED)
                line.contended()
                line.ended(row)
                row = line.next()


class Starter(Driver, Protocol):
    """What :func:`claim_together` asks of the drive (``drive._Drive``)."""

    options: DriveOptions

    def stopping(self) -> bool:
        """Whether to take no further run."""
        ...


def claim_together(drive: Starter, line: Line, count: int) -> None:
    """Claim up to ``count`` runs from the front of the line in one transaction, for the drive's threads to start.

    Each thread starts one as it begins (D7: every run so claimed is started at
    once, by its own thread). A claim another holder won is counted as skipped,
    as a claim of its own would be. If the transaction fails, nothing was
    claimed: the rows go back to the line, and each thread claims its own.
    """
    if drive.stopping():
        return
    wanted = line.leading(count)
    if not wanted:
        return
    options = drive.options
    leases = [(row, job, options.lease_for(job)) for row, job in wanted]
    try:
        # Bounded by half the shortest lease among them, as each claim is by half its own.
        with watchdog.bounding(min(ttl for _, _, ttl in leases).total_seconds() / 2):
            found = take_together(leases, options.holder, options.clock)
    except DatabaseError as exc:
        line.put_back([row for row, _ in wanted])
        claim_failed(exc, "the claims of the round's first runs failed")
        return
    for (row, _), taken in zip(wanted, found, strict=True):
        if taken is None:
            drive.report.add(Count.SKIPPED)
            line.unreserve()
            line.contended()
        else:
            line.claimed.append((row, taken))


def take_together(wanted: list[tuple[DueRow, Job, timedelta]], holder: str, clock: Clock) -> list[Claimed | None]:
    """Claim the runs of several due rows, none with a holder recorded, in one transaction (one commit).

    Each claim is ``Claim.take``'s, with its own fence (the one read plus one)
    and its job's lease, and what its job writes with a claim (a task's attempt
    record begun); each is ``None`` where another holder won the run or it
    changed since it was read. A takeover is not made so: it charges the silent
    pass, by a statement of its own.
    """
    now = clock()
    kept_at, sent, lease_now = time.monotonic(), clock.mark(), clock.lease_now()
    plains, undos, batch = [], [], []
    for row, job, ttl in wanted:
        plain = PlainClaim.of(row, holder, Expiry(lease_now, ttl), now)
        also, undo = claim_riders(job, plain)
        plains.append(plain)
        undos.append(undo)
        batch.append((plain, also))
    found = store().claim_together(batch)
    return [
        None if claimed is None else Claim.taken(plain, claimed, ttl, clock, sent=sent, kept_at=kept_at, undo=undo)
        for plain, claimed, (_, _, ttl), undo in zip(plains, found, wanted, undos, strict=True)
    ]


def claim_failed(exc: DatabaseError, what: str) -> None:
    """A claim's statement failed and claimed nothing: said, and the connection replaced if it broke."""
    if errors.refuses_writes(exc):
        # Every claim would fail alike: one error, not a line per run per look.
        raise DatabaseReadOnly(
            f"the database refuses writes ({summary(exc)}): no run can be claimed; the drive stops"
        ) from None
    if not isinstance(exc, TRANSIENT):
        raise exc
    # A lock wait that timed out, a dropped connection: nothing was
    # claimed. Say so and go on with the other runs.
    logger.warning("%s: %s", what, summary(exc))
    db.replace_if_broken()


def give_back(claim: Claim, release: Callable[[Claim], None]) -> None:
    """Give back a claim whose work never started, with what rode with it (a task's attempt record begun)."""
    claim.never_started()
    keepalive.forget(claim)
    release(claim)
