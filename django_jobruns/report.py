"""The drive's report: what one ``run_due_jobs`` call did, counted as it happens (threads included)."""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .outcomes import PassOutcome

logger = logging.getLogger("django_jobruns")


class Count(enum.Enum):
    """The drive's own counts (the passes' outcomes are counted by :class:`Outcome`)."""

    ATTEMPTED = "attempted"
    SKIPPED = "skipped"
    STALE = "stale"
    LOST = "lost"
    UNRELEASED = "unreleased"
    UNREGISTERED = "unregistered"
    TAKEN_OVER = "taken_over"
    TIMED_OUT = "timed_out"


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
    #: Due runs stepped over because no job of this process is registered under their key
    #: (each run once, however many times a waiting drive looked).
    unregistered: int = 0
    #: Runs taken over from a holder whose lease lapsed unreleased (its pass was charged).
    taken_over: int = 0
    #: Passes that ran past their timeout (D19): no longer renewed, failed or taken over.
    timed_out: int = 0
    #: Schedules' ticks this drive started (a run started or a task enqueued), and those that joined a
    #: run of the schedule still live (S2, S3).
    ticks: int = 0
    ticks_joined: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stopped: bool = False
    #: Runs whose pass could not be recorded at all (the database failed under
    #: it): nothing was written, and the run is taken again by a later drive.
    unrecorded: list[tuple[str, str]] = field(default_factory=list)
    #: The due runs stepped over because their job is not registered here, by job ("app_label.name").
    unregistered_runs: dict[str, set[str]] = field(default_factory=dict)
    #: What each run with an error or a warning is (``JobRun.title``: a task's path, else ``app_label.job``).
    titles: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _began: float = field(default_factory=time.monotonic, repr=False, compare=False)
    #: The schedules' next tick, as the last look saw it: a drive waiting for work wakes for it (S4).
    next_tick: Any = field(default=None, repr=False, compare=False)

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
        "timed_out",
        "ticks",
        "ticks_joined",
    )
    #: Counts the one-line summary shows only when they are not zero.
    RARE = ("unregistered", "taken_over", "timed_out", "ticks", "ticks_joined")

    def add(self, count: Count) -> None:
        with self._lock:
            setattr(self, count.value, getattr(self, count.value) + 1)

    def record(self, run_id: str, outcome: PassOutcome, title: str | None = None) -> None:
        with self._lock:
            if title is not None and (outcome.error is not None or outcome.warning is not None):
                self.titles[run_id] = title
            name = outcome.status.value
            setattr(self, name, getattr(self, name) + 1)
            if outcome.error is not None and outcome.status.value != "unregistered":
                self.errors.append((run_id, outcome.error))
            if outcome.warning is not None:
                self.warnings.append(f"run {run_id}: {outcome.warning}")

    def stepped_over(self, run_id: str, outcome: PassOutcome, title: str) -> None:
        """A run this process gave back untouched (a task it cannot import): counted, and named once per drive."""
        with self._lock:
            seen = self.unregistered_runs.setdefault(title, set())
            first = not seen
            seen.add(run_id)
        self.record(run_id, outcome, title)
        if first:
            logger.warning("due run(s) of %s are not driven: %s; e.g. run %s", title, outcome.error, run_id)

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
        data["unregistered_jobs"] = {label: len(ids) for label, ids in sorted(self.unregistered_runs.items())}
        # Each unregistered job's runs by id, so an operator's tooling can act on them (up to 100 a job).
        data["unregistered_runs"] = {label: sorted(ids)[:100] for label, ids in sorted(self.unregistered_runs.items())}
        data["runs"] = dict(sorted(self.titles.items()))
        data["seconds"] = round(self.seconds, 3)
        return data

    @property
    def seconds(self) -> float:
        """How long the drive has taken (to now, once it has returned: to when it was reported)."""
        return time.monotonic() - self._began

    def summary(self) -> str:
        counts = " ".join(f"{name}={getattr(self, name)}" for name in self.COUNTS if name not in self.RARE)
        rare = "".join(f" {name}={getattr(self, name)}" for name in self.RARE if getattr(self, name))
        return f"{counts} stopped={'yes' if self.stopped else 'no'}{rare}"
