#!/usr/bin/env python
"""Django's Tasks: this app's backend against django-tasks-db's, on the same database, rounds interleaved.

    python bench/tasks.py --db {sqlite,postgres} [--tasks N] [--latency K] [--rounds R]
        [--sqlite-mode wal|rollback|both] [--concurrency N] [--long-task SECONDS]

Each phase is a fresh database and a fresh worker process waiting for work:
``manage.py run_due_jobs --max-seconds …`` for this app, ``manage.py db_worker``
(its defaults: a poll every second) for django-tasks-db. Throughput: N no-op
tasks enqueued in one transaction, timed from the commit until the last has
finished. Latency: K tasks enqueued one at a time, each returning the moment
it started; enqueue-to-start is that moment less the moment before the
enqueue (one host, one clock), each enqueue at a random moment of the
worker's wait. Medians over the rounds; the last line is the
summary with the ratios (``--sqlite-mode both``: both journal modes in each
round, a summary line for each).
``--concurrency N``: this app's worker with N threads against one, interleaved.
``--long-task S``: the latencies measured while a task of S seconds holds one
of the worker's threads (the last line adds each worker's longest wait).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, drop_database, fresh_database, median, run_phase, setup_django  # noqa: E402


def phase(
    db: str, which: str, tasks: int, latency: int, sqlite_mode: str = "wal", concurrency: int = 1, long_task: float = 0
) -> dict[str, float]:
    os.environ["BENCH_TASKS"] = which
    name = f"bench_tasks_{which}"
    url = fresh_database(db, name)
    setup_django(url, sqlite_mode)  # SQLite: IMMEDIATE, with WAL or the rollback journal (synchronous=FULL)
    from django.db import transaction
    from django.db.models import Max

    from bench.tasks_app import task_functions as t

    if which == "ours":
        from django_jobruns.models import JobRun

        def finished() -> int:
            return JobRun.objects.filter(status__in=["done", "failed"]).count()

        def last_finish() -> float:
            return JobRun.objects.aggregate(last=Max("ended_at"))["last"].timestamp()

        def running() -> int:
            return JobRun.objects.filter(status="running", lease_holder__isnull=False).count()

        command = ["run_due_jobs", "--max-seconds", "600", "--limit", "50", "--concurrency", str(concurrency)]
    else:
        from django_tasks_db.models import DBTaskResult

        def finished() -> int:
            return DBTaskResult.objects.filter(status__in=["SUCCESSFUL", "FAILED"]).count()

        def last_finish() -> float:
            return DBTaskResult.objects.aggregate(last=Max("finished_at"))["last"].timestamp()

        def running() -> int:
            return DBTaskResult.objects.filter(status="RUNNING").count()

        command = ["db_worker"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def until(done: Callable[[], bool], what: Callable[[], str], limit: float = 600) -> None:
            deadline = time.monotonic() + limit
            while not done():
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit(f"{which}: {what()}")
                # Not a tight loop: on a machine of two cores, a poll every few milliseconds takes
                # processor time from the worker and the database it measures.
                time.sleep(0.02)

        def wait_for(count: int) -> None:
            until(lambda: finished() >= count, lambda: f"{finished()} of {count} tasks finished")

        def finished_now(result: Any) -> bool:
            result.refresh()
            return bool(result.is_finished)

        t.noop.enqueue()  # the worker is up and waiting once this one has run
        wait_for(1)
        with transaction.atomic():
            for _ in range(tasks):
                t.noop.enqueue()
        began, cpu_began, machine_began = time.time(), cpu_seconds(worker.pid), machine_ticks()
        wait_for(1 + tasks)
        cpu_ended, cpu_wall, machine_ended = cpu_seconds(worker.pid), time.time() - began, machine_ticks()
        # From the enqueue's commit to the last task's finish as its row records it (the worker's
        # clock, this machine's), not to when the poll saw it.
        wall = last_finish() - began
        per_second = tasks / wall
        cpu_share = (cpu_ended - cpu_began) / cpu_wall
        waits = []
        phase_rng = random.Random(7)
        if long_task:
            # The latencies measured while one task holds a thread of the worker (``--long-task``).
            t.hold.enqueue(long_task)
            until(lambda: running() > 0, lambda: "the long task never started")
        for _ in range(latency):
            # Each enqueue at a random moment of the worker's wait (a second is the peer's poll), as
            # work arrives in production; right after the previous task it would always find a
            # polling worker at the start of its sleep.
            time.sleep(phase_rng.uniform(0, 1.0))
            before = time.time()
            result = t.started_at.enqueue()
            until(partial(finished_now, result), lambda: "a latency task never finished")
            waits.append(result.return_value - before)
    finally:
        worker.terminate()
        worker.wait(timeout=120)
        from django.db import connections

        connections.close_all()
        drop_database(db, name)
    # The worker's processor time over the throughput's wall time: 1.0 is one core kept busy. The
    # machine's: the cores busy (the worker, the database's backends, this poll, anything else).
    busy, total = (ended - began for ended, began in zip(machine_ended, machine_began, strict=True))
    cores = os.cpu_count() or 1
    return {
        "tasks_per_s": per_second,
        "latency_p50_s": statistics.median(waits),
        "latency_max_s": max(waits),
        "worker_cpu": round(cpu_share, 2),
        "machine_cpu": round(cores * busy / total, 2) if total else 0.0,
        "cores": cores,
    }


def cpu_seconds(pid: int) -> float:
    """A process's user and system time so far (Linux's /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """The machine's busy and total processor ticks so far, all cores (Linux's /proc/stat; 0 elsewhere)."""
    try:
        ticks = [int(tick) for tick in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    idle = ticks[3] + ticks[4]  # idle and iowait
    return sum(ticks) - idle, sum(ticks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--latency", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sqlite-mode",
        choices=["wal", "rollback", "both"],
        default="wal",
        help="SQLite's journal: WAL, the rollback journal (synchronous=FULL), or both interleaved in each round",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="instead of the peer: this app's worker with --concurrency N against --concurrency 1, interleaved",
    )
    parser.add_argument(
        "--long-task",
        type=float,
        default=0,
        help="the latencies measured while a task of this many seconds holds one of the worker's threads",
    )
    parser.add_argument("--phase", choices=["ours", "peer"], help=argparse.SUPPRESS)
    parser.add_argument("--phase-concurrency", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sqlite_mode == "both" and (args.phase or args.concurrency):
        parser.error("--sqlite-mode both compares this app with the peer: not with --concurrency")
    if args.phase:
        figures = phase(
            args.db, args.phase, args.tasks, args.latency, args.sqlite_mode, args.phase_concurrency, args.long_task
        )
        print(json.dumps(figures))
        return 0
    if args.concurrency:
        return compare_concurrency(args)
    modes = ["wal", "rollback"] if args.sqlite_mode == "both" else [args.sqlite_mode]
    if args.db != "sqlite":
        modes = modes[:1]  # the journal is SQLite's: elsewhere each phase runs once a round
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        order = ["ours", "peer"] if round_ % 2 == 0 else ["peer", "ours"]
        for mode in modes:
            for which in order:
                sizes = ["--tasks", str(args.tasks), "--latency", str(args.latency), "--sqlite-mode", mode]
                sizes += ["--long-task", str(args.long_task)]
                figures = run_phase("tasks.py", "--db", args.db, "--phase", which, *sizes)
                results.setdefault((mode, which), []).append(figures)
                label = f" {mode}" if len(modes) > 1 else ""
                print(f"round {round_ + 1}{label} {which}: {json.dumps(figures)}", flush=True)
    for mode in modes:
        ours, peer = results[(mode, "ours")], results[(mode, "peer")]
        ours_rate = median([r["tasks_per_s"] for r in ours])
        peer_rate = median([r["tasks_per_s"] for r in peer])
        ours_p50 = median([r["latency_p50_s"] for r in ours])
        peer_p50 = median([r["latency_p50_s"] for r in peer])
        print(
            f"db={args.db} mode={mode if args.db == 'sqlite' else '-'} tasks={args.tasks} rounds={args.rounds} "
            f"ours_tasks_per_s={ours_rate:.0f} "
            f"peer_tasks_per_s={peer_rate:.0f} throughput_ratio={ours_rate / peer_rate:.2f} "
            f"ours_latency_p50_s={ours_p50:.3f} peer_latency_p50_s={peer_p50:.3f}"
        )
    return 0


def compare_concurrency(args: argparse.Namespace) -> int:
    """This app's worker driving N runs at once against one at a time, rounds interleaved."""
    rates: dict[int, list[float]] = {1: [], args.concurrency: []}
    busy: dict[int, list[float]] = {1: [], args.concurrency: []}
    longest: dict[int, list[float]] = {1: [], args.concurrency: []}
    for round_ in range(args.rounds):
        order = [1, args.concurrency] if round_ % 2 == 0 else [args.concurrency, 1]
        for n in order:
            latency = str(args.latency if args.long_task else 1)
            sizes = ["--tasks", str(args.tasks), "--latency", latency, "--sqlite-mode", args.sqlite_mode]
            sizes += ["--long-task", str(args.long_task)]
            figures = run_phase("tasks.py", "--db", args.db, "--phase", "ours", "--phase-concurrency", str(n), *sizes)
            rates[n].append(figures["tasks_per_s"])
            busy[n].append(figures["machine_cpu"])
            longest[n].append(figures["latency_max_s"])
            print(f"round {round_ + 1} concurrency {n}: {json.dumps(figures)}", flush=True)
    one, many = median(rates[1]), median(rates[args.concurrency])
    cores = os.cpu_count() or 1
    # The machine's processor time per task (every process: the worker, the database's backends),
    # and the ratio the cores allow were that time the same with N at once: cores over what one used.
    per_task = {n: 1000 * median(busy[n]) / median(rates[n]) for n in rates}
    ceiling = cores / median(busy[1]) if median(busy[1]) else 0.0
    print(
        f"db={args.db} tasks={args.tasks} rounds={args.rounds} concurrency_1_tasks_per_s={one:.0f} "
        f"concurrency_{args.concurrency}_tasks_per_s={many:.0f} ratio={many / one:.2f} "
        f"cores={cores} cores_busy_1={median(busy[1]):.2f} "
        f"cores_busy_{args.concurrency}={median(busy[args.concurrency]):.2f} "
        f"cpu_ms_per_task_1={per_task[1]:.2f} cpu_ms_per_task_{args.concurrency}={per_task[args.concurrency]:.2f} "
        f"ratio_the_cores_allow={ceiling:.2f}"
        + (
            f" long_task_s={args.long_task:g} latency_max_s_1={median(longest[1]):.3f} "
            f"latency_max_s_{args.concurrency}={median(longest[args.concurrency]):.3f}"
            if args.long_task
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
