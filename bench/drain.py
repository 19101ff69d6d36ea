#!/usr/bin/env python
"""A task's cost on this app's worker alone: N no-op tasks enqueued, then drained in one process.

    python bench/drain.py --db {sqlite,postgres,mysql} [--tasks N]

The tasks are enqueued in one transaction, then ``run_due_jobs(limit=500)`` is
called until every one has finished, in this process (no worker to start, no
peer): what remains is the engine's own work per task, for before/after
comparisons of a change on the hot path (``farm-bench --vs`` on two checkouts,
whose CPU figures cover the whole process). The last line: ``tasks_per_s=…``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, setup_django  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--tasks", type=int, default=4000)
    args = parser.parse_args()
    os.environ["BENCH_TASKS"] = "ours"
    name = "bench_drain"
    setup_django(fresh_database(args.db, name))
    from django.db import connection, transaction

    from bench.tasks_app import task_functions as t
    from django_jobruns import run_due_jobs

    with transaction.atomic():
        for _ in range(args.tasks):
            t.noop.enqueue()
    began = time.perf_counter()
    done = 0
    while done < args.tasks:
        done += run_due_jobs(limit=500).completed
    elapsed = time.perf_counter() - began
    connection.close()
    drop_database(args.db, name)
    print(f"tasks_per_s={args.tasks / elapsed:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
