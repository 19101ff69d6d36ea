#!/usr/bin/env python
"""What keep-alive costs: renewals per second for N passes whose bodies outlive their lease.

    python bench/keepalive.py --db {sqlite,postgres,mysql} [--passes N] [--lease SECONDS] [--leases K]

N runs of one step whose body sleeps K leases are driven at once (``--concurrency N``) under a
lease of ``--lease`` seconds. The keep-alive renews each lease every third of it, so the expected
load is 3 / lease statements per second per body; the renewals this process sent are counted
(``keepalive.renewals()``), and every pass must complete, none lost or taken over. The last line:
``renewals=… per_second=… per_100_bodies_per_second=… expected_per_100=… lost=… taken_over=…``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, setup_django  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--passes", type=int, default=100, help="bodies running at once")
    parser.add_argument("--lease", type=float, default=5.0, help="seconds (at least 5)")
    parser.add_argument("--leases", type=float, default=3.0, help="how many leases each body runs")
    args = parser.parse_args()
    if args.passes < 1 or args.lease < 5 or args.leases <= 0:
        parser.error("--passes >= 1, --lease >= 5, --leases > 0")
    name = "jobruns_bench_keepalive"
    url = fresh_database(args.db, name)
    setup_django(url)
    from django.core.management import call_command

    from django_jobruns import job, keepalive, run_due_jobs, start_job_run

    call_command("migrate", verbosity=0)
    body_seconds = args.lease * args.leases

    @job("held_body", lease=args.lease)
    def held_body(p):  # type: ignore[no-untyped-def]
        p.step("call", lambda: time.sleep(body_seconds) or "answered")
        return {"done": True}

    for n in range(args.passes):
        start_job_run(held_body, instance=f"b{n}")
    before = keepalive.renewals()
    began = time.monotonic()
    report = run_due_jobs(limit=args.passes, concurrency=args.passes)
    seconds = time.monotonic() - began
    renewals = keepalive.renewals() - before
    per_second = renewals / seconds
    per_100 = per_second * 100 / args.passes
    expected = 100 * 3 / args.lease * body_seconds / seconds  # while the bodies run, of the whole drive
    print(
        f"db={args.db} passes={args.passes} lease={args.lease:g}s body={body_seconds:g}s "
        f"drive={seconds:.1f}s completed={report.completed}"
    )
    print(
        f"renewals={renewals} per_second={per_second:.1f} per_100_bodies_per_second={per_100:.1f} "
        f"expected_per_100={expected:.1f} lost={report.lost} taken_over={report.taken_over}"
    )
    drop_database(args.db, name)
    return 0 if report.completed == args.passes and report.lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
