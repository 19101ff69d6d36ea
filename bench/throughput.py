#!/usr/bin/env python
"""Durable steps per second: django-jobruns against DBOS Transact and the raw commit limit.

    python bench/throughput.py --db {sqlite,postgres} [--runs N] [--rounds R]

N runs of one pass with five trivial steps, driven by ``run_due_jobs``; the same
number of DBOS workflows of five ``@DBOS.step``s, run synchronously, on the same
kind of database with the same settings (SQLite: a file, rollback journal,
IMMEDIATE transactions, as DBOS uses it; PostgreSQL: the local server); and the
raw single-connection commit rate of that database. Each phase runs in a fresh
process, the phases interleaved over R rounds; medians are reported. On SQLite
the WAL figures (the settings this app recommends) are measured too, labelled.
The last line: ``ours_steps_per_s=… dbos_steps_per_s=… ratio=… commits_per_pass=…
commit_limit_share=…``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, fresh_database, median, run_phase, setup_django  # noqa: E402

STEPS = 5


def record_telemetry() -> None:
    """OpenTelemetry's SDK configured as a project would: spans batched to an exporter, metrics to a reader.

    The exporter drops what it is given, so what is measured is the engine's
    instrumentation and the SDK's own work, not a collector's network.
    """
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def phase_ours(db: str, runs: int, mode: str, otel: bool = False) -> dict[str, float]:
    name = f"bench_ours_{mode}"
    setup_django(fresh_database(db, name), mode)
    if otel:
        record_telemetry()
        from django_jobruns import telemetry

        assert telemetry.current() is not None, "the SDK's providers are set: the drive must record"
    from django.db import connection

    from django_jobruns import run_due_jobs, start_job_run

    def start(prefix: str, n: int) -> None:
        for i in range(n):
            start_job_run("perf.five_steps", instance=f"{prefix}{i}")

    # Commits per pass, counted on a small untimed batch: an atomic block's
    # COMMIT, or a write statement outside any transaction (autocommit).
    commits = 0
    original_commit = connection.commit

    def counting_commit() -> None:
        nonlocal commits
        commits += 1
        original_commit()

    def count_autocommit_writes(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        nonlocal commits
        # WITH: PostgreSQL's one-statement fenced writes (a read-only WITH would
        # be miscounted; the hot path has none).
        if sql.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "WITH") and not connection.in_atomic_block:
            commits += 1
        return execute(sql, params, many, context)

    start("count", 20)
    connection.commit = counting_commit  # type: ignore[method-assign]
    with connection.execute_wrapper(count_autocommit_writes):
        counted = run_due_jobs(limit=20)
    connection.commit = original_commit  # type: ignore[method-assign]
    assert counted.completed == 20, counted

    start("run", runs)
    began = time.perf_counter()
    done = 0
    while done < runs:
        done += run_due_jobs(limit=500).completed
    elapsed = time.perf_counter() - began
    drop_database(db, name)
    return {"steps_per_s": runs * STEPS / elapsed, "commits_per_pass": commits / 20}


def phase_dbos(db: str, runs: int) -> dict[str, float]:
    import logging

    from dbos import DBOS

    name = "bench_dbos"
    url = fresh_database(db, name)
    DBOS(config={"name": "jobruns-bench", "system_database_url": url, "log_level": "ERROR"})
    logging.getLogger("dbos").setLevel(logging.ERROR)

    @DBOS.step()
    def trivial(index: int) -> int:
        return index

    @DBOS.workflow()
    def five_steps(n: int) -> None:
        for index in range(STEPS):
            trivial(index)

    DBOS.launch()
    five_steps(-1)  # warm up: first-use work out of the timing
    began = time.perf_counter()
    for n in range(runs):
        five_steps(n)
    elapsed = time.perf_counter() - began
    DBOS.destroy()
    drop_database(db, name)
    return {"steps_per_s": runs * STEPS / elapsed}


def phase_raw(db: str, commits: int, mode: str) -> dict[str, float]:
    """One connection, one small UPDATE per transaction: the database's commit limit."""
    url = fresh_database(db, f"bench_raw_{mode}")
    if db == "sqlite":
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        if mode == "wal":
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        else:
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
        conn.execute("INSERT INTO t VALUES (1, 0)")
        began = time.perf_counter()
        for _ in range(commits):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE t SET v = v + 1 WHERE id = 1")
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - began
        conn.close()
    else:
        import psycopg

        with psycopg.connect(url.replace("postgresql://", "postgresql://", 1), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER)")
            conn.execute("INSERT INTO t VALUES (1, 0)")
            began = time.perf_counter()
            for _ in range(commits):
                conn.execute("UPDATE t SET v = v + 1 WHERE id = 1")
            elapsed = time.perf_counter() - began
        drop_database(db, f"bench_raw_{mode}")
    return {"commits_per_s": commits / elapsed}


