"""The values the store reads and writes: a due row, a claimed run, a step record, a claim that rides along."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from ..models import JobRun
from .statements import RUN_FIELDS, Expiry

#: The step ledger of a pass: (step, result, attempts, last_error) per recorded step.
Ledger = list[tuple[str, "str | None", int, "str | None"]]
#: What rides along with a fenced write, only if the fence held: each a :class:`Rider` (a task's
#: attempt record begun with the claim, ended with the pass's commit) or a :class:`ClaimRider` (the
#: claim of the drive's next run).
Riders = list[Any]


class Rider(NamedTuple):
    """A statement written with a fenced write, in its transaction, only if the fence held.

    ``joined``, where given, is the same write as a part of the fenced write's
    own statement (PostgreSQL's data-modifying ``WITH``): its text reads the
    run as the fenced write left it (its ``id`` and ``attempts``) from
    ``{run}``, which finds no row if the fence did not hold. A database that can
    sends the two as one statement: one round trip and no transaction around it.
    """

    text: str
    params: list[Any]
    #: (text, parameters) of the write within the fenced write's statement.
    joined: tuple[str, list[Any]] | None = None

    @classmethod
    def if_held(cls, text: str, params: list[Any]) -> Rider:
        """A write (its ``WHERE`` ending the text) that needs of the fenced write only that it held."""
        return cls(text, params, joined=(f"{text} AND EXISTS (SELECT 1 FROM {{run}})", params))


def joinable(riders: Riders) -> bool:
    """Whether each of ``riders`` can be written within the fenced write's own statement (so can none)."""
    return all(isinstance(rider, Rider) and rider.joined is not None for rider in riders)


class DueRow(NamedTuple):
    """A run the due read found: what its claim compares and whom a takeover charges."""

    id: str
    #: The fence as read: the claim takes the run only if it is still this.
    fence: int
    module: str
    job: str
    #: The holder recorded on a lapsed lease (its pass stopped reporting), else ``None``.
    holder: str | None
    #: A task run's queue (``django_jobruns.backend``); ``None`` for a job run.
    queue_name: str | None
    #: Its priority: the due order's first key, highest first.
    priority: int
    #: When the run became due: its position in the due order (the next page starts after it).
    due_since: Any


def run_of(values: tuple[Any, ...] | list[Any]) -> JobRun:
    """The run a claim read back: ``values`` in :data:`RUN_FIELDS`' order, each other field its default.

    What ``JobRun(**dict(zip(RUN_FIELDS, values)))`` builds, built positionally: Django's
    keyword path looks each of the model's fields up by name on every run a drive takes.
    """
    defaults, places, fresh = _run_layout()
    args = list(defaults)
    for position, index in places:
        args[position] = values[index]
    for position, field in fresh:
        args[position] = field.get_default()
    return JobRun(*args)  # type: ignore[misc]  # the stubs know the keyword form only


@functools.cache
def _run_layout() -> tuple[tuple[Any, ...], tuple[tuple[int, int], ...], tuple[tuple[int, Any], ...]]:
    """The model's concrete fields in order: their constant defaults, where a claim's row holds each
    of :data:`RUN_FIELDS`, and the fields whose default is made afresh for each run."""
    place = {name: index for index, name in enumerate(RUN_FIELDS)}
    defaults: list[Any] = []
    places, fresh = [], []
    for position, field in enumerate(JobRun._meta.concrete_fields):
        index = place.get(field.name)
        constant = index is None and not (field.has_default() and callable(field.default))
        defaults.append(field.get_default() if constant else None)
        if index is not None:
            places.append((position, index))
        elif not constant:
            fresh.append((position, field))
    return tuple(defaults), tuple(places), tuple(fresh)


@dataclass(frozen=True)
class ClaimedRow:
    """The run as the claim left it, and whether it is still due (re-read under the claim).

    ``ledger`` is the run's step ledger when the claim could read it in the same
    statement (PostgreSQL), else ``None``: read it separately.
    """

    run: JobRun
    due: bool
    ledger: Ledger | None = None


class PlainClaim(NamedTuple):
    """A claim with no charge to write: the due row, the new fence, the holder, the lease's expiry, and now."""

    row: DueRow
    fence: int
    holder: str
    expires: Expiry
    #: Judges the claimed run's backoff (the re-read's ``due``).
    now: datetime

    @classmethod
    def of(cls, row: DueRow, holder: str, expires: Expiry, now: datetime) -> PlainClaim:
        """The claim of ``row``: its new fence is the one read with it plus one (D2)."""
        return cls(row, row.fence + 1, holder, expires, now)


class ClaimRider:
    """A claim that rides with another write (the drive's next run): called with its cursor.

    A database that can write both in one statement (PostgreSQL's pass
    commit) asks :meth:`arguments` and :meth:`riding` instead, and tells
    :meth:`took` what it claimed.
    """

    def __call__(self, cur: Any) -> None:
        raise NotImplementedError

    def arguments(self) -> PlainClaim | None:
        """The claim, as it is sent; ``None``: not to be made."""
        raise NotImplementedError

    def riding(self, claim: PlainClaim) -> Riders:
        """What its job writes with the claim ``claim``, if it holds (a task's attempt record begun)."""
        raise NotImplementedError

    def took(self, claimed: ClaimedRow | None) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Committed:
    """A pass commit that held: the run's pause as the commit left it (``None`` if it was not paused)."""

    paused_at: datetime | None


@dataclass(slots=True)
class StepWrite:
    """A step record to write under a claim, and the claim's lease as the pass knows it."""

    run_id: str
    fence: int
    step: str
    result: str | None
    attempts: int
    error: str | None
    at: datetime
    #: The lease's new expiry, if this write renews it.
    expires: Expiry
    #: Whether the step has a row already (an earlier failed attempt).
    exists: bool
    #: How much of the lease is left, and its length: whether a renewal is due.
    lease_left: timedelta
    ttl: timedelta
