"""Every change of a run's state, each defined once.

A run is ``running`` from its start until it ends ``done``, ``failed`` or
``cancelled``; while running it may be leased (a holder, an expiry, a fence),
backing off (``next_attempt_at``) or paused (``paused_at``). The ``live``
column holds the key while the run is running and is NULL once it ended (a
``CheckConstraint``, ``jobruns_live_iff_running``, ties the two), so a start
of the same key joins the live run and a finished one frees it.

=============  ==========================  ==========================  ===============================
transition     from                        to                          written by
=============  ==========================  ==========================  ===============================
start          --                          running                     ``starts.start_job_run`` (insert)
restart        failed (never restarted)    a new run, running          ``starts.restart_job_run``
claim          running, due, lease free    leased, fence + 1           ``claims.Claim.take``
takeover       lease lapsed unreleased     leased, fence + 1, and      ``claims.Claim.take``, with
                                           :func:`charged`             :func:`charged`
step           leased                      leased (memo, renewed)      ``claims.Claim.record_step``
advance        leased                      running (cursor, counters)  :func:`advanced` (commit)
complete       leased                      done                        :func:`advanced` (``done``)
retry          leased                      running, backing off        :func:`attempt_failed`
fail           leased                      failed                      :func:`attempt_failed`
abandon        lapsed, attempts spent      failed                      :func:`abandoned`
release        leased                      running, lease free         :func:`released`
step over      leased                      running, lease free, named  :func:`stepped_over`
cancel         running                     cancelled, fence + 1        :func:`cancelled`
pause          running                     running, paused             :func:`paused`
unpause        running, paused             running                     :func:`unpaused`
retry now      running, backing off        running, due                :func:`made_due`
=============  ==========================  ==========================  ===============================

Each function returns the fields its transition writes. The pass's
transitions are written under the claim's fence, by the claim
(:mod:`django_jobruns.claims`, the only caller of the store's fenced writes);
the operator's with a condition on the run being live
(``steering``), so either is safe against the other on another host.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F

from .models import Status


def advanced(
    cursor: str | None,
    counters: str,
    now: datetime,
    *,
    done: bool,
    lease_until: Any,
    warning: str | None = None,
) -> dict[str, Any]:
    """A pass committed: the run moves to ``cursor``, its attempts reset; ``done`` ends it.

    ``lease_until`` (the claim's ``extended()``) keeps the lease for the drive's
    next pass of the run; ``None`` gives it back.
    """
    fields: dict[str, Any] = {
        "cursor": cursor,
        "counters": counters,
        "attempts": 0,
        "last_error": None,
        "next_attempt_at": None,
        "updated_at": now,
        # Due again from now: behind the runs already waiting (live runs take turns, D9).
        "due_at": now,
    }
    if warning:
        fields["last_warning"] = warning
    if done:
        # An operator's pause that landed during the last pass ends with the run.
        fields.update(status=Status.DONE, ended_at=now, live=None, paused_at=None, due_at=None)
    if done or lease_until is None:
        fields.update(lease_holder=None, lease_expires_at=None)
    else:
        fields["lease_expires_at"] = lease_until
    return fields


def charged(error: str, now: datetime) -> dict[str, Any]:
    """A takeover found the lease lapsed with a holder recorded: that silent pass is charged a failed attempt (D10).

    Written by the claim's own statement, before the new holder's fields.
    """
    return {
        "attempts": F("attempts") + 1,
        "failed_passes": F("failed_passes") + 1,
        "last_error": error,
        "updated_at": now,
    }


def attempt_failed(attempts: int, error: str, now: datetime, *, next_attempt_at: datetime | None) -> dict[str, Any]:
    """A pass failed: the run backs off until ``next_attempt_at``, or -- ``None`` -- fails; the lease is given back."""
    fields: dict[str, Any] = {
        "attempts": attempts,
        "failed_passes": F("failed_passes") + 1,  # over the run's life: a commit does not reset it
        "last_error": error,
        "updated_at": now,
        "lease_holder": None,
        "lease_expires_at": None,
    }
    if next_attempt_at is None:
        fields.update(status=Status.FAILED, ended_at=now, next_attempt_at=None, live=None, due_at=None)
    else:
        fields.update(next_attempt_at=next_attempt_at, due_at=next_attempt_at)  # due when the backoff ends
    return fields


def abandoned(error: str, now: datetime) -> dict[str, Any]:
    """Its silent passes spent the run's policy: it fails without its handler being called again."""
    return {
        "status": Status.FAILED,
        "ended_at": now,
        "next_attempt_at": None,
        "due_at": None,
        "live": None,
        "last_error": error,
        "updated_at": now,
        "lease_holder": None,
        "lease_expires_at": None,
    }


def released() -> dict[str, Any]:
    """The drive gives the lease back without a pass's outcome (the pass recorded its own, or none ran)."""
    return {"lease_holder": None, "lease_expires_at": None}


def stepped_over(note: str) -> dict[str, Any]:
    """This process cannot work the run (its task cannot be imported here): the lease is given back, uncharged."""
    return {"lease_holder": None, "lease_expires_at": None, "last_warning": note}


def cancelled(note: str, now: datetime) -> dict[str, Any]:
    """An operator ended the run: terminal, key freed, fence bumped so a pass in flight is refused."""
    return {
        "status": Status.CANCELLED,
        "live": None,
        "ended_at": now,
        "updated_at": now,
        "paused_at": None,
        "next_attempt_at": None,
        "due_at": None,
        "lease_holder": None,
        "lease_expires_at": None,
        "lease_fence": F("lease_fence") + 1,
        "last_error": note,
    }


def paused(now: datetime) -> dict[str, Any]:
    """Not due until unpaused; key, cursor and a pass in flight untouched."""
    return {"paused_at": now, "updated_at": now}


def unpaused(now: datetime) -> dict[str, Any]:
    return {"paused_at": None, "updated_at": now}


def made_due(now: datetime) -> dict[str, Any]:
    """A run waiting out its backoff is due at once: its backoff ends now."""
    return {"next_attempt_at": None, "due_at": now}
