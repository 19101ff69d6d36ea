#!/usr/bin/env python
"""A drive's look at the schedules with S of them declared: milliseconds per round, none due and all due.

    python bench/schedules.py --db {sqlite,postgres,mysql} [--schedules S] [--rounds R]

S schedules (a thousand at the default) of a job every five minutes, each its own instance. First the
look a drive takes every round while no tick is due (R times, the median): the settings already
parsed, one statement. Then every schedule's tick made due and one look starting them all: each a
compare-and-set and a start, in one transaction each. The last line:
``db=… schedules=… idle_round_ms=… due_round_ms=… per_tick_ms=… started=…``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, median, setup_django  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if args.schedules < 1 or args.rounds < 1:
        parser.error("--schedules and --rounds must be >= 1")
    name = "jobruns_bench_schedules"
    setup_django(fresh_database(args.db, name))
    from datetime import UTC, datetime, timedelta

    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from django_jobruns import schedules
    from django_jobruns.models import JobRun, JobSchedule

    call_command("migrate", verbosity=0)
    settings.JOBRUNS = {
        "SCHEDULES": {
            f"s{i:04d}": {"job": "perf.five_steps", "cron": "*/5 * * * *", "timezone": "UTC", "instance": f"i{i}"}
            for i in range(args.schedules)
        }
    }
    now = datetime(2026, 6, 1, 3, 1, tzinfo=UTC)
    schedules.fire_due(now)  # parses the settings, makes the rows: what a process does once
    samples = []
    for _ in range(args.rounds):
        began = time.perf_counter()
        ticks = schedules.fire_due(now)
        samples.append((time.perf_counter() - began) * 1000)
        assert ticks.started == 0 and ticks.next_tick is not None
    idle = median(samples)

    JobSchedule.objects.update(next_tick=now - timedelta(minutes=1))
    began = time.perf_counter()
    ticks = schedules.fire_due(now)
    due = (time.perf_counter() - began) * 1000
    assert ticks.started == args.schedules == JobRun.objects.count(), (ticks, JobRun.objects.count())
    connection.close()
    drop_database(args.db, name)
    print(
        f"db={args.db} schedules={args.schedules} idle_round_ms={idle:.2f} due_round_ms={due:.0f} "
        f"per_tick_ms={due / args.schedules:.2f} started={ticks.started}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
