#!/usr/bin/env python
"""Does a drive pass cost more when the table retains years of finished runs?

    python bench/history.py --db {sqlite,postgres} [--rounds R] [--history N]

Two databases side by side: one retaining no finished runs, one retaining N
(default 100 000). Each round, in each, 100 runs are started, timed, and
deleted; then 10 runs are started and one ``run_due_jobs`` pass drives them
(one pass of five steps each), timed; the rounds alternate between the two
databases. Medians are compared, of the
starts and of the drive. The query plan of the due read is printed for the
large one. The history is written by one INSERT ... SELECT, so ten million runs
take minutes, not hours. The last line: ``ratio_retained_to_0=…
starts_ratio_retained_to_0=…`` (goal: at most 1.2).
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
    filled_postgres_databases,
    fresh_database,
    interleave,
    median,
    run_phase,
    setup_django,
)

DUE = 10
STARTS = 100


FILL = {
    # Finished runs, ended over the last 30 days (as a busy deployment retains them).
    "postgresql": """
        INSERT INTO django_jobruns_jobrun (id, module, job, instance, live, payload, status, cursor, counters,
            attempts, started_at, updated_at, ended_at, lease_fence)
        SELECT lpad(i::text, 26, '0'), 'perf', 'five_steps', 'old-' || i, NULL, 'null', 'done', '1',
            '{"steps": 5}', 0, now() - ((%(n)s - i) * interval '2592 seconds') / (%(n)s / 1000.0), now(),
            now() - ((%(n)s - i) * interval '2592 seconds') / (%(n)s / 1000.0), 1
        FROM generate_series(1, %(n)s) AS i
    """,
    "sqlite": """
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %(n)s)
        INSERT INTO django_jobruns_jobrun (id, module, job, instance, live, payload, status, cursor, counters,
            attempts, started_at, updated_at, ended_at, lease_fence)
        SELECT printf('%%026d', i), 'perf', 'five_steps', 'old-' || i, NULL, 'null', 'done', '1', '{"steps": 5}', 0,
            datetime('now', '-' || ((%(n)s - i) * 2592000 / %(n)s) || ' seconds'), datetime('now'),
            datetime('now', '-' || ((%(n)s - i) * 2592000 / %(n)s) || ' seconds'), 1
        FROM n
    """,
}


def phase_fill(db: str, name: str, history: int) -> dict[str, object]:
    """Create the database and retain ``history`` finished runs in it (one INSERT ... SELECT)."""
    setup_django(fresh_database(db, name))
    from django.db import connection

    from django_jobruns.models import JobRun

    if history:
        with connection.cursor() as cur:
            cur.execute(FILL[connection.vendor].replace("%(n)s", str(int(history))).replace("%%", "%"))
            cur.execute("ANALYZE")
    return {"retained": JobRun.objects.count()}


def phase_drive(url: str, repeats: int) -> dict[str, object]:
    """Time STARTS starts, then a pass over DUE due runs, ``repeats`` times; report the medians of each."""
    setup_django(url)
    from django.db import connection
    from django.utils import timezone

    from django_jobruns import run_due_jobs, start_job_run
    from django_jobruns.models import JobRun
    from django_jobruns.store import store

    starts, drives = [], []
    for repeat in range(repeats):
        # Starts, timed on their own: STARTS of them, then deleted (a sample of 10 is too small to tell).
        began = time.perf_counter()
        for i in range(STARTS):
            start_job_run("perf.five_steps", instance=f"start-{repeat}-{i}")
        starts.append(time.perf_counter() - began)
        JobRun.objects.filter(instance__startswith="start-").delete()
        for i in range(DUE):
            start_job_run("perf.five_steps", instance=f"due-{repeat}-{i}")
        began = time.perf_counter()
        report = run_due_jobs(limit=DUE)
        drives.append(time.perf_counter() - began)
        assert report.completed == DUE, report
        JobRun.objects.filter(instance__startswith="due-").delete()
    at = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cur:
        explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
        cur.execute(explain + store().statements.due_first, [at, at, 50])
        plan = " | ".join(" ".join(str(c) for c in row) for row in cur.fetchall())
    return {"seconds": median(drives), "start_seconds": median(starts), "plan": plan}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument(
        "--keep", action="store_true", help="keep the two filled databases (bench_history_0/1), for --reuse"
    )
    parser.add_argument(
        "--reuse", action="store_true", help="measure the databases an earlier --keep left (PostgreSQL)"
    )
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

    if (args.keep or args.reuse) and args.db != "postgres":
        parser.error("--keep and --reuse need PostgreSQL: the SQLite files live in a temporary folder")
    if args.reuse:
        targets = filled_postgres_databases("history", [0, args.history])
    else:
        targets = fill_databases("history.py", args.db, "history", [0, args.history])
    results = interleave(
        args.rounds,
        targets,
        lambda retained, url: run_phase("history.py", "--phase", "drive", "--db", args.db, "--name", url),
    )
    samples = {retained: [float(r["seconds"]) for r in rs] for retained, rs in results.items()}
    start_samples = {retained: [float(r["start_seconds"]) for r in rs] for retained, rs in results.items()}
    plan = str(results[args.history][-1]["plan"])
    small, big = median(samples[0]), median(samples[args.history])
    small_starts, big_starts = median(start_samples[0]), median(start_samples[args.history])
    if not (args.keep or args.reuse):
        drop_databases(args.db, "history", [0, args.history])
    print(f"due read plan with {args.history} retained: {plan}")
    print(
        f"db={args.db} rounds={args.rounds} drive_of_{DUE}_runs_ms: retained_0={small * 1000:.1f} "
        f"retained_{args.history}={big * 1000:.1f}; starts_of_{STARTS}_ms: retained_0={small_starts * 1000:.1f} "
        f"retained_{args.history}={big_starts * 1000:.1f} (medians)"
    )
    print(f"ratio_retained_to_0={big / small:.2f} starts_ratio_retained_to_0={big_starts / small_starts:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