def compare_otel(db: str, runs: int, rounds: int) -> int:
    """Ours with the SDK recording every span and metric, against ours with nothing configured, alternated."""
    mode = "wal" if db == "sqlite" else "rollback"
    off: list[float] = []
    on: list[float] = []
    for round_number in range(rounds):
        common = ["--phase", "ours", "--db", db, "--runs", str(runs), "--mode", mode]
        first, second = (off, on) if round_number % 2 == 0 else (on, off)
        for samples in (first, second):
            extra = ["--otel"] if samples is on else []
            samples.append(run_phase("throughput.py", *common, *extra)["steps_per_s"])
        print(f"round {round_number + 1}: off={off[-1]:.0f} on={on[-1]:.0f} steps/s", flush=True)
    print(
        f"db={db} mode={mode} runs={runs} rounds={rounds} otel_off_steps_per_s={median(off):.0f} "
        f"otel_on_steps_per_s={median(on):.0f} on_to_off={median(on) / median(off):.2f} (medians)"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase", choices=["ours", "dbos", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["rollback", "wal", "defaults"], default="rollback", help=argparse.SUPPRESS)
    parser.add_argument(
        "--otel",
        action="store_true",
        help="measure ours with OpenTelemetry's SDK recording, against ours without, side by side (the ratio)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be >= 1")
    if args.phase == "ours":
        print(json.dumps(phase_ours(args.db, args.runs, args.mode, otel=args.otel)))
        return 0
    if args.otel:
        return compare_otel(args.db, args.runs, args.rounds)
    if args.phase == "dbos":
        print(json.dumps(phase_dbos(args.db, args.runs)))
        return 0
    if args.phase == "raw":
        print(json.dumps(phase_raw(args.db, args.runs * (STEPS + 2), args.mode)))
        return 0

    modes = ["rollback", "wal"] if args.db == "sqlite" else ["rollback"]
    samples: dict[str, list[dict[str, float]]] = {}
    for round_number in range(args.rounds):
        for mode in modes:
            common = ["--db", args.db, "--runs", str(args.runs), "--mode", mode]
            samples.setdefault(f"ours_{mode}", []).append(run_phase("throughput.py", "--phase", "ours", *common))
            samples.setdefault(f"raw_{mode}", []).append(run_phase("throughput.py", "--phase", "raw", *common))
        if args.db == "postgres":
            # With nothing prepared (OPTIONS "prepare_threshold": None, as behind a pooler): the engine
            # otherwise prepares its own statements on a direct connection.
            unprepared = run_phase(
                "throughput.py", "--phase", "ours", *common, env={"BENCH_PG_PREPARE_THRESHOLD": "none"}
            )
            samples.setdefault("ours_unprepared", []).append(unprepared)
        samples.setdefault("dbos", []).append(
            run_phase("throughput.py", "--phase", "dbos", "--db", args.db, "--runs", str(args.runs))
        )
        print(f"round {round_number + 1}: " + json.dumps({k: v[-1] for k, v in samples.items()}), flush=True)

    def figures(mode: str) -> dict[str, float]:
        ours = median([s["steps_per_s"] for s in samples[f"ours_{mode}"]])
        commits_per_pass = median([s["commits_per_pass"] for s in samples[f"ours_{mode}"]])
        raw = median([s["commits_per_s"] for s in samples[f"raw_{mode}"]])
        limit_steps_per_s = raw * STEPS / commits_per_pass
        return {
            "ours": ours,
            "commits_per_pass": commits_per_pass,
            "raw_commits_per_s": raw,
            "share": ours / limit_steps_per_s,
        }

    dbos = median([s["steps_per_s"] for s in samples["dbos"]])
    if args.db == "sqlite":
        wal = figures("wal")
        print(
            f"WAL (recommended settings; DBOS not run in WAL): ours_steps_per_s={wal['ours']:.0f} "
            f"raw_commits_per_s={wal['raw_commits_per_s']:.0f} commits_per_pass={wal['commits_per_pass']:g} "
            f"commit_limit_share={wal['share']:.2f} ratio_to_dbos_rollback={wal['ours'] / dbos:.2f}"
        )
    main_figures = figures("rollback")
    print(
        f"db={args.db} runs={args.runs} steps_per_pass={STEPS} rounds={args.rounds} "
        f"raw_commits_per_s={main_figures['raw_commits_per_s']:.0f} (medians)"
    )
    print(
        f"ours_steps_per_s={main_figures['ours']:.0f} dbos_steps_per_s={dbos:.0f} "
        f"ratio={main_figures['ours'] / dbos:.2f} commits_per_pass={main_figures['commits_per_pass']:g} "
        f"commit_limit_share={main_figures['share']:.2f}"
    )
    if "ours_unprepared" in samples:
        unprepared = median([s["steps_per_s"] for s in samples["ours_unprepared"]])
        print(
            f'nothing prepared (OPTIONS "prepare_threshold": None): ours_steps_per_s={unprepared:.0f} '
            f"ratio={unprepared / dbos:.2f} prepared_against_unprepared={main_figures['ours'] / unprepared:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
