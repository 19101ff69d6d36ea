#!/usr/bin/env python
"""Start to first step body, with a drive already waiting for work.

    python bench/latency.py --db {sqlite,postgres} [--starts N]

A real ``manage.py run_due_jobs --max-seconds 600`` process waits for work
(woken by NOTIFY on PostgreSQL, polling on SQLite); this process starts N runs
of a job whose one step records when its body began, one at a time, at random
moments, and measures each start's ``started_at`` to that moment. The last
line: ``p50_ms=… p99_ms=… starts=…`` (goals: SQLite p50 ≤ 500 ms; PostgreSQL
p50 ≤ 100 ms, p99 ≤ 500 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, drop_database, fresh_database, setup_django  # noqa: E402


def wait_done(run_id: str, timeout: float = 30) -> None:
    from django_jobruns.models import JobRun

    deadline = time.monotonic() + timeout
    while JobRun.objects.filter(pk=run_id, status="done").count() == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} not done after {timeout} s")
        time.sleep(0.002)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--starts", type=int, default=60)
    args = parser.parse_args()
    url = fresh_database(args.db, "bench_latency")
    setup_django(url)
    from django.db import connection

    from django_jobruns import start_job_run
    from django_jobruns.models import JobRun

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    drive = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "run_due_jobs", "--max-seconds", "600",
                              "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        warm, _ = start_job_run("perf.stamp", instance="warm-up")
        wait_done(warm.pk)
        latencies = []
        rng = random.Random(2026)
        for i in range(args.starts):
            time.sleep(rng.uniform(0, 0.3))  # start at a random moment of the drive's wait
            run, _ = start_job_run("perf.stamp", instance=f"l{i}")
            wait_done(run.pk)
            done = JobRun.objects.get(pk=run.pk)
            latencies.append(json.loads(done.counters)["body_at"] - done.started_at.timestamp())
    finally:
        drive.send_signal(signal.SIGTERM)
        out, err = drive.communicate(timeout=60)
    report = json.loads(out)
    ms = sorted(1000 * x for x in latencies)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    print(f"drive: completed={report['completed']} stopped={report['stopped']} ({connection.vendor})")
    print(f"p50_ms={statistics.median(ms):.1f} p99_ms={p99:.1f} max_ms={ms[-1]:.1f} starts={len(ms)}")
    connection.close()
    drop_database(args.db, "bench_latency")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
