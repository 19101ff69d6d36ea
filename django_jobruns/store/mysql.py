"""MariaDB and MySQL: the portable store, its whole transactions retried when InnoDB picks them as a deadlock victim."""

from __future__ import annotations

from typing import Any

from .base import StepWrite, Store
from .statements import MySQLClockSQL


class MySQLStore(Store):
    """MariaDB/MySQL: no ``RETURNING`` on UPDATE, so a claim re-reads the run and a commit reads its pause.

    A fenced write is a transaction of the heartbeat (which takes the run's
    row lock, checks the fence and renews the lease) and the write; the
    portable store's deadlock retries cover InnoDB's victims.
    """

    clock_sql = MySQLClockSQL()

    def refused_for_size(self, write: StepWrite, exc: BaseException) -> bool:
        # A statement over max_allowed_packet makes the server close the
        # connection: the client sees "server has gone away" (2006) or "lost
        # connection" (2013), as for a dropped connection. Told apart by the
        # record's size against the server's limit, read on a new connection.
        if super().refused_for_size(write, exc):
            return True
        if _code(exc) not in (2006, 2013):
            return False
        size = len((write.result or "").encode()) + len((write.error or "").encode()) + len(write.step.encode())
        with self.connection.cursor() as cur:
            cur.execute("SELECT @@max_allowed_packet")
            (limit,) = cur.fetchone()
        return size >= int(limit) - 1024


def _code(exc: BaseException) -> Any:
    args = getattr(exc.__cause__ or exc, "args", ())
    return args[0] if args else None
