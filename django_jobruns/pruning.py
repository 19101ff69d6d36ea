"""Deleting finished runs the table no longer needs to retain.

Retention must keep up with a busy deployment (millions of finished runs), so
a prune works in bounded batches, each its own short transaction: it takes a
batch of ids through the ``jobruns_prune`` index (status, ended_at), clears the
lineage links that point at them, and deletes their ledger rows and the runs --
on PostgreSQL in ONE statement per batch (data-modifying CTEs: the ids never
travel to Python and back), elsewhere in a read and three statements. No
transaction holds locks a drive needs for long, and only finished runs are
ever touched, so a drive working live runs never waits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from . import db
from .models import TERMINAL, JobRun
from .store import store

FINISHED = tuple(str(status) for status in TERMINAL)
BATCH_SIZE = 2_000


def prune_job_runs(
    *,
    older_than: timedelta,
    statuses: Iterable[str] = FINISHED,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete finished runs that ended more than ``older_than`` ago; return how many.

    Only finished runs (``done``, ``failed``, ``cancelled``) are ever deleted: a
    live run is never "old". Deleted in batches of ``batch_size``, each its own
    transaction, ledger rows included. Runs restarted from a pruned run keep
    working; their ``restarted_from`` becomes empty. ``progress`` is called
    with the running total after each batch.
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValueError(f"older_than must be a timedelta of zero or more, got {older_than!r}")
    wanted = list(statuses)
    refused = [s for s in wanted if s not in FINISHED]
    if refused or not wanted:
        raise ValueError(
            f"only finished runs can be pruned ({', '.join(FINISHED)}); got {', '.join(map(str, refused)) or 'nothing'}"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000:
        raise ValueError(f"batch_size must be a whole number from 1 to 100000, got {batch_size!r}")
    try:
        cutoff = (now or db.now()) - older_than
    except OverflowError:
        return 0  # older than anything a calendar holds: nothing qualifies
    using = db.alias()
    old = JobRun.objects.using(using).filter(status__in=wanted, ended_at__lt=cutoff)
    if dry_run:
        return old.count()
    batches = store()
    deleted = 0
    while True:
        # Each batch its own transaction, through the (status, ended_at) index.
        taken, count = batches.prune_batch(wanted, cutoff, batch_size)
        deleted += count
        if count and progress is not None:
            progress(deleted)
        if taken < batch_size:
            return deleted  # a short batch: nothing was left to take
