"""Deadlocks: retried, a bounded number of times, where the whole transaction can be.

InnoDB (MariaDB, MySQL) reports a deadlock whenever two transactions take
index locks in opposite orders -- a start inserting a key while a pass commit
frees it is enough -- and rolls one back. PostgreSQL does the same, more
rarely. The victim's transaction is gone, so it is safe to run it again; only
when it is not nested in a caller's transaction, which would have to be
retried as a whole.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import OperationalError

from .. import db
from .errors import is_deadlock

logger = logging.getLogger("django_jobruns")

T = TypeVar("T")

TRIES = 6


def retry_deadlocks(fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` (a whole transaction), again after a short random wait if the database rolled it back.

    After :data:`TRIES` deadlocks in a row the last one propagates. Inside a
    caller's transaction nothing is retried: that transaction is lost as a whole.
    """
    for attempt in range(1, TRIES + 1):
        try:
            return fn()
        except OperationalError as exc:
            if not is_deadlock(exc) or db.connection().in_atomic_block or attempt == TRIES:
                raise
            logger.info("%s: deadlock, retrying (attempt %d of %d)", what, attempt, TRIES)
            # A backoff, not a synchronisation: the two transactions must not meet again at once.
            time.sleep(random.uniform(0, 0.005 * 2**attempt))
    raise AssertionError("unreachable")
