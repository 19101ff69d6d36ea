"""MariaDB and MySQL: the portable store, its whole transactions retried when InnoDB picks them as a deadlock victim."""

from __future__ import annotations

from . import errors
from .base import StepWrite, Store
from .statements import MySQLClockSQL


class MySQLStore(Store):
    """MariaDB/MySQL: no ``RETURNING`` on UPDATE, so a claim re-reads the run and a commit reads its pause.

    A fenced write is a transaction of the heartbeat (which takes the run's
    row lock, checks the fence and renews the lease) and the write; the
    portable store's deadlock retries cover InnoDB's victims.
    """

    clock_sql = MySQLClockSQL()
    locks_rows = True

    def prepare_session(self, bound: float) -> None:
        """Bound what a stalled peer's row lock can cost, once per connection of a drive.

        A fenced write here is a transaction of two statements, which holds the
        run's row lock between them. A worker stalled there (SIGSTOP, a
        partition) would hold it for as long as its connection lives -- hours
        -- and every other drive would wait on it. So a drive's sessions wait
        for a row lock at most ``bound`` seconds (``innodb_lock_wait_timeout``),
        and MariaDB ends a session idle inside a transaction after twice that
        (``idle_transaction_timeout``: one lease), freeing its locks.
        """
        wrapper = self.connection
        wrapper.ensure_connection()
        raw = wrapper.connection
        if getattr(raw, "_jobruns_bounded", None) == bound:
            return
        settings = "SET SESSION innodb_lock_wait_timeout = %s"
        params = [max(1, int(bound))]
        if "mariadb" in wrapper.mysql_server_data["version"].lower():
            settings += ", idle_transaction_timeout = %s"
            params.append(max(1, int(2 * bound)))
        with wrapper.cursor() as cur:
            cur.execute(settings, params)
        raw._jobruns_bounded = bound

    def refused_for_size(self, write: StepWrite, exc: BaseException) -> bool:
        # A statement over max_allowed_packet makes the server close the
        # connection: the client sees "server has gone away" (2006) or "lost
        # connection" (2013), as for a dropped connection. Told apart by the
        # record's size against the server's limit, read on a new connection.
        if super().refused_for_size(write, exc):
            return True
        if not errors.gone_away(exc):
            return False
        size = len((write.result or "").encode()) + len((write.error or "").encode()) + len(write.step.encode())
        with self.connection.cursor() as cur:
            cur.execute("SELECT @@max_allowed_packet")
            (limit,) = cur.fetchone()
        return size >= int(limit) - 1024
