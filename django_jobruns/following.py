"""The drive's next run, claimed in the transaction of the ending write of the run before it.

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
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import keepalive
from .claims import Claim, Claimed
from .db import Clock
from .options import DriveOptions
from .registry import Job, lookup
from .report import Count, DriveReport
from .store import store
from .store.base import ClaimedRow, ClaimRider, DueRow, PlainClaim
from .store.statements import Expiry


class Following(ClaimRider):
    """The claim of ``row``, written as a rider of another claim's ending write (``Claim.following``)."""

    def __init__(self, row: DueRow, job: Job, holder: str, ttl: Any, clock: Clock, skip: Callable[[], bool]) -> None:
        self.row, self.job, self.holder, self.ttl, self.clock, self.skip = row, job, holder, ttl, clock, skip
        self.has_riders = job.on_claim is not None
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
        on_claim = self.job.on_claim
        also, self.undo = on_claim(claim.row.id, claim.fence, claim.holder, claim.now) if on_claim else ([], [])
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
        self.plain = PlainClaim(self.row, self.row.fence + 1, self.holder, Expiry(clock.lease_now(), self.ttl), now)
        return self.plain

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

    Shared by the drive's threads under its lock. Runs are taken oldest first.
    Once a claim is lost to another worker, the rest are taken in random order,
    so workers started together stop racing each other for the same next run.
    """

    def __init__(self, rows: list[DueRow], limit: int) -> None:
        self.pending = list(rows)
        self.slots = limit
        self.lock = threading.Lock()
        self.shuffled = False
        #: Runs claimed together as the round began, each for a thread to start as it begins (D7).
        self.claimed: list[tuple[DueRow, Claimed]] = []

    def next(self) -> DueRow | None:
        with self.lock:
            return self.pending.pop(0) if self.pending else None

    def first(self) -> tuple[DueRow | None, Claimed | None]:
        """A thread's first run: one claimed as the round began, else the next row, to be claimed."""
        with self.lock:
            if self.claimed:
                return self.claimed.pop(0)
            return (self.pending.pop(0) if self.pending else None), None

    def leading(self, count: int) -> list[tuple[DueRow, Job]]:
        """Up to ``count`` rows from the front of the line to claim together, their slots reserved.

        Only plain claims (no holder recorded, a job registered here), and only
        from the front: the line's order is kept.
        """
        with self.lock:
            taken: list[tuple[DueRow, Job]] = []
            while self.pending and len(taken) < count:
                row = self.pending[0]
                job = lookup(row.module, row.job) if row.holder is None else None
                if job is None or not self._reserve_held():
                    break
                taken.append((self.pending.pop(0), job))
            return taken

    def put_back(self, rows: list[DueRow]) -> None:
        """Rows taken by :meth:`leading` whose claim was not made: at the front again, their slots free."""
        with self.lock:
            self.pending[:0] = rows
            self.slots += len(rows)

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

        Only a plain claim rides: a row with no holder recorded, whose job is registered here.
        """
        with self.lock:
            row = self.pending[0] if self.pending else None
            job = lookup(row.module, row.job) if row is not None and row.holder is None else None
            if row is None or job is None or not self._reserve_held():
                return None
            self.pending.pop(0)
        return Following(row, job, options.holder, options.lease_for(job), options.clock, skip)


class Driver(Protocol):
    """What :func:`drive_line` asks of the drive (``drive._Drive``)."""

    report: DriveReport

    def handle(self, row: DueRow, taken: Claimed | None, line: Line) -> tuple[bool, Following | None]:
        """Drive one run (``taken``: claimed already); False once told to take no more; the next if claimed with it."""
        ...


def drive_line(drive: Driver, line: Line) -> None:
    """Drive the line's runs one after another; each claimed, when it can be, by the write that ends the last."""
    row, taken = line.first()
    while row is not None:
        go_on, following = drive.handle(row, taken, line)
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
                row = line.next()


def give_back(claim: Claim, release: Callable[[Claim], None]) -> None:
    """Give back a claim whose work never started, with what rode with it (a task's attempt record begun)."""
    claim.never_started()
    keepalive.forget(claim)
    release(claim)
