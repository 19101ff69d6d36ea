"""The drive's options, checked before anything is claimed (D6), as one frozen value."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from . import conf, db
from .exceptions import InvalidDriveOptions
from .holders import holder_name
from .registry import Job, get_job, registered_jobs

#: ``max_passes`` with a time budget and no cap of its own: the budget bounds the passes.
_UNLIMITED = 10**9


class StopSignal(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class DriveOptions:
    """What one drive was asked to do, checked (D6): built by :meth:`from_arguments`, never changed."""

    limit: int
    max_passes: int
    holder: str
    lease_ttl: timedelta
    concurrency: int
    jobs: tuple[Job, ...]
    stop: StopSignal | None
    #: The one clock of due-ness, backoff and lease expiry (D12).
    clock: db.Clock
    #: Seconds of work with waits between (D14); ``None``: one bounded pass.
    budget: float | None
    #: The task queues this drive works (``None``: every queue); job runs have none and are always driven.
    queues: frozenset[str] | None = None
    #: Whether ``jobs`` was given (the due read asks for those jobs only), not every registered job.
    limited: bool = False

    def asked_to_stop(self) -> bool:
        """Whether the drive was asked to stop (SIGTERM, the caller's ``stop``): no new round or claim begins."""
        return self.stop is not None and self.stop.is_set()

    def ending(self, deadline: float | None) -> bool:
        """Whether the drive is ending (D18): asked to stop, or its budget (``deadline``, monotonic) spent."""
        return self.asked_to_stop() or (deadline is not None and time.monotonic() >= deadline)

    @classmethod
    def from_arguments(
        cls,
        *,
        limit: Any = None,
        max_passes: Any = None,
        holder: Any = None,
        lease_ttl: Any = None,
        concurrency: Any = 1,
        jobs: Any = None,
        stop: Any = None,
        now: Any = None,
        max_seconds: Any = None,
        queues: Any = None,
    ) -> DriveOptions:
        """Check ``run_due_jobs``'s arguments: :class:`InvalidDriveOptions` names the first that is wrong."""
        limit = positive_int(conf.get("DRIVE_LIMIT") if limit is None else limit, "limit")
        budget = _budget(max_seconds)
        if max_passes is None:
            max_passes = 1 if budget is None else _UNLIMITED
        max_passes = positive_int(max_passes, "max_passes")
        concurrency = positive_int(concurrency, "concurrency")
        ttl = lease_length(lease_ttl)
        holder = holder_name(holder)
        selected = _selected_jobs(jobs)
        if stop is not None and not callable(getattr(stop, "is_set", None)):
            raise InvalidDriveOptions(f"stop must be a threading.Event (or have is_set()), got {stop!r}")
        clock = drive_clock(now)  # last: without ``now`` it reads the database's clock
        return cls(
            limit,
            max_passes,
            holder,
            ttl,
            concurrency,
            tuple(selected),
            stop,
            clock,
            budget,
            _queues(queues),
            limited=jobs is not None,
        )

    @property
    def statement_bound(self) -> float:
        """The longest one statement of the drive may take (D15): half the drive's lease.

        Then a statement hung by a partition is cut (and the drive goes on)
        while a lease it set still holds.
        """
        return self.lease_ttl.total_seconds() / 2

    def lease_for(self, job: Job) -> timedelta:
        """A job's own lease (D13), else the drive's."""
        return job.lease or self.lease_ttl


def positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDriveOptions(f"{name} must be a whole number >= 1, got {value!r}")
    if value < 1:
        raise InvalidDriveOptions(f"{name} must be >= 1, got {value}: it would drive nothing while reporting success")
    return value


def lease_length(value: Any) -> timedelta:
    """The drive's lease: ``value``, else ``JOBRUNS["LEASE_TTL"]``, checked as :func:`conf.duration`."""
    try:
        return conf.duration(conf.get("LEASE_TTL") if value is None else value, "lease_ttl")
    except ValueError as exc:
        raise InvalidDriveOptions(str(exc)) from None


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


def drive_clock(value: Any) -> db.Clock:
    if value is None:
        return db.database_clock()
    if not callable(value):
        raise InvalidDriveOptions(f"now must be a callable returning an aware datetime, got {value!r}")
    return db.InjectedClock(value)


def _queues(value: Any) -> frozenset[str] | None:
    """The task queues a drive works: ``None`` or ``"*"`` for every queue; each name one some backend has."""
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    try:
        chosen = frozenset(names)
    except TypeError:
        raise InvalidDriveOptions(f"queues must be a list of queue names, got {value!r}") from None
    if not chosen or not all(isinstance(name, str) and name for name in chosen):
        raise InvalidDriveOptions(f"queues must be non-empty queue names (None: every queue), got {value!r}")
    if "*" in chosen:
        return None  # every queue, as db_worker's --queue-name '*'
    known = _known_queues()
    unknown = sorted(chosen - known) if known is not None else []
    if unknown:
        raise InvalidDriveOptions(
            f"no tasks backend of this app has the queue(s) {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(sorted(known or ()))}): a worker of them would idle"
        )
    return chosen


def _known_queues() -> set[str] | None:
    """Every queue of this app's Tasks backends (``QUEUES``; ``None`` when one of them takes any name)."""
    known: set[str] = set()
    for params in conf.task_backends().values():
        queues = params.get("QUEUES", ["default"])  # Django's default: the default queue only
        if not queues:
            return None  # an empty list: Django takes any queue name
        known.update(queues)
    return known


def _budget(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidDriveOptions(f"max_seconds must be a positive number of seconds, got {value!r:.100}")
    if value > 86_400:
        raise InvalidDriveOptions(f"max_seconds must be at most a day (86400), got {value!r}")
    return float(value)
