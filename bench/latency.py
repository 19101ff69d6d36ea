#!/usr/bin/env python
"""Start to first step body, with a drive already waiting for work.

    python bench/latency.py --db {sqlite,postgres} [--starts N]

A real ``manage.py run_due_jobs --max-seconds 600`` process waits for work
(woken by NOTIFY on PostgreSQL, polling on SQLite); this process starts N runs
of a job whose one step records when its body began, one at a time, at random
moments, and measures each start's ``started_at`` to that moment. Then, in a
fresh process on the same kind of database, the same for DBOS's queue: a
workflow of one step enqueued N times at random moments, from enqueue to the
step body, with the queue's default polling (``polling_interval_sec=1.0``) and
with DBOS's shortest useful one (0.1 s) for comparison. The last line:
``p50_ms=… p99_ms=… starts=… dbos_p50_ms=… dbos_p99_ms=…`` (goals: SQLite p50
≤ 500 ms; PostgreSQL p50 ≤ 100 ms, p99 ≤ 500 ms).
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

from bench.common import ROOT, drop_database, fresh_database, run_phase, setup_django  # noqa: E402


def wait_done(run_id: str, timeout: float = 30) -> None:
    from django_jobruns.models import JobRun

    deadline = time.monotonic() + timeout
    while JobRun.objects.filter(pk=run_id, status="done").count() == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} not done after {timeout} s")
        time.sleep(0.002)


def percentiles(seconds: list[float]) -> tuple[float, float, float]:
    ms = sorted(1000 * x for x in seconds)
    return statistics.median(ms), ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))], ms[-1]


def phase_dbos(db: str, starts: int, polling: float) -> dict[str, float]:
    """Enqueue to step body on DBOS's queue, in this process (DBOS's own worker thread dequeues)."""
    import logging

    from dbos import DBOS

    name = "bench_latency_dbos"
    url = fresh_database(db, name)
    DBOS(config={"name": "jobruns-latency", "system_database_url": url, "log_level": "ERROR"})
    logging.getLogger("dbos").setLevel(logging.ERROR)

    @DBOS.step()
    def stamp() -> float:
        return time.time()

    @DBOS.workflow()
    def one_step() -> float:
        return float(stamp())

    DBOS.launch()
    queue = DBOS.register_queue("latency", polling_interval_sec=polling)
    queue.enqueue(one_step).get_result()  # warm up
    rng = random.Random(2026)
    latencies = []
    for _ in range(starts):
        time.sleep(rng.uniform(0, 0.3))  # enqueue at a random moment of the queue's polling
        enqueued = time.time()
        body_at = queue.enqueue(one_step).get_result()
        latencies.append(body_at - enqueued)
    DBOS.destroy()
    drop_database(db, name)
    p50, p99, top = percentiles(latencies)
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": top}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--starts", type=int, default=60)
    parser.add_argument("--phase", choices=["dbos"], help=argparse.SUPPRESS)
    parser.add_argument("--polling", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "dbos":
        print(json.dumps(phase_dbos(args.db, args.starts, args.polling)))
        return 0
    url = fresh_database(args.db, "bench_latency")
    setup_django(url)
    from django.db import connection

    from django_jobruns import start_job_run
    from django_jobruns.models import JobRun

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    drive = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_due_jobs", "--max-seconds", "600", "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    p50, p99, top = percentiles(latencies)
    print(f"drive: completed={report['completed']} stopped={report['stopped']} ({connection.vendor})")
    connection.close()
    drop_database(args.db, "bench_latency")
    dbos = {}
    for polling in (1.0, 0.1):
        dbos[polling] = run_phase(
            "latency.py", "--phase", "dbos", "--db", args.db, "--starts", str(args.starts), "--polling", str(polling)
        )
        print(
            f"DBOS queue, polling_interval_sec={polling}: p50_ms={dbos[polling]['p50_ms']:.1f} "
            f"p99_ms={dbos[polling]['p99_ms']:.1f} max_ms={dbos[polling]['max_ms']:.1f}"
        )
    print(
        f"p50_ms={p50:.1f} p99_ms={p99:.1f} max_ms={top:.1f} starts={len(latencies)} "
        f"dbos_p50_ms={dbos[1.0]['p50_ms']:.1f} dbos_p99_ms={dbos[1.0]['p99_ms']:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
