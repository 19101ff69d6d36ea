"""What an operator must know first about a run, said at the top of its page in a sentence or two.

The page below holds every field; this says what they add up to -- a lapsed
lease and who held it, a pause, a backoff and until when, who cancelled, why it
failed -- with exact times (to the second) beside the relative ones.
"""

from __future__ import annotations

import datetime
from typing import NamedTuple

from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..models import JobRun, Status
from .display import ago, exact_time, within


class Line(NamedTuple):
    """One sentence of the summary, and its kind: ``alert`` (act on it), ``warning``, ``info``."""

    kind: str
    text: SafeString


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def _at(moment: datetime.datetime, now: datetime.datetime) -> SafeString:
    relative = ago(moment, now) if moment <= now else within(moment, now)
    return format_html('<time datetime="{}">{}</time> ({})', moment.isoformat(), exact_time(moment), relative)


def summary(run: JobRun, now: datetime.datetime) -> list[Line]:
    """The run's state in words, most pressing first."""
    lines: list[Line] = []
    failures = (
        format_html(" after {} failed pass(es)", run.failed_passes) if run.failed_passes else format_html("{}", "")
    )
    if run.status == Status.CANCELLED:
        ended = run.ended_at or run.updated_at
        lines.append(Line("warning", format_html("Cancelled {}: {}.", _at(ended, now), _first_line(run.last_error))))
        return lines
    if run.status == Status.FAILED:
        ended = run.ended_at or run.updated_at
        lines.append(
            Line("alert", format_html("Failed {}{}: {}", _at(ended, now), failures, _first_line(run.last_error)))
        )
        return lines
    if run.status == Status.DONE:
        ended = run.ended_at or run.updated_at
        lines.append(Line("info", format_html("Done {}{}.", _at(ended, now), failures)))
        return lines
    if run.is_marked_unregistered:
        lines.append(Line("alert", format_html("{}", _first_line(run.last_warning))))
    if run.is_lapsed(now):
        assert run.lease_expires_at is not None  # noqa: S101 -- is_lapsed says so
        lines.append(
            Line(
                "alert",
                format_html(
                    "Lapsed lease: its holder {} stopped reporting; the lease expired {}. The next drive takes the "
                    "run over and counts that pass as a failed attempt.",
                    run.lease_holder,
                    _at(run.lease_expires_at, now),
                ),
            )
        )
    elif run.is_leased(now):
        assert run.lease_expires_at is not None  # noqa: S101 -- is_leased says so
        lines.append(
            Line(
                "info",
                format_html(
                    "Being worked by {}; its lease runs to {}.", run.lease_holder, _at(run.lease_expires_at, now)
                ),
            )
        )
    if run.is_paused:
        assert run.paused_at is not None  # noqa: S101 -- is_paused says so
        lines.append(
            Line("warning", format_html("Paused {}: no drive takes it until it is unpaused.", _at(run.paused_at, now)))
        )
    if run.is_backing_off(now):
        assert run.next_attempt_at is not None  # noqa: S101 -- is_backing_off says so
        lines.append(
            Line(
                "warning",
                format_html(
                    "Backing off until {} after {} failed attempt(s) of this pass: {}",
                    _at(run.next_attempt_at, now),
                    run.attempts,
                    _first_line(run.last_error),
                ),
            )
        )
    if not lines:
        waiting = format_html(" (since {})", _at(run.due_at, now)) if run.due_at is not None else format_html("{}", "")
        lines.append(Line("info", format_html("Running, due for its next pass{}{}.", waiting, failures)))
    return lines
