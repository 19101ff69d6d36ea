"""Steering live runs: cancel, pause, unpause, retry now.

Each is one conditional UPDATE of the run's row, so it is safe against a
drive working the run on another host at the same moment:

- ``cancel_job_run`` ends the run (``cancelled``: terminal, key freed, record
  and ledger kept) and bumps its fence, so a pass in flight is refused at its
  next step record or commit (it is reported ``lost``) and starts no step after.
- ``pause_job_run`` holds the run: not due, key kept (a start joins it), cursor
  kept. A pass in flight finishes; a drive takes no further pass of it.
- ``unpause_job_run`` lets it go on where it stopped.
- ``retry_job_run_now`` makes a run waiting out its backoff due at once.
"""

from __future__ import annotations

from typing import Any

from . import db, signals, transitions
from .exceptions import NotLive
from .models import JobRun, Status
from .outcomes import storable
from .queue_safety import unstorable


def _run_id(run: JobRun | str) -> str:
    run_id = run.pk if isinstance(run, JobRun) else run
    if not isinstance(run_id, str) or not run_id:
        raise NotLive(f"not a run or a run id: {run!r:.200}")
    if unstorable(run_id):  # no row holds it: PostgreSQL would refuse the lookup itself
        raise NotLive(f"no run has the id {run_id!r:.200}")
    return run_id


def _live(run_id: str, verb: str) -> JobRun:
    """The run as it is now; refuse a finished or unknown run."""
    current = JobRun.objects.using(db.alias()).filter(pk=run_id).first()
    if current is None:
        raise NotLive(f"no run has the id {run_id!r}")
    if current.status != Status.RUNNING:
        raise NotLive(f"run {run_id} is {current.status}; only a live run can be {verb}")
    return current


def _steer(run: JobRun | str, verb: str, **fields: Any) -> JobRun:
    """Apply ``fields`` to the run in one conditional UPDATE if it is live; refuse a finished or unknown run."""
    run_id = _run_id(run)
    changed = JobRun.objects.using(db.alias()).filter(pk=run_id, status=Status.RUNNING).update(**fields)
    if not changed:
        _live(run_id, verb)  # raises: finished or unknown
    current = JobRun.objects.using(db.alias()).filter(pk=run_id).first()
    assert current is not None  # runs are deleted only by pruning, and only finished ones
    return current


def cancel_job_run(run: JobRun | str, *, reason: str = "") -> JobRun:
    """Cancel a live run (running or paused); return it as cancelled.

    Terminal: ``ended_at`` is stamped, the key is freed for a new start, the
    record and its ledger are kept. The fence is bumped, so a pass in flight is
    refused at its next write. A finished run is refused with :class:`NotLive`.
    Sends ``run_cancelled``.
    """
    if not isinstance(reason, str):
        raise TypeError(f"reason must be text, got {reason!r:.100}")
    now = db.now()
    note = f"cancelled: {reason}" if reason else "cancelled"
    current = _steer(run, "cancelled", **transitions.cancelled(storable(note), now))
    signals.send_after_commit(
        signals.run_cancelled,
        run_id=current.id,
        module=current.module,
        job=current.job,
        instance=current.instance,
        reason=reason,
    )
    return current


def pause_job_run(run: JobRun | str) -> JobRun:
    """Hold a live run: not due until unpaused; its key and cursor are kept. Idempotent."""
    now = db.now()
    run_id = _run_id(run)
    JobRun.objects.using(db.alias()).filter(pk=run_id, status=Status.RUNNING, paused_at__isnull=True).update(
        **transitions.paused(now)
    )
    return _live(run_id, "paused")


def unpause_job_run(run: JobRun | str) -> JobRun:
    """Let a paused run go on where it stopped. Idempotent on a run that is not paused."""
    now = db.now()
    run_id = _run_id(run)
    JobRun.objects.using(db.alias()).filter(pk=run_id, status=Status.RUNNING, paused_at__isnull=False).update(
        **transitions.unpaused(now)
    )
    current = _live(run_id, "unpaused")
    signals.notify_due()
    return current


def retry_job_run_now(run: JobRun | str) -> JobRun:
    """Make a live run waiting out its backoff due at once (a paused one stays paused)."""
    current = _steer(run, "retried", **transitions.made_due(db.now()))
    signals.notify_due()
    return current
