"""SQLite: ``RETURNING`` on the claim (3.35+); under IMMEDIATE, fewer page writes per step."""

from __future__ import annotations

import sqlite3
from typing import Any

from .base import StepWrite, Store


class SQLiteStore(Store):
    """SQLite: one host's file, one writer at a time."""

    returning = sqlite3.sqlite_version_info >= (3, 35)

    def _renews(self, wrapper: Any, write: StepWrite) -> bool:
        # Under IMMEDIATE the transaction holds the database's write lock from
        # BEGIN, so a read of the fence is as good as a locking write, and
        # spares a page write per step while more than half the lease is left.
        # Under the DEFERRED mode a fresh project has, a transaction that reads
        # first and writes later cannot wait for the lock when another
        # connection wrote meanwhile ("database is locked" at once, whatever the
        # timeout), so there the transaction writes first.
        immediate = getattr(wrapper, "transaction_mode", None) in ("IMMEDIATE", "EXCLUSIVE")
        return not (immediate and write.lease_left > write.ttl / 2)
