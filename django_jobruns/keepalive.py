"""Keep-alive: a claim's lease renewed while its pass's body runs (D17), and the pass's time limit (D19).

A step's record renews the lease as it is written (D3), so a pass of short
steps needs nothing more. A body that runs longer -- a step calling a slow
upstream, a task, a handler between steps -- would outlive its lease and be
taken over while it still runs. So every claim is *kept* from the moment it is
taken until its last write: one thread per process renews each kept claim whose
lease was last set a third of its length ago, in one fenced statement on a
connection of its own (the body's connection is never touched from here), each
statement bounded by the watchdog (D15).

What a renewal finds is handed to the pass through the claim (D18,
``p.stopping``): another fence (the run was cancelled or taken over) marks the
claim lost; a pause marks it paused (renewals go on: a paused run's lease is
still its holder's until the pass ends). A pass past its ``timeout`` is no
longer renewed; a body that returns before only a quarter of its lease is left is a
failed attempt (:class:`~django_jobruns.exceptions.PassTimedOut`), and one
still running then ends its process (the watchdog's, which no statement holds
up): its run is taken over as after a kill, and never beside a body that still
runs.

A lease therefore lapses only when its holder stops renewing: the process was
killed or stopped, or its network cut.

Cost: nothing while every body is shorter than a third of its lease (the step
records renew it first); then one statement per third of a lease per body.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from . import db
from .conf import MIN_LEASE
from .store import watchdog

if TYPE_CHECKING:
    from .claims import Claim

logger = logging.getLogger("django_jobruns")

_cond = threading.Condition()
#: The claims kept alive now, by id.
_kept: dict[int, Claim] = {}
#: Whether this process's keep-alive thread runs, and when it next wakes (monotonic; ``inf``: when told).
_state: dict[str, Any] = {"started": False, "wake_at": float("inf")}
#: How soon a renewal that failed is tried again.
RETRY_SECONDS = 1.0
#: How often an idle keep-alive looks, at the longest: below a third of the shortest lease, so a
#: claim kept while it waits needs no wake-up (a wake-up per claim costs a pass ~5 % on SQLite).
IDLE_SECONDS = MIN_LEASE.total_seconds() / 4
_sent = [0]


def renewals() -> int:
    """How many renewals this process has sent (the keep-alive's load, for tests and benchmarks)."""
    return _sent[0]


def _forked() -> None:
    """A forked child has none of its parent's threads: it starts its own keep-alive when it needs one."""
    global _cond
    _cond = threading.Condition()
    _kept.clear()
    _state.update(started=False, wake_at=float("inf"))


os.register_at_fork(after_in_child=_forked)


def keep(claim: Claim) -> None:
    """Renew ``claim``'s lease while it is held, until :func:`forget`."""
    due = claim.next_renewal()
    with _cond:
        _kept[id(claim)] = claim
        if not _state["started"]:
            _state["started"] = True
            _state["wake_at"] = float("inf")
            threading.Thread(target=_keep_alive, name="jobruns-keepalive", daemon=True).start()
        if due < _state["wake_at"]:
            _state["wake_at"] = due
            _cond.notify()
    watchdog.kept()


def _lapses_at(claim: Claim) -> float:
    """When (monotonic) ``claim``'s lease lapses by its holder's count: from when the statement that set it was sent."""
    return claim.kept_at + claim.ttl.total_seconds()


def first_lapse() -> float | None:
    """When (monotonic) the first kept lease lapses, counted from when the statement that set it was sent.

    The watchdog's, for the sentinel: a process frozen while running until then (a
    body holding the interpreter's lock) is ended just before, so that no other
    drive takes a run whose body still runs. Read without the lock (the watchdog
    holds its own): a copy of the claims is one step of the interpreter.
    """
    claims = list(_kept.values())
    if not claims:
        return None
    return min(_lapses_at(claim) for claim in claims)


watchdog.watch_leases(first_lapse)


#: A body still running this long before its lease lapses by its holder's count, its renewals failing (cut off
#: from the database, its row held), ends its process (D17): the watchdog looks every tenth of a second.
LAPSE_END = 0.25


def overdue() -> list[tuple[float, str, bool]]:
    """When (monotonic) each kept claim's body must have returned, its run, and whether it is past its timeout.

    Past its timeout (D19): when a quarter of its lease is left, its renewals
    stopped. Else: just before its lease lapses, which renewals that land push
    on; only those that fail let it come (a body that checks ``p.stopping`` has
    returned by then). Not while a step's record is in flight: the watchdog
    cuts that write. The watchdog ends the process then, before any drive can
    take the run over.
    """
    ends = []
    for claim in list(_kept.values()):
        if claim.timed_out:
            ends.append((_lapses_at(claim) - claim.ttl.total_seconds() / 4, claim.run_id, True))
        elif not claim.writing:
            ends.append((_lapses_at(claim) - LAPSE_END, claim.run_id, False))
    return ends


watchdog.watch_timeouts(overdue)


def forget(claim: Claim) -> None:
    """Stop renewing ``claim`` (before its last write, or when it is lost or abandoned)."""
    with _cond:
        _kept.pop(id(claim), None)


def kept(claim: Claim) -> bool:
    with _cond:
        return id(claim) in _kept


def _keep_alive() -> None:
    connected = False
    while True:
        with _cond:
            while True:
                now = time.monotonic()
                due = [claim for claim in _kept.values() if claim.next_renewal() <= now]
                if due:
                    break
                if connected:
                    break  # nothing due: close the connection before a long wait
                wake = min((claim.next_renewal() for claim in _kept.values()), default=now + IDLE_SECONDS)
                _state["wake_at"] = wake = min(wake, now + IDLE_SECONDS)
                _cond.wait(wake - now)
                _state["wake_at"] = float("inf")
        if not due:
            _close()
            connected = False
            continue
        for claim in due:
            if kept(claim):
                renew(claim)
                connected = True


def _close() -> None:
    try:
        db.connection().close()
    except Exception:
        logger.debug("the keep-alive connection could not be closed", exc_info=True)


def renew(claim: Claim) -> None:
    """Renew one kept claim's lease, or say why not (lost, paused, past its timeout)."""
    if claim.lost:
        forget(claim)
        return
    if claim.past_timeout():
        claim.time_out()
        return
    if not claim.renewal_due():
        return  # looked at for its timeout only
    bound = claim.ttl.total_seconds() / 3
    _sent[0] += 1
    try:
        with watchdog.bounding(bound):
            claim.keep_alive()
    except DatabaseError as exc:
        from .outcomes import summary

        claim.renewal_failed(time.monotonic() + RETRY_SECONDS)
        logger.warning(
            "run %s: the lease's renewal failed (%s); again in %g s (%.1f s of the lease left)",
            claim.run_id,
            summary(exc),
            RETRY_SECONDS,
            claim.lease_left().total_seconds(),
        )
        db.replace_if_broken(bound)
    except Exception:
        claim.renewal_failed(time.monotonic() + RETRY_SECONDS)
        logger.exception("run %s: the lease's renewal failed", claim.run_id)
