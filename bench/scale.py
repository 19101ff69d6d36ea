#!/usr/bin/env python
"""The operator's pages and retention with many retained runs.

    python bench/scale.py --db {sqlite,postgres,mysql} --size N [--rounds R] [--plans]

Fills a fresh database with N runs (half done, a quarter failed with an error
text, a quarter running; started and ended over the last 30 days, in id order
as ULIDs are), ANALYZEs
it, then renders each operator page's first page as a logged-in superuser with
Django's test client, R rounds interleaved, and reports each page's median
time and query count; ``--plans`` prints the plan of each page's main query.
Last, it prunes the runs that ended more than 8 days ago and reports rows/s.
Goals (issue "Ten million retained runs"): pages ≤ 200 ms at 1 000 000 on
PostgreSQL, ≤ 500 ms on SQLite and MariaDB; prune ≥ 50 000 rows/s on PostgreSQL.
``--db mysql`` is MariaDB (or MySQL) at 127.0.0.1:3306 as root, with the
``mysql`` extra installed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, median, setup_django  # noqa: E402

FILL = {
    # id: zero-padded, so the order of ids is the order of starts, as ULIDs are.
    "postgresql": """
        INSERT INTO django_jobruns_jobrun (id, module, job, instance, live, payload, status, cursor, counters,
            attempts, last_error, started_at, updated_at, ended_at, lease_fence)
        SELECT lpad(i::text, 26, '0'), 'demo', 'import_catalog', 'supplier-' || i,
            CASE WHEN i % 4 = 3 THEN TRUE END, '{}',
            CASE i % 4 WHEN 0 THEN 'done' WHEN 1 THEN 'done' WHEN 2 THEN 'failed' ELSE 'running' END,
            '1', '{"imported": 1}', 0,
            CASE WHEN i % 4 = 2 THEN 'UpstreamUnavailable: supplier ' || i || ' reset after page ' || (i % 97) END,
            now() - (((%s - i)::bigint * 2592000) / %s) * interval '1 second', now(),
            CASE WHEN i % 4 <> 3 THEN now() - (((%s - i)::bigint * 2592000) / %s) * interval '1 second' END, 1
        FROM generate_series(1, %s) AS i
    """,
    "mysql": """
        INSERT INTO django_jobruns_jobrun (id, module, job, instance, live, payload, status, `cursor`, counters,
            attempts, last_error, started_at, updated_at, ended_at, lease_fence)
        SELECT lpad(seq, 26, '0'), 'demo', 'import_catalog', CONCAT('supplier-', seq),
            CASE WHEN seq % 4 = 3 THEN TRUE END, '{}',
            CASE seq % 4 WHEN 0 THEN 'done' WHEN 1 THEN 'done' WHEN 2 THEN 'failed' ELSE 'running' END,
            '1', '{"imported": 1}', 0,
            CASE WHEN seq % 4 = 2
                THEN CONCAT('UpstreamUnavailable: supplier ', seq, ' reset after page ', seq % 97) END,
            UTC_TIMESTAMP(6) - INTERVAL (((%s - seq) * 2592000) DIV %s) SECOND, UTC_TIMESTAMP(6),
            CASE WHEN seq % 4 <> 3 THEN UTC_TIMESTAMP(6) - INTERVAL (((%s - seq) * 2592000) DIV %s) SECOND END, 1
        FROM seq_1_to_%s
    """,
    "sqlite": """
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s)
        INSERT INTO django_jobruns_jobrun (id, module, job, instance, live, payload, status, cursor, counters,
            attempts, last_error, started_at, updated_at, ended_at, lease_fence)
        SELECT printf('%026d', i), 'demo', 'import_catalog', 'supplier-' || i,
            CASE WHEN i % 4 = 3 THEN 1 END, '{}',
            CASE i % 4 WHEN 0 THEN 'done' WHEN 1 THEN 'done' WHEN 2 THEN 'failed' ELSE 'running' END,
            '1', '{"imported": 1}', 0,
            CASE WHEN i % 4 = 2 THEN 'UpstreamUnavailable: supplier ' || i || ' reset after page ' || (i % 97) END,
            datetime('now', '-' || (((%s - i) * 2592000) / %s) || ' seconds'), datetime('now'),
            CASE WHEN i % 4 <> 3 THEN datetime('now', '-' || (((%s - i) * 2592000) / %s) || ' seconds') END, 1
        FROM n
    """,
}


KEPT = {
    "postgres": "postgresql://postgres@127.0.0.1:5432/bench_scale",
    "mysql": "mysql://root@127.0.0.1:3306/bench_scale",
}


def pages(size: int) -> dict[str, tuple[str, dict[str, str]]]:
    rare = size // 2 + 2 - (size // 2 + 2) % 4 + 2  # a failed run's number, about half-way
    changelist = "/admin/django_jobruns/jobrun/"
    return {
        "changelist, unfiltered": (changelist, {}),
        "status = failed": (changelist, {"status__exact": "failed"}),
        "status = running": (changelist, {"status__exact": "running"}),
        "job filter": (changelist, {"job": "demo.import_catalog"}),
        "search: rare instance": (changelist, {"q": f"supplier-{rare}"}),
        "search: rare error text": (changelist, {"q": f"supplier {rare} reset"}),
        "search: exact id": (changelist, {"q": str(rare).zfill(26)}),
        # Words no run holds beside a word every failed run holds, a two-letter word and a number.
        "search: common and absent words": (changelist, {"q": "connection reset by peer 123"}),
        "search: a word every failed run holds": (changelist, {"q": "reset"}),
        "started-at range (one day)": (
            changelist,
            {"started_at__range__gte": _day(3), "started_at__range__lte": _day(2)},
        ),
        "ended-at range (one day)": (changelist, {"ended_at__range__gte": _day(3), "ended_at__range__lte": _day(2)}),
        "deep page (p=200)": (changelist, {"p": "200"}),
        "change view": (f"{changelist}{str(rare).zfill(26)}/change/", {}),
    }


def rounds(targets: dict[str, Callable[[], Any]], count: int) -> dict[str, list[float]]:
    """Each target rendered ``count`` times, interleaved: its times in ms."""
    times: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(count):
        for name, fn in targets.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    return times


def _day(days_ago: int) -> str:
    from datetime import date, timedelta

    return (date.today() - timedelta(days=days_ago)).isoformat()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plans", action="store_true")
    parser.add_argument(
        "--keep", action="store_true", help="keep the filled database (bench_scale) and skip the prune, for --reuse"
    )
    parser.add_argument("--reuse", action="store_true", help="measure a database an earlier --keep left (not SQLite)")
    args = parser.parse_args()
    if args.reuse and args.db == "sqlite":
        parser.error("--reuse needs PostgreSQL or MariaDB: the SQLite file lives in a temporary folder")

    setup_django(KEPT[args.db] if args.reuse else fresh_database(args.db, "bench_scale"))
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from django_jobruns import job_runs
    from django_jobruns.models import JobRun

    if args.reuse:
        found = JobRun.objects.count()
        if found != args.size:
            raise SystemExit(f"bench_scale holds {found} runs, not {args.size}: fill it again without --reuse")
    else:
        started = time.monotonic()
        with connection.cursor() as cur:
            cur.execute(FILL[connection.vendor].replace("%s", str(int(args.size))))
            cur.execute("ANALYZE TABLE django_jobruns_jobrun" if connection.vendor == "mysql" else "ANALYZE")
        print(f"filled {args.size} runs in {time.monotonic() - started:.1f} s ({connection.vendor})")
    if not User.objects.filter(username="bench").exists():
        User.objects.create_superuser("bench", password="x")
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    rare = args.size // 2 + 2 - (args.size // 2 + 2) % 4 + 2
    targets = {
        name: (lambda url=url, params=params: client.get(url, params))
        for name, (url, params) in pages(args.size).items()
    }
    targets["job_runs(instance=…)"] = lambda: job_runs(instance=f"supplier-{rare}")
    targets["job_runs(status='failed')"] = lambda: job_runs(status="failed")
    targets["job_runs(job='demo.import_catalog')"] = lambda: job_runs(job="demo.import_catalog")
    queries: dict[str, int] = {}
    plans: dict[str, str] = {}
    for name, fn in targets.items():  # warm-up, counted and explained once
        with CaptureQueriesContext(connection) as ctx:
            response = fn()
        if hasattr(response, "status_code") and response.status_code != 200:
            raise SystemExit(f"{name}: HTTP {response.status_code}")
        queries[name] = len(ctx.captured_queries)
        if args.plans:
            main_query = max(
                (q for q in ctx.captured_queries if not q["sql"].startswith("EXPLAIN")), key=lambda q: float(q["time"])
            )["sql"]
            with connection.cursor() as cur:
                cur.execute(
                    {"postgresql": "EXPLAIN (ANALYZE, BUFFERS) ", "mysql": "EXPLAIN "}.get(
                        connection.vendor, "EXPLAIN QUERY PLAN "
                    )
                    + main_query
                )
                plans[name] = "\n".join(" ".join(str(c) for c in row) for row in cur.fetchall())
    times = rounds(targets, args.rounds)
    print(f"\n| page ({args.size:,} runs, {connection.vendor}) | median ms | queries |")
    print("|---|---|---|")
    for name in targets:
        print(f"| {name} | {median(times[name]):.0f} | {queries[name]} |")
    if args.plans:
        for name, text in plans.items():
            print(f"\n### {name}\n```\n{text}\n```")

    if args.keep:
        return 0  # no prune: the database is kept as filled, for --reuse

    from datetime import timedelta

    from django_jobruns.pruning import prune_job_runs

    t0 = time.perf_counter()
    deleted = prune_job_runs(older_than=timedelta(days=8))
    seconds = time.perf_counter() - t0
    print(f"\nprune --older-than 8: deleted={deleted} seconds={seconds:.1f} rows_per_s={deleted / seconds:.0f}")
    # The pages again, on what the prune left (its dead rows not yet vacuumed away): the first
    # view of each, as an operator opens it just after, then the median of the rounds.
    first, after = rounds(targets, 1), rounds(targets, args.rounds)
    print(f"\n| page, after the prune ({JobRun.objects.count():,} runs left) | first view ms | median ms |")
    print("|---|---|---|")
    for name in targets:
        print(f"| {name} | {first[name][0]:.0f} | {median(after[name]):.0f} |")
    connection.close()
    drop_database(args.db, "bench_scale")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
