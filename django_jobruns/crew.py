"""A drive's threads (``--concurrency N``): kept from round to round, each with its own connection.

Django gives each thread a connection of its own. Threads made for each round opened
N connections each round (a database server process started and ended every ``limit``
runs: about 3.6 ms of processor time each on PostgreSQL, more than a no-op task's pass).
The crew's threads live as long as the drive, keep their connections between rounds,
and the crew closes those connections when the drive ends.

A connection the server dropped while its thread waited for the next round is replaced
as any other: the first statement on it fails, bounded (D15), and the claim's error
path replaces it (``db.replace_if_broken``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from django.db import DatabaseError

from . import db


class Crew:
    """Up to ``size`` threads that run a round's work at once, for every round of one drive."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool: ThreadPoolExecutor | None = None
        self._connections: list[Any] = []  # each thread's connection (Django's DatabaseWrapper)
        self._lock = threading.Lock()

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self, work: Callable[[], None], threads: int, meanwhile: Callable[[], None] | None = None, every: float = 0
    ) -> None:
        """Run ``work`` on ``threads`` of the crew's threads at once; return once every one has ended.

        While they work, the calling thread runs ``meanwhile`` every ``every`` seconds. The first
        error any of them raised is raised here, after all have ended (none is left running into
        the next round); so is an error of ``meanwhile``, after all have ended.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="jobruns")
        futures = [self._pool.submit(self._in_thread, work) for _ in range(min(threads, self.size))]
        try:
            while wait(futures, timeout=every if meanwhile is not None else None).not_done:
                if meanwhile is not None:
                    meanwhile()
        finally:
            wait(futures)
        for future in futures:
            future.result()

    def _in_thread(self, work: Callable[[], None]) -> None:
        wrapper = db.connection()
        with self._lock:
            if not any(kept is wrapper for kept in self._connections):
                self._connections.append(wrapper)
        work()

    def close(self) -> None:
        """End the threads, then close the connections they kept (from this thread: theirs have ended)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for wrapper in self._connections:
            wrapper.inc_thread_sharing()
            try:
                wrapper.close()
            except DatabaseError:
                pass  # a connection the server dropped: nothing left to close
            finally:
                wrapper.dec_thread_sharing()
        self._connections.clear()
