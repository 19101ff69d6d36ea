"""The run's transitions, defined once in django_jobruns.transitions."""

from __future__ import annotations

from datetime import UTC, datetime

from django_jobruns import transitions
from django_jobruns.models import Status

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_every_status_is_reached_by_a_listed_transition():
    table = transitions.__doc__ or ""
    for status in Status:
        assert f" {status.value}" in table, f"no transition in the table reaches {status.value!r}"


def test_each_ending_frees_the_key_and_the_lease_and_each_other_keeps_the_key():
    endings = [
        transitions.advanced("1", "{}", NOW, done=True, lease_until=NOW),
        transitions.attempt_failed(3, "boom", NOW, next_attempt_at=None),
        transitions.abandoned("stopped reporting", NOW),
        transitions.cancelled("cancelled", NOW),
    ]
    for fields in endings:
        assert fields["status"] in (Status.DONE, Status.FAILED, Status.CANCELLED)
        assert fields["live"] is None and fields["ended_at"] == NOW, fields
        assert fields["lease_holder"] is None and fields["lease_expires_at"] is None, fields
    going_on = [
        transitions.advanced("1", "{}", NOW, done=False, lease_until=NOW),
        transitions.advanced("1", "{}", NOW, done=False, lease_until=None),
        transitions.attempt_failed(1, "flaky", NOW, next_attempt_at=NOW),
        transitions.released(),
        transitions.paused(NOW),
        transitions.unpaused(NOW),
        transitions.made_due(NOW),
    ]
    for fields in going_on:
        assert "status" not in fields and "live" not in fields and "ended_at" not in fields, fields
    assert transitions.advanced("1", "{}", NOW, done=False, lease_until=NOW)["lease_expires_at"] == NOW
    assert transitions.advanced("1", "{}", NOW, done=False, lease_until=None)["lease_holder"] is None
