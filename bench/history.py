#!/usr/bin/env python
"""Does a drive pass cost more when the table retains years of finished runs?

    python bench/history.py --db {sqlite,postgres} [--rounds R] [--history N]

Two databases side by side: one retaining no finished runs, one retaining N
(default 100 000). Each round, in each, 10 runs are started and one
``run_due_jobs`` pass drives them (one pass of five steps each), timed; the
rounds alternate between the two databases. Medians are compared. The query
plan of the due read is printed for the large one. The last line:
``ratio_100k_to_0=…`` (goal: at most 1.2).
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

DUE = 10


def phase_fill(db: str, name: str, history: int) -> dict[str, object]:
    """Create the database and retain ``history`` finished runs in it."""
    setup_django(fresh_database(db, name))
    from django.db import connection
    from django.utils import timezone

    from django_jobruns.models import JobRun, Status

    now = timezone.now()
    batch = []
    for i in range(history):
        batch.append(
            JobRun(
                module="perf",
                job="five_steps",
                instance=f"old-{i}",
                status=Status.DONE,
                live=None,
                cursor="1",
                counters='{"steps": 5}',
                started_at=now,
                updated_at=now,
                ended_at=now,
            )
        )
        if len(batch) == 5000:
            JobRun.objects.bulk_create(batch)
            batch = []
    JobRun.objects.bulk_create(batch)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    return {"retained": JobRun.objects.count()}


def phase_drive(url: str, repeats: int) -> dict[str, object]:
    """Start 10 runs and time one drive pass over them, ``repeats`` times; report the median."""
    setup_django(url)
    from django.db import connection
    from django.utils import timezone

    from django_jobruns import run_due_jobs, start_job_run
    from django_jobruns.models import JobRun

    times = []
    for repeat in range(repeats):
        for i in range(DUE):
            start_job_run("perf.five_steps", instance=f"due-{repeat}-{i}")
        began = time.perf_counter()
        report = run_due_jobs(limit=DUE)
        times.append(time.perf_counter() - began)
        assert report.completed == DUE, report
        JobRun.objects.filter(instance__startswith="due-").delete()
    qs = JobRun.objects.due(timezone.now()).order_by("id")
    sql, params = qs.values_list("id", "lease_fence", "module", "job")[:50].query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(("EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN ") + sql, params)
        plan = " | ".join(" ".join(str(c) for c in row) for row in cur.fetchall())
    return {"seconds": median(times), "plan": plan}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--phase", choices=["fill", "drive"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "fill":
        print(json.dumps(phase_fill(args.db, args.name, args.count)))
        return 0
    if args.phase == "drive":
        print(json.dumps(phase_drive(args.name, 5)))
        return 0

    targets = fill_databases("history.py", args.db, "history", [0, args.history])
    results = interleave(
        args.rounds,
        targets,
        lambda retained, url: run_phase("history.py", "--phase", "drive", "--db", args.db, "--name", url),
    )
    samples = {retained: [float(r["seconds"]) for r in rs] for retained, rs in results.items()}
    plan = str(results[args.history][-1]["plan"])
    small, big = median(samples[0]), median(samples[args.history])
    drop_databases(args.db, "history", [0, args.history])
    print(f"due read plan with {args.history} retained: {plan}")
    print(
        f"db={args.db} rounds={args.rounds} drive_of_{DUE}_runs_ms: retained_0={small * 1000:.1f} "
        f"retained_{args.history}={big * 1000:.1f} (medians)"
    )
    print(f"ratio_100k_to_0={big / small:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
