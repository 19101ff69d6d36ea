#!/usr/bin/env python
"""The upgrade's migrations at a million runs: how long they take, how long a drive's write waits meanwhile.

    python bench/migration.py --db {sqlite,postgres,mysql} [--runs N] [--live L] [--start 0011] [--to 0019]

N runs (a million at the default), L of them live (running, a tenth at the default) and the rest
finished, are inserted at migration ``--start`` (0011: the last of 0.1.0). Then ``migrate django_jobruns --to``
runs while a probe,
on a connection of its own, writes as drives and starts do: every 20 ms it commits a pass's update
of a live run (the run's row, as the fill's batches touch it) and starts a new run (an insert, as
the index build sees it), writing the columns of ``--start`` only, as the code of that release does.
The figure that matters online is the longest one probe write waited:
the time a drive would stand still. The last line:
``db=… runs=… live=… migrate_s=… longest_write_ms=… writes=… writes_over_1s=…``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, setup_django  # noqa: E402

BATCH = 5_000
PROBE_SECONDS = 0.02


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--live", type=int, default=100_000)
    parser.add_argument("--start", default="0011", help="the migration the table is filled at (0011: 0.1.0's last)")
    parser.add_argument("--to", default="0019", help="the migration the upgrade ends at")
    args = parser.parse_args()
    if args.runs < 1 or not 1 <= args.live <= args.runs:
        parser.error("--runs must be >= 1 and --live from 1 to --runs")
    name = "jobruns_bench_migration"
    setup_django(fresh_database(args.db, name))
    from django.core.management import call_command
    from django.db import connection, connections, transaction
    from django.utils import timezone

    call_command("migrate", "django_jobruns", args.start, verbosity=0)
    q = connection.ops.quote_name
    table = q("django_jobruns_jobrun")
    with connection.cursor() as cur:
        existing = {c.name for c in connection.introspection.get_table_description(cur, "django_jobruns_jobrun")}
    columns = ["id", "module", "job", "instance", "live", "payload", "status", "counters", "attempts"]
    columns += ["started_at", "updated_at", "ended_at", "lease_fence", "priority"]
    columns = [c for c in columns if c in existing]  # the old release's columns
    width = len(columns)
    insert = f"INSERT INTO {table} ({', '.join(q(c) for c in columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    start = timezone.now() - timedelta(days=30)
    adapt = connection.ops.adapt_datetimefield_value
    began = time.monotonic()
    # The live runs spread through the table, as a busy table holds them: every (runs/live)-th.
    every = args.runs // args.live
    for first in range(0, args.runs, BATCH):
        rows = []
        for i in range(first, min(first + BATCH, args.runs)):
            at = adapt(start + timedelta(milliseconds=i))
            run_id = f"0{i:025d}"
            live = i % every == 0 and i // every < args.live
            status, ended = ("running", None) if live else ("done", at)
            row = [
                run_id,
                "bench",
                "walk",
                run_id,
                True if live else None,
                "null",
                status,
                "{}",
                0,
                at,
                at,
                ended,
                0,
                0,
            ]
            rows.append(row[:width])
        with transaction.atomic(), connection.cursor() as cur:
            cur.executemany(insert, rows)
    filled = time.monotonic() - began
    print(f"inserted {args.runs} runs ({args.live} live) in {filled:.1f} s", flush=True)
    connection.close()

    waits: list[float] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def probe() -> None:
        wrapper = connections["default"]
        n = 0
        try:
            while not stop.is_set():
                target = f"0{(n * every * 7919) % (args.live * every) // every * every:025d}"
                before = time.monotonic()
                with transaction.atomic(), wrapper.cursor() as cur:
                    cur.execute(
                        f"UPDATE {table} SET {q('updated_at')} = %s WHERE {q('id')} = %s",
                        [adapt(timezone.now()), target],
                    )
                    new_id = f"9{n:025d}"
                    now = adapt(timezone.now())
                    row = [new_id, "bench", "probe", new_id, True, "null", "running", "{}", 0, now, now, None, 0, 0]
                    cur.execute(insert, row[:width])
                waits.append(time.monotonic() - before)
                n += 1
                stop.wait(PROBE_SECONDS)
        except BaseException as exc:  # reported below: a probe that failed measured nothing
            failures.append(exc)
        finally:
            wrapper.close()

    prober = threading.Thread(target=probe, name="probe")
    prober.start()
    began = time.monotonic()
    try:
        call_command("migrate", "django_jobruns", args.to, verbosity=0)
    finally:
        migrated = time.monotonic() - began
        stop.set()
        prober.join()
    if failures:
        raise failures[0]
    with connection.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {table} WHERE {q('status')} = 'running' AND {q('due_at')} IS NULL")
        (unfilled,) = cur.fetchone()
    assert unfilled <= len(waits), f"{unfilled} live runs left without due_at"  # only the probe's own starts
    longest = max(waits) * 1000 if waits else float("nan")
    over = sum(1 for wait in waits if wait > 1)
    connection.close()
    drop_database(args.db, name)
    print(
        f"db={args.db} runs={args.runs} live={args.live} start={args.start} to={args.to} migrate_s={migrated:.1f} "
        f"longest_write_ms={longest:.0f} writes={len(waits)} writes_over_1s={over}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
