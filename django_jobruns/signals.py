"""Signals sent as runs progress, after the write they report has committed.

Each is sent with ``sender=JobRun`` and keyword arguments ``run_id``, ``module``,
``job`` and ``instance``, plus:

- ``pass_committed``: ``cursor`` and ``counters`` (decoded) and ``done``;
- ``run_completed``: ``cursor`` and ``counters``;
- ``run_failed``: ``error`` (the last error's first line) and ``counters``;
- ``run_cancelled``: ``reason`` (as given to ``cancel_job_run``).

Receivers run in the worker, after the commit (inside a caller's transaction,
on its commit). A receiver that raises is logged and does not disturb the drive.
An alerting example::

    from django.dispatch import receiver
    from django_jobruns.signals import run_failed

    @receiver(run_failed)
    def page_someone(sender, run_id, module, job, instance, error, **kwargs):
        alerts.send(f"{module}.{job} [{instance}] failed: {error} (run {run_id})")
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from . import db

logger = logging.getLogger("django_jobruns")

pass_committed = Signal()
run_completed = Signal()
run_failed = Signal()
run_cancelled = Signal()


def notify_due() -> None:
    """Tell waiting drives that a run became due (on commit, if in a transaction).

    On PostgreSQL a ``NOTIFY`` on the ``django_jobruns`` channel wakes drives
    waiting with a time budget; elsewhere they poll, and this does nothing.
    """
    from .store import notify

    notify.notify()


def send_after_commit(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` once the current transaction (if any) has committed."""
    from .models import JobRun

    def send() -> None:
        for receiver, result in signal.send_robust(sender=JobRun, **kwargs):
            if isinstance(result, Exception):
                logger.error(
                    "run %s: a receiver of a django_jobruns signal failed: %r (%s)",
                    kwargs.get("run_id"),
                    result,
                    receiver,
                    exc_info=result,
                )

    wrapper = db.connection()
    if wrapper.in_atomic_block:
        transaction.on_commit(send, using=wrapper.alias)
    else:
        send()


def send_run_failed(run: Any, error: str) -> None:
    """Send :data:`run_failed` for ``run`` (a ``JobRun``) after the write that failed it commits."""
    from .exceptions import UndecodableRun
    from .queue_safety import decode_counters

    try:
        counters = decode_counters(run.counters)
    except UndecodableRun:
        counters = {}
    send_after_commit(
        run_failed, run_id=run.id, module=run.module, job=run.job, instance=run.instance, error=error, counters=counters
    )
