#!/usr/bin/env python
"""A backlog drained by one time-budgeted invocation, against the one-shot cron line.

    python bench/backlog.py --db {sqlite,postgres} [--runs N] [--passes M] [--budget S]

N runs of M passes (one trivial step each). Two fresh databases, the same
backlog in each: one ``run_due_jobs --max-seconds S`` invocation drains the
first; the second gets what the cron line without a budget does in one
invocation (``--max-passes 20``). For each: the share of the backlog's passes
committed by that one invocation, and the share of its wall time spent inside
passes (handler entry to commit; goal ≥ 0.9 on PostgreSQL). Last line:
``budgeted_committed=… budgeted_in_passes=… cron_committed=…``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, drop_database, fresh_database, run_phase, setup_django  # noqa: E402


def phase(db: str, name: str, runs: int, passes: int, args: list[str]) -> dict[str, float]:
    url = fresh_database(db, name)
    setup_django(url)
    from django.db import connection

    from django_jobruns import start_job_run
    from django_jobruns.models import JobRun

    for i in range(runs):
        start_job_run("perf.chunked", instance=f"b{i}", payload={"passes": passes})
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": url,
        "PYTHONPATH": str(ROOT),
        "BENCH_RUNS": str(runs),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "backlog.py"), "--drive", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    inner = json.loads(proc.stdout.strip().splitlines()[-1])
    committed = sum(json.loads(c).get("passes", 0) for c in JobRun.objects.values_list("counters", flat=True))
    connection.close()
    drop_database(db, name)
    return {
        "committed": committed / (runs * passes),
        "in_passes": inner["in_passes"],
        "wall": wall,
        "drive_seconds": inner["seconds"],
    }


def drive(args: list[str]) -> None:
    """In the child: one invocation of the command, timing each pass from handler entry to its commit."""
    import django

    django.setup()
    from django.core.management import call_command

    from bench.perf import jobs
    from django_jobruns.signals import pass_committed, run_completed

    spans: list[float] = []
    entered: dict[str, float] = {}
    last = [0.0]
    completed = [0]

    def finished(sender, **kwargs):  # type: ignore[no-untyped-def]
        last[0] = time.perf_counter()
        completed[0] += 1
        if completed[0] == int(os.environ["BENCH_RUNS"]):
            signal.raise_signal(signal.SIGTERM)  # the backlog is drained: end the wait for more

    run_completed.connect(finished, weak=False)
    original = jobs.chunked.handler

    def timed(p):  # type: ignore[no-untyped-def]
        entered[p.run.id] = time.perf_counter()
        return original(p)

    jobs.chunked.handler = timed

    def committed(sender, run_id, **kwargs):  # type: ignore[no-untyped-def]
        last[0] = time.perf_counter()
        spans.append(last[0] - entered[run_id])

    pass_committed.connect(committed, weak=False)
    t0 = time.perf_counter()
    with open(os.devnull, "w") as sink:
        call_command("run_due_jobs", *args, stdout=sink)
    # Spent in passes, over the time until the last commit (the wait after it is idle by design).
    seconds = max(last[0] - t0, 1e-9)
    print(json.dumps({"in_passes": sum(spans) / seconds, "seconds": seconds}))


def main() -> int:
    if "--drive" in sys.argv:
        drive([a for a in sys.argv[1:] if a != "--drive"])
        return 0
    if "--phase" in sys.argv:  # one fresh process per database: --phase DB NAME RUNS PASSES ARGS…
        db, name, runs, passes, *args = sys.argv[sys.argv.index("--phase") + 1 :]
        print(json.dumps(phase(db, name, int(runs), int(passes), args)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--budget", type=float, default=20)
    args = parser.parse_args()
    common = [args.db, "bench_backlog", str(args.runs), str(args.passes)]
    budgeted = run_phase("backlog.py", "--phase", *common, "--max-seconds", str(args.budget))
    cron = run_phase("backlog.py", "--phase", *common, "--max-passes", "20")
    print(f"budgeted: {budgeted}\ncron line (--max-passes 20, no budget): {cron}")
    print(
        f"budgeted_committed={budgeted['committed']:.2f} budgeted_in_passes={budgeted['in_passes']:.2f} "
        f"cron_committed={cron['committed']:.2f} cron_in_passes={cron['in_passes']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
