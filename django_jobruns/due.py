"""The due read: the runs a drive may take now, in the order they became due (D1, D9).

Runs of jobs this process does not register are stepped over -- never failed --
counted once per drive, named in the log and marked on the run for the admin.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db import DatabaseError

from . import db
from .holders import default_holder
from .models import MARKED_UNREGISTERED, TASKS_MODULE, UNREGISTERED_WARNING, JobRun, Status
from .registry import Job, lookup
from .report import Count, DriveReport
from .store import store, watchdog
from .store.base import DueRow

logger = logging.getLogger("django_jobruns")


def due_rows(
    jobs: Iterable[Job],
    now: datetime | None,
    limit: int,
    scan_max: int,
    report: DriveReport,
    queues: frozenset[str] | None = None,
    *,
    limited: bool = False,
) -> list[DueRow]:
    """Read the oldest due runs of ``jobs`` at ``now`` (``None``: by the database's clock), until ``limit`` are found.

    ``limit`` counts runnable runs, not rows read: runs of jobs this process
    does not drive (another deployment's, or a registration since removed) are
    stepped over, never failed, and the read pages past them -- at most
    ``scan_max`` rows, so a table full of them cannot turn a drive into a scan.
    A drive ``limited`` to some jobs, or given ``queues``, asks the database for
    those only (D1): a backlog of other runs never starves it.
    """
    wanted = {entry.key for entry in jobs}
    pairs = sorted(wanted) if limited else None
    chosen = sorted(queues) if queues is not None else None
    # Runs this drive already stepped over (a task it cannot import): looked at once per drive.
    stepped = {run_id for ids in report.unregistered_runs.values() for run_id in ids}
    found: list[DueRow] = []
    unregistered: list[DueRow] = []
    scanned = 0
    after: DueRow | None = None
    while len(found) < limit and scanned < scan_max:
        # Pages of at least 50 rows, so that a small limit behind many orphans
        # costs a few reads rather than one per orphan.
        page = min(max(limit, 50), scan_max - scanned)
        batch = store().due(now, after, page, jobs=pairs, queues=chosen)
        scanned += len(batch)
        for row in batch:
            if row.id in stepped:
                continue
            if (row.module, row.job) in wanted:
                found.append(row)
            elif lookup(row.module, row.job) is None:
                unregistered.append(row)
        if len(batch) < page:
            break  # the end of the due runs
        after = batch[-1]
    if unregistered:
        _say_unregistered(unregistered, report)
    return found[:limit]


def _say_unregistered(rows: list[DueRow], report: DriveReport) -> None:
    """Name the jobs nobody here drives, once per drive each, and mark their runs once for the admin.

    The mark is the run's ``last_warning``, written the first time any drive
    steps over the run (one UPDATE of the new ones), never again: a look every
    poll costs no writes.
    """
    new: dict[str, list[str]] = {}
    for row in rows:
        label = f"{row.module}.{row.job}"
        seen = report.unregistered_runs.setdefault(label, set())
        if row.id not in seen:  # counted once per drive, however often it looks
            seen.add(row.id)
            report.add(Count.UNREGISTERED)
            new.setdefault(label, []).append(row.id)
    for label, ids in new.items():
        if len(report.unregistered_runs[label]) == len(ids):  # the first sighting of this job in this drive
            logger.warning("%d due run(s) of %s are not driven: %s; e.g. run %s", len(ids), label, _why(label), ids[0])
    if not new:
        return
    where = f"in the process that drove it ({default_holder()}), seen {db.now():%Y-%m-%d %H:%M:%S} UTC"
    try:
        with watchdog.guarded(db.connection()):
            for label, ids in new.items():
                note = f"{UNREGISTERED_WARNING} {where}: {_why(label)}"
                JobRun.objects.using(db.alias()).filter(pk__in=ids, status=Status.RUNNING).exclude(
                    MARKED_UNREGISTERED
                ).update(last_warning=note)
    except DatabaseError:
        logger.debug("could not mark the runs whose job is not registered", exc_info=True)


def _why(label: str) -> str:
    """What is missing in this process for runs of ``label`` to be driven: a job, or a Tasks backend."""
    module, _, name = label.rpartition(".")
    if module == TASKS_MODULE:
        return (
            f"no Tasks backend {name!r} of this app is in this process's TASKS setting (its tasks wait for a "
            "process whose TASKS has it)"
        )
    return (
        "no job of that name is registered in this process (jobs are registered when Django imports each "
        "installed app's jobs.py)"
    )
