"""The admin's text search over instances and errors, kept fast at millions of runs.

Django's admin searches with ``LIKE '%term%'``, which no ordinary index can
serve: at a million retained runs every search scans the table. Each database
gets an index that finds the candidates; the admin's own ``LIKE`` conditions
still decide, so what a search finds is exactly what Django's search finds.

- PostgreSQL: trigram indexes on ``UPPER(instance)`` (GiST: instances are short
  keys sharing a prefix, migration 0008; with signatures of 256 bytes, 0021, so
  a word no instance holds is found absent near the root) and
  ``UPPER(last_error)`` (GIN: long texts, migration 0004), which the planner uses
  for the ``LIKE`` itself. Their statistics have 1 000 entries (0021): the plan
  ANDs the words' index scans and stops at the first that finds nothing, so a
  word that half a percent of the runs hold must not pass for a rare one.
- SQLite: an FTS5 table with the trigram tokenizer (migration 0007), an
  external-content index of the runs' ``instance`` and ``last_error`` kept by
  triggers. A search narrows the runs to the rows whose text holds every word
  of the term (words of three characters or more: a trigram index has nothing
  to say about shorter ones), then the ``LIKE`` conditions apply.
- MariaDB/MySQL: no substring index exists there, so migration 0010 keeps a
  table of each run's three-character sequences (``jobruns_search_gram``, one
  row per distinct sequence and run) by triggers. A search counts how many runs
  hold each of a few sequences of each word (each count bounded), then narrows
  the runs to those holding the rarest ones, by a join that starts from the
  rarest; then the ``LIKE`` conditions apply.

On both, words so common that more than :data:`MAX_CANDIDATES` runs are
candidates are searched among the newest that many candidates (the index read
newest first, stopping there), and the page says so: reading and sorting every
run that holds a word most runs hold cost seconds on each view.

The indexes themselves, and the hook that opens SQLite's on each new
connection, are the store's (:mod:`django_jobruns.store.search_index`): the
engine's writes keep them, through their triggers.

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

from ..models import JobRun
from ..store.search_index import GRAMS, TABLE, has_index

#: At most this many sequences are looked up for one search (a join each).
MAX_GRAMS = 8
#: Words whose candidates are more than this many are searched among the newest this many
#: (SQLite, MariaDB/MySQL): every candidate was read and sorted on each view of the page.
MAX_CANDIDATES = 10_000
#: The words a trigram index can find: three characters or more.
MIN_WORD = 3


def words(term: str) -> list[str]:
    """The words of a search term as Django's admin splits them (quoted phrases kept whole)."""
    found = []
    for bit in smart_split(term):
        if bit.startswith(('"', "'")) and bit[0] == bit[-1]:
            bit = unescape_string_literal(bit)
        if bit:
            found.append(bit)
    return found


def narrow(queryset: QuerySet[JobRun], term: str) -> tuple[QuerySet[JobRun], int | None]:
    """Narrow ``queryset`` to the runs the search index says may match ``term`` (PostgreSQL: unchanged).

    Words so common that more than :data:`MAX_CANDIDATES` runs are candidates
    (SQLite, MariaDB/MySQL) are searched among the newest that many of them:
    every candidate was read and sorted for each view of the page (0.9 s on
    SQLite, 3.6 s on MariaDB for a word every failed run holds, at a million
    runs). Returned beside the queryset: that bound when it applied, for the
    page to say so, else ``None``.
    """
    alias = queryset.db
    if connections[alias].vendor not in ("sqlite", "mysql"):
        return queryset, None
    indexable = [word for word in words(term) if len(word) >= MIN_WORD]
    if not indexable:
        return queryset, None
    try:
        if not has_index(alias):
            return queryset, None
    except DatabaseError:
        return queryset, None
    if connections[alias].vendor == "mysql":
        return _narrow_by_grams(queryset, indexable)
    # Each word a phrase of its trigrams, all of them required, in either column.
    match = " AND ".join('"' + word.replace('"', '""') + '"' for word in indexable)
    quote = connections[alias].ops.quote_name
    table, index = quote(JobRun._meta.db_table), quote(TABLE)
    # The newest by rowid, which follows the runs' inserts as their ids do; FTS5 reads its
    # index in descending rowid order and stops there.
    candidates, bound = _newest_if_many(alias, f"SELECT rowid FROM {index} WHERE {index} MATCH %s", [match], "rowid")
    narrowed = queryset.extra(  # noqa: S610 -- the only way to name SQLite's rowid; the term is a parameter
        where=[f"{table}.rowid IN ({candidates})"],
        params=[match],
    )
    return narrowed, bound


