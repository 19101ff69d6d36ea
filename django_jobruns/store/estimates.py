"""Row estimates for the admin's page numbers: what each database can say without counting.

An exact COUNT(*) reads every row it counts, on every page view. The planner's
estimate costs next to nothing and is close enough to number pages:

- PostgreSQL: the table's ``reltuples`` (kept by ANALYZE and autovacuum) for
  the whole table; the plan's row estimate, from the columns' statistics, for a
  filtered list;
- MariaDB/MySQL: InnoDB's ``TABLE_ROWS`` for the whole table; the rows
  ``EXPLAIN`` expects the query to read (its index dives) for a filtered list.

Other databases (SQLite) have none: the functions return ``None`` and the list
is counted.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connections
from django.db.models import QuerySet

#: The databases that estimate.
ESTIMATING = ("postgresql", "mysql")


def whole_table(queryset: QuerySet[Any], above: int) -> int | None:
    """The table's estimated rows when above ``above``, else its exact count, in one query; ``None`` if unknown.

    The exact count runs only when the estimate is small (the branch not taken
    is not evaluated).
    """
    wrapper = connections[queryset.db]
    table = wrapper.ops.quote_name(queryset.model._meta.db_table)
    if wrapper.vendor == "postgresql":
        sql = (
            f"SELECT CASE WHEN reltuples > %s THEN reltuples::bigint "
            f"ELSE (SELECT COUNT(*) FROM {table}) END FROM pg_class WHERE oid = %s::regclass"
        )
        params: list[Any] = [above, table]
    elif wrapper.vendor == "mysql":
        sql = (
            f"SELECT CASE WHEN estimate.n > %s THEN estimate.n ELSE (SELECT COUNT(*) FROM {table}) END "
            "FROM (SELECT TABLE_ROWS AS n FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s) AS estimate"
        )
        params = [above, queryset.model._meta.db_table]
    else:
        return None
    with wrapper.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def planned_rows(queryset: QuerySet[Any]) -> int | None:
    """The rows the planner expects ``queryset`` to return (PostgreSQL) or read (MariaDB/MySQL); ``None`` if unknown."""
    vendor = connections[queryset.db].vendor
    if vendor == "postgresql":
        return _plan_rows(queryset.explain(format="json"))
    if vendor != "mysql":
        return None
    sql, params = queryset.values("pk").query.sql_with_params()
    with connections[queryset.db].cursor() as cur:
        cur.execute(f"EXPLAIN {sql}", params)
        names = [column[0].lower() for column in cur.description]
        row = cur.fetchone()
    return int(row[names.index("rows")] or 0) if row is not None else 0


def planned_rows_each(queryset: QuerySet[Any], params_each: list[list[Any]]) -> list[int] | None:
    """The planner's estimate of ``queryset`` run with each list of ``params_each`` (PostgreSQL), else ``None``.

    The query is compiled once; its parameters must be the first list, in its
    order (else ``None``: the caller estimates one by one). Where the driver
    binds parameters on the client (Django's default), every ``EXPLAIN`` goes
    in one round trip: the admin's chart asks 48 of them on each view.
    """
    if connections[queryset.db].vendor != "postgresql" or not params_each:
        return None
    sql, params = queryset.query.sql_with_params()
    if list(params) != list(params_each[0]) or any(len(each) != len(params) for each in params_each):
        return None
    explain = f"EXPLAIN (FORMAT JSON) {sql}"
    with connections[queryset.db].cursor() as cur:
        if _binds_on_the_client(cur):
            cur.execute("; ".join([explain] * len(params_each)), [p for each in params_each for p in each])
            plans = [cur.fetchone()]
            while cur.nextset():
                plans.append(cur.fetchone())
        else:
            plans = []
            for each in params_each:
                cur.execute(explain, each)
                plans.append(cur.fetchone())
    return [_plan_rows(plan[0]) for plan in plans]


def _binds_on_the_client(cursor: Any) -> bool:
    """Whether the driver's cursor puts the parameters into the text (psycopg's ``ClientCursor``).

    psycopg2, which Django also runs on, is not asked: it reads only the last of several statements.
    """
    try:
        from psycopg import ClientCursor
    except ImportError:
        return False
    while hasattr(cursor, "cursor"):  # Django's wrappers
        cursor = cursor.cursor
    return isinstance(cursor, ClientCursor)


def _plan_rows(document: Any) -> int:
    """The rows at the top of a plan in JSON (as text, or as psycopg decoded it)."""
    plan = json.loads(document) if isinstance(document, str) else document
    return int(plan[0]["Plan"]["Plan Rows"])
