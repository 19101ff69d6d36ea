"""Retry policy: how many attempts, and how long to wait between them."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

_rng = random.SystemRandom()


def as_timedelta(value: object) -> timedelta | None:
    """A timedelta as given, or a finite number of seconds as one; ``None`` for anything else."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return timedelta(seconds=value)
    return None


def _as_timedelta(value: timedelta | float | int, name: str) -> timedelta:
    delta = as_timedelta(value)
    if delta is None:
        raise TypeError(f"RetryPolicy.{name} must be a timedelta or a number of seconds, got {value!r}")
    if delta < timedelta(0):
        raise ValueError(f"RetryPolicy.{name} must not be negative, got {value!r}")
    return delta


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with a cap and jitter.

    Attempt ``n`` (1-based) that failed is followed, unless ``n`` reached
    ``max_attempts``, by a wait of ``min(max_delay, base_delay * factor ** (n - 1))``
    shortened by a random fraction of at most ``jitter``, so that runs failing
    together against one upstream do not all come back in the same instant.

    Used per job (``@job(retry=...)``), where it counts consecutive failed passes,
    and per step (``p.step(..., retry=...)``), where it counts that step's attempts.
    """

    max_attempts: int = 5
    base_delay: timedelta | float = timedelta(seconds=10)
    max_delay: timedelta | float = timedelta(minutes=10)
    factor: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        object.__setattr__(self, "base_delay", _as_timedelta(self.base_delay, "base_delay"))
        object.__setattr__(self, "max_delay", _as_timedelta(self.max_delay, "max_delay"))
        if (
            not isinstance(self.factor, (int, float))
            or isinstance(self.factor, bool)
            or not (math.isfinite(self.factor) and self.factor >= 1)
        ):
            raise ValueError(f"RetryPolicy.factor must be a finite number >= 1, got {self.factor!r}")
        if not isinstance(self.jitter, (int, float)) or isinstance(self.jitter, bool) or not (0 <= self.jitter <= 1):
            raise ValueError(f"RetryPolicy.jitter must be between 0 and 1, got {self.jitter!r}")

    def delay(self, attempt: int, *, rng: random.Random | None = None) -> timedelta:
        """Return the wait after failed attempt number ``attempt`` (1-based)."""
        assert isinstance(self.base_delay, timedelta) and isinstance(self.max_delay, timedelta)
        exponent = max(0, attempt - 1)
        base = self.base_delay.total_seconds()
        cap = self.max_delay.total_seconds()
        if base <= 0 or cap <= 0:
            seconds = 0.0
        elif self.factor > 1 and exponent * math.log(self.factor) >= math.log(cap / base):
            # Decided in log space: factor ** exponent overflows a float long
            # before any realistic cap is reached.
            seconds = cap
        else:
            seconds = min(cap, base * self.factor**exponent)
        seconds *= 1 - self.jitter * (rng or _rng).random()
        return timedelta(seconds=seconds)

    def next_attempt_at(self, attempt: int, now: datetime, *, rng: random.Random | None = None) -> datetime:
        """Return when the attempt after failed attempt ``attempt`` may start."""
        return now + self.delay(attempt, rng=rng)

    def exhausted(self, attempts: int) -> bool:
        """Return whether ``attempts`` failed attempts have used the policy up."""
        return attempts >= self.max_attempts


DEFAULT_RETRY = RetryPolicy()
