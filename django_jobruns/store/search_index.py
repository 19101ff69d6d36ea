"""The admin's search index on each database: which table holds it, and opening it on each new connection.

The indexes (migrations 0004, 0007, 0008, 0010) are kept by triggers on every
write of a run, so they are the engine's concern as much as the admin's,
whose search (:mod:`django_jobruns.admin.search`) reads them.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections

from .. import db

#: The SQLite FTS5 table.
TABLE = "jobruns_search"
#: The MariaDB/MySQL table of sequences.
GRAMS = "jobruns_search_gram"

_available: dict[str, bool] = {}


def connect_index(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Open the SQLite search index on a new connection, before any transaction does.

    SQLite connects a virtual table to a connection the first time a statement
    names it, reading the table's configuration. Inside a DEFERRED transaction
    -- what a fresh project has -- that read takes a shared lock before the
    statement's write; a write that must then wait for another writer cannot
    (SQLite refuses at once: "database is locked"). Every write of a run names
    the index through its triggers, so the connection opens it here, outside
    any transaction: one statement per new connection.
    """
    if connection.vendor != "sqlite" or connection.alias != db.alias():
        return
    with connection.cursor() as cur:
        try:
            cur.execute(f"SELECT rowid FROM {connection.ops.quote_name(TABLE)} WHERE rowid = 0")
        except DatabaseError:
            pass  # not migrated yet, or built without FTS5: nothing to open


def has_index(alias: str) -> bool:
    """Whether the search index exists on ``alias`` (looked up once per process)."""
    found = _available.get(alias)
    if found is None:
        with connections[alias].cursor() as cur:
            if connections[alias].vendor == "sqlite":
                cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s", [TABLE])
            else:
                cur.execute(
                    "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s",
                    [GRAMS],
                )
            found = _available[alias] = cur.fetchone() is not None
    return found