def _newest_if_many(alias: str, candidates: str, params: list[Any], order: str) -> tuple[str, int | None]:
    """``candidates`` (one column), or, when they are more than :data:`MAX_CANDIDATES`, the newest that
    many by ``order``; and the bound when it applied.

    Whether they are more is one read of at most :data:`MAX_CANDIDATES` + 1 of them.
    """
    with connections[alias].cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM ({candidates} LIMIT {MAX_CANDIDATES + 1}) candidates", params)
        (found,) = cur.fetchone()
    if found <= MAX_CANDIDATES:
        return candidates, None
    column = order.rpartition(".")[2]
    return f"SELECT {column} FROM ({candidates} ORDER BY {order} DESC LIMIT {MAX_CANDIDATES}) newest", MAX_CANDIDATES


def _spread(word: str) -> list[str]:
    """The distinct sequences of ``word``: its last, first and middle ones first, then the rest."""
    grams = list(dict.fromkeys(word[i : i + 3] for i in range(len(word) - 2)))
    return list(dict.fromkeys([grams[-1], grams[0], grams[len(grams) // 2], *grams]))


def chosen_grams(words: list[str], most: int = MAX_GRAMS) -> list[str]:
    """Sequences of the words, taken from each word in turn, at most ``most``.

    Any of a word's sequences is present in every run that holds the word, so a
    few of them narrow as safely as all; spread over the word and over the
    words, they likely include a rare one.
    """
    queues = [_spread(word) for word in words]
    chosen: list[str] = []
    while any(queues) and len(chosen) < most:
        for queue in queues:
            if queue and len(chosen) < most:
                gram = queue.pop(0)
                if gram not in chosen:
                    chosen.append(gram)
    return chosen


def rarest_grams(alias: str, words: list[str]) -> tuple[list[str], int]:
    """The :data:`MAX_GRAMS` rarest of the words' sequences (up to twice that many looked at), rarest first,
    and how many runs hold the rarest (counted no further than :data:`MAX_CANDIDATES` + 1).

    One statement: a bounded count of each sequence's index range. A long
    instance shares its prefix's sequences with every run; its distinctive
    ones are further in.
    """
    grams = chosen_grams(words, 2 * MAX_GRAMS)
    bounded = f"SELECT 1 FROM {GRAMS} WHERE gram = %s LIMIT {MAX_CANDIDATES + 1}"
    counts = ", ".join(f"(SELECT COUNT(*) FROM ({bounded}) c{n})" for n in range(len(grams)))
    with connections[alias].cursor() as cur:
        cur.execute(f"SELECT {counts}", grams)
        found = cur.fetchone()
    ranked = sorted(zip(found, range(len(grams)), grams, strict=True))
    return [gram for _, _, gram in ranked[:MAX_GRAMS]], int(ranked[0][0])


def _narrow_by_grams(queryset: QuerySet[JobRun], indexable: list[str]) -> tuple[QuerySet[JobRun], int | None]:
    """The runs holding each of the rarest sequences: all of them, or the newest :data:`MAX_CANDIDATES` when more do.

    The join starts from the rarest sequence. When even that one is held by
    more runs than the bound, a bounded read of the join says whether the
    candidates are many; if so the join is read along the rarest sequence's
    index in run order, newest first, and stops at the bound.
    """
    alias = queryset.db
    grams, rarest = rarest_grams(alias, indexable)
    quote = connections[alias].ops.quote_name
    table, pk = quote(JobRun._meta.db_table), quote(str(JobRun._meta.pk.column))
    joins = " ".join(f"JOIN {GRAMS} g{n} ON g{n}.gram = %s AND g{n}.run_id = g0.run_id" for n in range(1, len(grams)))
    join = f"SELECT g0.run_id FROM {GRAMS} g0 {joins} WHERE g0.gram = %s"
    params = [*grams[1:], grams[0]]
    # Few runs hold the rarest sequence: so few are candidates, and no count is needed to know it.
    join, bound = _newest_if_many(alias, join, params, "g0.run_id") if rarest > MAX_CANDIDATES else (join, None)
    narrowed = queryset.extra(  # noqa: S610 -- a join over the sequences table, which has no model; terms are parameters
        where=[f"{table}.{pk} IN ({join})"],
        params=params,
    )
    return narrowed, bound
