"""RetryPolicy: exponential backoff with a cap and jitter."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from django_jobruns import RetryPolicy


def test_backoff_doubles_up_to_the_cap_without_jitter():
    policy = RetryPolicy(max_attempts=10, base_delay=2, max_delay=30, factor=2, jitter=0)
    assert [policy.delay(n).total_seconds() for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    assert policy.delay(10_000) == timedelta(seconds=30), "no overflow far along the curve"


def test_jitter_shortens_by_at_most_its_fraction():
    policy = RetryPolicy(base_delay=100, max_delay=100, jitter=0.25)
    rng = random.Random(7)
    delays = [policy.delay(1, rng=rng).total_seconds() for _ in range(500)]
    assert all(75 <= d <= 100 for d in delays)
    assert max(delays) - min(delays) > 10, "jitter spreads retries out"


def test_next_attempt_at_and_exhaustion():
    policy = RetryPolicy(max_attempts=3, base_delay=timedelta(seconds=5), jitter=0)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert policy.next_attempt_at(2, now) == now + timedelta(seconds=10)
    assert not policy.exhausted(2) and policy.exhausted(3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"base_delay": -1}, "base_delay"),
        ({"max_delay": "soon"}, "max_delay"),
        ({"factor": 0.5}, "factor"),
        ({"jitter": 2}, "jitter"),
    ],
)
def test_bad_policies_are_refused(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        RetryPolicy(**kwargs)
