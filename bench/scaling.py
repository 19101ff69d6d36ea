#!/usr/bin/env python
"""Passes per second with 1, 2, 4 and 8 worker processes on PostgreSQL.

    python bench/scaling.py [--runs R] [--passes P] [--steps S] [--wait SECONDS] [--rounds N]

R runs of P passes of S steps, each step waiting on (simulated) I/O for 20 ms.
For each worker count W, W processes start, wait at a common gate, then call
``run_due_jobs`` until no run is left; the time from the gate to the last exit
gives passes per second. Contended claims (a claim another worker won) are
counted. The last line: ``w1=… w2=… w4=… w8=… efficiency_w8=…`` (passes/s;
efficiency = w8 / (8 × w1); goal at least 0.8).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, drop_database, fresh_database, median, setup_django  # noqa: E402

NAME = "bench_scaling"
PASSES = 1  # passes per claim: every pass is claimed afresh, the contended case
URL = f"postgresql://postgres@127.0.0.1:5432/{NAME}"


def worker(workers: int) -> None:
    setup_django(URL)
    from django_jobruns import run_due_jobs
    from django_jobruns.models import JobRun

    print("ready", flush=True)
    sys.stdin.readline()  # the gate
    cpu_at_gate = time.process_time()
    passes = skipped = 0
    while True:
        report = run_due_jobs(limit=1, max_passes=PASSES)
        passes += report.advanced + report.completed
        skipped += report.skipped
        if report.attempted == 0:
            if not JobRun.objects.filter(status="running").exists():
                break
            # Everything left is held by the others: wait a moment, as a
            # scheduled worker would, instead of spinning on the due read.
            time.sleep(0.005)
    print(json.dumps({"passes": passes, "skipped": skipped, "cpu": time.process_time() - cpu_at_gate}), flush=True)


def measure(workers: int, args: argparse.Namespace) -> dict[str, float]:
    fresh_database("postgres", NAME)
    setup_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--phase",
            "prepare",
            "--runs",
            str(args.runs),
            "--passes",
            str(args.passes),
            "--steps",
            str(args.steps),
            "--wait",
            str(args.wait),
        ],
        check=True,
        env=setup_env,
        cwd=ROOT,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--phase", "worker", "--workers", str(workers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=setup_env,
            cwd=ROOT,
        )
        for _ in range(workers)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    began = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [json.loads(proc.communicate(timeout=600)[0].strip().splitlines()[-1]) for proc in procs]
    elapsed = time.perf_counter() - began
    passes = sum(r["passes"] for r in results)
    expected = args.runs * args.passes
    if passes != expected:
        raise SystemExit(f"{workers} workers drove {passes} passes, expected {expected}")
    cpu_ms = sum(r["cpu"] for r in results) / passes * 1000
    return {"passes_per_s": passes / elapsed, "skipped": sum(r["skipped"] for r in results), "cpu_ms": cpu_ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=192)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--wait", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["prepare", "worker"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "prepare":
        setup_django(URL)
        from django_jobruns import start_job_run

        for i in range(args.runs):
            start_job_run(
                "perf.io_steps",
                instance=f"r{i}",
                payload={"passes": args.passes, "steps": args.steps, "wait": args.wait},
            )
        return 0
    if args.phase == "worker":
        worker(args.workers)
        return 0

    counts = (1, 2, 4, 8)
    rates: dict[int, list[float]] = {w: [] for w in counts}
    contended: dict[int, list[float]] = {w: [] for w in counts}
    for _ in range(args.rounds):
        for w in counts:
            result = measure(w, args)
            rates[w].append(result["passes_per_s"])
            contended[w].append(result["skipped"])
            print(
                f"w{w}: {result['passes_per_s']:.1f} passes/s, {result['skipped']:.0f} contended claims, "
                f"{result['cpu_ms']:.1f} ms of worker CPU per pass",
                flush=True,
            )
    drop_database("postgres", NAME)
    w = {n: median(rates[n]) for n in counts}
    print(
        f"runs={args.runs} passes={args.passes} steps={args.steps} step_wait={args.wait * 1000:.0f}ms "
        f"ideal_w1={1 / (args.steps * args.wait):.1f} contended_claims="
        + ",".join(f"w{n}:{median(contended[n]):.0f}" for n in counts)
    )
    print(f"w1={w[1]:.1f} w2={w[2]:.1f} w4={w[4]:.1f} w8={w[8]:.1f} efficiency_w8={w[8] / (8 * w[1]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
