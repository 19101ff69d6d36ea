"""MariaDB and MySQL: the portable store, its whole transactions retried when InnoDB picks them as a deadlock victim."""

from __future__ import annotations

from .base import Store
from .statements import MySQLClockSQL


class MySQLStore(Store):
    """MariaDB/MySQL: no ``RETURNING`` on UPDATE, so a claim re-reads the run and a commit reads its pause.

    A fenced write is a transaction of the heartbeat (which takes the run's
    row lock, checks the fence and renews the lease) and the write; the
    portable store's deadlock retries cover InnoDB's victims.
    """

    clock_sql = MySQLClockSQL()
