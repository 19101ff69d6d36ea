#!/usr/bin/env python
"""The admin changelist with 1 000 and with 100 000 runs: queries per page and render time.

    python bench/admin.py --db {sqlite,postgres} [--rounds R] [--large N]

Two databases side by side, one holding 1 000 runs and one N (default 100 000),
a mix of running, done and failed with progress counters. Each round, in each,
the changelist's first page (50 rows) is rendered 10 times by Django's test
client as a logged-in superuser, timed, and its SQL queries counted; the rounds
alternate between the two. The last line: ``queries_1k=… queries_100k=…
render_ratio_100k_to_1k=…`` (goals: equal, at most 1.5).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    drop_databases,
    fill_databases,
    fresh_database,
    interleave,
    median,
    run_phase,
    setup_django,
)

SMALL = 1_000


def phase_fill(db: str, name: str, count: int) -> dict[str, int]:
    setup_django(fresh_database(db, name))
    from django.contrib.auth.models import User
    from django.db import connection
    from django.utils import timezone

    from django_jobruns.models import JobRun, Status

    User.objects.create_superuser("bench", password="bench")
    now = timezone.now()
    batch = []
    for i in range(count):
        status = (Status.DONE, Status.DONE, Status.FAILED, Status.RUNNING)[i % 4]
        batch.append(
            JobRun(
                module="demo",
                job="import_catalog",
                instance=f"supplier-{i}",
                status=status,
                live=True if status == Status.RUNNING else None,
                payload=json.dumps({"supplier": i}),
                cursor=str(i % 10_000),
                counters=json.dumps({"imported": i % 10_000, "total": 10_000}),
                last_error="step 'fetch:7500' failed: connection reset" if status == Status.FAILED else None,
                started_at=now,
                updated_at=now,
                ended_at=None if status == Status.RUNNING else now,
            )
        )
        if len(batch) == 5000:
            JobRun.objects.bulk_create(batch)
            batch = []
    JobRun.objects.bulk_create(batch)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    return {"runs": JobRun.objects.count()}


def phase_render(url: str, repeats: int) -> dict[str, float]:
    setup_django(url)
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    setup_test_environment()
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    path = "/admin/django_jobruns/jobrun/"
    assert client.get(path).status_code == 200  # warm-up: templates, first connection
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(path)
        times.append(time.perf_counter() - began)
        assert response.status_code == 200
    return {"seconds": median(times), "queries": len(ctx.captured_queries)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--phase", choices=["fill", "render"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "fill":
        print(json.dumps(phase_fill(args.db, args.name, args.count)))
        return 0
    if args.phase == "render":
        print(json.dumps(phase_render(args.name, 10)))
        return 0

    urls = fill_databases("admin.py", args.db, "admin", [SMALL, args.large])
    results = interleave(
        args.rounds, urls, lambda count, url: run_phase("admin.py", "--phase", "render", "--db", args.db, "--name", url)
    )
    samples = {count: [r["seconds"] for r in rs] for count, rs in results.items()}
    queries = {count: int(rs[-1]["queries"]) for count, rs in results.items()}
    drop_databases(args.db, "admin", [SMALL, args.large])
    small, large = median(samples[SMALL]), median(samples[args.large])
    print(
        f"db={args.db} rounds={args.rounds} changelist_ms: {SMALL}={small * 1000:.1f} "
        f"{args.large}={large * 1000:.1f} (medians of 10 renders a round)"
    )
    print(f"queries_1k={queries[SMALL]} queries_100k={queries[args.large]} render_ratio_100k_to_1k={large / small:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
