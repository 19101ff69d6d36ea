"""Waking drives that wait for work: NOTIFY on PostgreSQL, polling elsewhere."""

from __future__ import annotations

import logging

from django.db import DatabaseError, transaction

from . import db

logger = logging.getLogger("django_jobruns")

CHANNEL = "django_jobruns"


def notify() -> None:
    """Send a NOTIFY on PostgreSQL when the current transaction commits (at once outside one)."""
    wrapper = db.connection()
    if wrapper.vendor != "postgresql":
        return

    def send() -> None:
        try:
            with wrapper.cursor() as cur:
                cur.execute("SELECT pg_notify(%s, '')", [CHANNEL])
        except DatabaseError:
            # Only a wake-up: waiting drives poll as well, so a lost one costs latency, not work.
            logger.warning("could not notify waiting drives", exc_info=True)

    transaction.on_commit(send, using=wrapper.alias)
