"""Deleting finished runs the table no longer needs to retain."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from . import db
from .models import TERMINAL, JobRun, JobStep

FINISHED = tuple(str(status) for status in TERMINAL)


def prune_job_runs(
    *,
    older_than: timedelta,
    statuses: Iterable[str] = FINISHED,
    dry_run: bool = False,
    batch_size: int = 500,
    now: datetime | None = None,
) -> int:
    """Delete finished runs that ended more than ``older_than`` ago; return how many.

    Only finished runs (``done``, ``failed``, ``cancelled``) are ever deleted (a running run is never
    "old"). Deleted in batches of ``batch_size``, each its own transaction, so a
    large prune never holds one giant transaction or lock. Runs restarted from
    a pruned run keep working; their ``restarted_from`` becomes empty.
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValueError(f"older_than must be a timedelta of zero or more, got {older_than!r}")
    wanted = list(statuses)
    refused = [s for s in wanted if s not in FINISHED]
    if refused or not wanted:
        raise ValueError(f"only finished runs can be pruned ({', '.join(FINISHED)}); got "
                         f"{', '.join(map(str, refused)) or 'nothing'}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    cutoff = (now or timezone.now()) - older_than
    using = db.alias()
    old = JobRun.objects.using(using).filter(status__in=wanted, ended_at__lt=cutoff)
    if dry_run:
        return old.count()
    deleted = 0
    while True:
        ids = list(old.order_by("id").values_list("id", flat=True)[:batch_size])
        if not ids:
            return deleted
        with transaction.atomic(using=using):
            JobRun.objects.using(using).filter(restarted_from_id__in=ids).update(restarted_from=None)
            JobStep.objects.using(using).filter(run_id__in=ids).delete()
            gone = JobRun.objects.using(using).filter(pk__in=ids, status__in=wanted).delete()[1]
            deleted += gone.get(JobRun._meta.label, 0)
