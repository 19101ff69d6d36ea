"""The admin's text search over instances and errors, kept fast at millions of runs.

Django's admin searches with ``LIKE '%term%'``, which no ordinary index can
serve: at a million retained runs every search scans the table. Each database
gets an index that finds the candidates; the admin's own ``LIKE`` conditions
still decide, so what a search finds is exactly what Django's search finds.

- PostgreSQL: trigram indexes on ``UPPER(instance)`` (GiST: instances are short
  keys sharing a prefix, migration 0008) and ``UPPER(last_error)`` (GIN: long
  texts, migration 0004), which the planner uses for the ``LIKE`` itself.
- SQLite: an FTS5 table with the trigram tokenizer (migration 0007), an
  external-content index of the runs' ``instance`` and ``last_error`` kept by
  triggers. A search narrows the runs to the rows whose text holds every word
  of the term (words of three characters or more: a trigram index has nothing
  to say about shorter ones), then the ``LIKE`` conditions apply.
- MariaDB/MySQL: no substring index; the ``LIKE`` scans.

The SQLite index follows the runs' rowids, which ``VACUUM`` keeps in practice;
should they ever change (a table copied by hand, say), the statement
``INSERT INTO jobruns_search(jobruns_search) VALUES('rebuild')`` rebuilds it. A
search never shows a run whose text does not match, whatever the index holds.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet
from django.utils.text import smart_split, unescape_string_literal

from . import db
from .models import JobRun

#: The SQLite FTS5 table.
TABLE = "jobruns_search"
#: The words a trigram index can find: three characters or more.
MIN_WORD = 3

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


def _has_index(alias: str) -> bool:
    """Whether the SQLite search index exists on ``alias`` (looked up once per process)."""
    found = _available.get(alias)
    if found is None:
        with connections[alias].cursor() as cur:
            cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s", [TABLE])
            found = _available[alias] = cur.fetchone() is not None
    return found


def words(term: str) -> list[str]:
    """The words of a search term as Django's admin splits them (quoted phrases kept whole)."""
    found = []
    for bit in smart_split(term):
        if bit.startswith(('"', "'")) and bit[0] == bit[-1]:
            bit = unescape_string_literal(bit)
        if bit:
            found.append(bit)
    return found


def narrow(queryset: QuerySet[JobRun], term: str) -> QuerySet[JobRun]:
    """Narrow ``queryset`` to the runs the search index says may match ``term`` (SQLite; others unchanged)."""
    alias = queryset.db
    if connections[alias].vendor != "sqlite":
        return queryset
    indexable = [word for word in words(term) if len(word) >= MIN_WORD]
    if not indexable:
        return queryset
    try:
        if not _has_index(alias):
            return queryset
    except DatabaseError:
        return queryset
    # Each word a phrase of its trigrams, all of them required, in either column.
    match = " AND ".join('"' + word.replace('"', '""') + '"' for word in indexable)
    quote = connections[alias].ops.quote_name
    table = quote(JobRun._meta.db_table)
    return queryset.extra(  # noqa: S610 -- the only way to name SQLite's rowid; the term is a parameter
        where=[f"{table}.rowid IN (SELECT rowid FROM {quote(TABLE)} WHERE {quote(TABLE)} MATCH %s)"],
        params=[match],
    )
