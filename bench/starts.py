#!/usr/bin/env python
"""What the admin's search index costs: starts and steps per second with and without its triggers.

    python bench/starts.py --db {sqlite,mysql} [--starts N] [--rounds R] [--without {search,warned}]

On SQLite (an FTS5 trigram table, migration 0007) and MariaDB/MySQL (a table of
three-character sequences, migration 0010), the search index is kept by
triggers on the runs table, so every ``start_job_run`` writes it. Two
databases side by side, migrated alike; in one the triggers are dropped. Each
round, N runs are started in each (a fresh key each, outside any transaction,
as a project's code starts them), then driven (one pass of five steps each,
whose step records and commit fire the update trigger, which finds the text
unchanged), the two alternating; medians are compared. The last line:
``with_index_starts_per_s=… without_starts_per_s=… ratio=… steps_ratio=…``.
``--without warned`` compares with and without the index of the warned runs
(``jobruns_warned``, migration 0016) instead, the search index kept in both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib import import_module
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, interleave, median, run_phase, setup_django  # noqa: E402

#: The migration that creates each database's search index and its triggers.
MIGRATION = {
    "sqlite": "django_jobruns.migrations.0007_sqlite_search",
    "mysql": "django_jobruns.migrations.0010_mysql_search",
}


def phase(db: str, variant: str, starts: int, round_: int, without: str = "search") -> dict[str, float]:
    name = f"bench_starts_{variant}"
    url = fresh_database(db, name)
    setup_django(url)
    from django.db import connection

    from django_jobruns import run_due_jobs, start_job_run

    if variant == "without":
        with connection.cursor() as cur:
            if without == "warned":
                on = " ON django_jobruns_jobrun" if db == "mysql" else ""
                cur.execute(f"DROP INDEX jobruns_warned{on}")
            else:
                for trigger in import_module(MIGRATION[db]).TRIGGERS:
                    cur.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    began = time.perf_counter()
    for i in range(starts):
        start_job_run("perf.five_steps", instance=f"supplier-{round_}-{i}", payload={"page": i})
    elapsed = time.perf_counter() - began
    began = time.perf_counter()
    done = 0
    while done < starts:
        done += run_due_jobs(limit=500).completed
    driven = time.perf_counter() - began
    connection.close()
    drop_database(db, name)
    return {"starts_per_s": starts / elapsed, "steps_per_s": starts * 5 / driven}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "mysql"], required=True)
    parser.add_argument("--starts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--without", choices=["search", "warned"], default="search")
    parser.add_argument("--phase", choices=["with", "without"], help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args.db, args.phase, args.starts, args.round, args.without)))
        return 0
    rounds = iter(range(args.rounds * 2))
    samples = interleave(
        args.rounds,
        {"with": "with", "without": "without"},
        lambda key, variant: run_phase(
            "starts.py",
            *("--phase", variant, "--db", args.db, "--starts", str(args.starts), "--round", str(next(rounds))),
            *("--without", args.without),
        ),
    )
    for key, values in samples.items():
        print(f"{key}: starts/s " + " ".join(f"{v['starts_per_s']:.0f}" for v in values), end="; ")
        print("steps/s " + " ".join(f"{v['steps_per_s']:.0f}" for v in values))
    starts = {key: median([v["starts_per_s"] for v in values]) for key, values in samples.items()}
    steps = {key: median([v["steps_per_s"] for v in values]) for key, values in samples.items()}
    print(f"db={args.db} starts={args.starts} rounds={args.rounds} (medians, per second)")
    print(
        f"with_index_starts_per_s={starts['with']:.0f} without_starts_per_s={starts['without']:.0f} "
        f"ratio={starts['with'] / starts['without']:.2f} with_index_steps_per_s={steps['with']:.0f} "
        f"without_steps_per_s={steps['without']:.0f} steps_ratio={steps['with'] / steps['without']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
