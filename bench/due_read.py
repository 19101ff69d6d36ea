#!/usr/bin/env python
"""The due read at a large backlog: milliseconds per read with N runs due at once, on each database.

    python bench/due_read.py --db {sqlite,postgres,mysql} [--due N] [--reads R]

N running task runs of the queue ``default``, all due (a backlog: a quarter of a million at the
default), are inserted in batches; then the drive's due read (``store().due``, a page of 100) is
timed R times, and a read limited to another queue (D1: a dedicated worker behind the backlog). Medians are
reported. The read must follow the ``jobruns_due_at`` index in due order on every database,
never sort the backlog. The last line: ``db=… due=… due_read_ms=… queue_read_ms=…``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, median, setup_django  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--due", type=int, default=250_000)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    if args.due < 1 or args.reads < 1:
        parser.error("--due and --reads must be >= 1")
    name = "jobruns_bench_due_read"
    setup_django(fresh_database(args.db, name))
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from django_jobruns import db
    from django_jobruns.models import TASKS_MODULE as TASKS
    from django_jobruns.store import store

    call_command("migrate", verbosity=0)
    q = connection.ops.quote_name
    columns = ["id", "module", "job", "instance", "live", "payload", "status", "counters", "attempts"]
    columns += ["started_at", "updated_at", "due_at", "lease_fence", "priority", "queue_name"]
    text = (
        f"INSERT INTO {q('django_jobruns_jobrun')} ({', '.join(q(c) for c in columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))})"
    )
    start = timezone.now() - timedelta(days=1)
    adapt = connection.ops.adapt_datetimefield_value
    began = time.monotonic()
    for first in range(0, args.due, 5_000):
        rows = []
        for i in range(first, min(first + 5_000, args.due)):
            at = adapt(start + timedelta(milliseconds=i))
            run_id = f"0{i:025d}"
            rows.append(
                [run_id, TASKS, "default", run_id, True, "null", "running", "{}", 0, at, at, at, 0, 0, "default"]
            )
        with transaction.atomic(), connection.cursor() as cur:
            cur.executemany(text, rows)
    filled = time.monotonic() - began
    with connection.cursor() as cur:
        cur.execute("ANALYZE TABLE django_jobruns_jobrun" if connection.vendor == "mysql" else "ANALYZE")
    clock = db.database_clock()

    def timed(**filters: object) -> float:
        samples = []
        for _ in range(args.reads):
            before = time.perf_counter()
            found = store().due(clock.lease_now(), None, 100, **filters)  # type: ignore[arg-type]
            samples.append((time.perf_counter() - before) * 1000)
            assert filters or len(found) == 100, len(found)
        return median(samples)

    due_ms = timed()
    queue_ms = timed(queues=["emails"])
    print(f"filled {args.due} due runs in {filled:.0f} s")
    print(
        f"db={args.db} due={args.due} due_read_ms={due_ms:.2f} queue_read_ms={queue_ms:.2f} (medians of {args.reads})"
    )
    connection.close()
    drop_database(args.db, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
