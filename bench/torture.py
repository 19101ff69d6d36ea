#!/usr/bin/env python
"""Crash-and-contention torture: kill real workers at random moments, check nothing was lost or doubled.

    python bench/torture.py --db {sqlite,postgres} --workers W --runs R --kills K [--seed S]
        [--poison P] [--stalls N] [--stops N] [--skewed-workers N]

W ``manage.py run_due_jobs`` processes drive R runs of a job with several steps
per pass and several passes. K SIGKILLs land in all: some sent by this harness
at random moments, some taken by the workers themselves inside a step body,
between a step's effect and its memo, and in the middle of a pass's commit.
Killed workers are replaced and their leases left to lapse until every run is
done. The other faults production brings can be added: P poison runs whose
every pass kills its worker; N stalls in which a third connection holds a
worked run's row (PostgreSQL: ``FOR UPDATE``; SQLite: the write lock) past the
lease; N workers stopped (SIGSTOP) past their lease and then resumed; and
workers whose clock runs ten minutes fast (PostgreSQL). The verdict comes from
independent evidence -- an event table the job's step bodies write to and
database triggers fill as memos, claims and commits land -- never from the
app's own bookkeeping. The last line is the summary;
the exit status is non-zero when an invariant fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
POSTGRES_DB = "jobruns_torture"

SQLITE_DDL = [
    """CREATE TABLE torture_events (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, run_id TEXT,
       step TEXT, fence INTEGER, holder TEXT, cursor_old TEXT, cursor_new TEXT, status TEXT, counters TEXT,
       pid INTEGER, backend INTEGER, note TEXT)""",
    """CREATE TRIGGER torture_memo_insert AFTER INSERT ON django_jobruns_jobstep WHEN NEW.result IS NOT NULL
       BEGIN INSERT INTO torture_events (kind, run_id, step) VALUES ('memo', NEW.run_id, NEW.step); END""",
    """CREATE TRIGGER torture_memo_update AFTER UPDATE OF result ON django_jobruns_jobstep
       WHEN NEW.result IS NOT NULL AND OLD.result IS NULL
       BEGIN INSERT INTO torture_events (kind, run_id, step) VALUES ('memo', NEW.run_id, NEW.step); END""",
    """CREATE TRIGGER torture_claim AFTER UPDATE OF lease_fence ON django_jobruns_jobrun
       WHEN NEW.lease_fence <> OLD.lease_fence
       BEGIN INSERT INTO torture_events (kind, run_id, fence, holder, note)
             VALUES ('claim', NEW.id, NEW.lease_fence, NEW.lease_holder,
                     -- another process took a lease that had not expired (with a margin for the
                     -- engine's reading of the clock): a live lease taken.
                     CASE WHEN OLD.lease_holder IS NOT NULL AND OLD.lease_holder <> NEW.lease_holder
                          AND OLD.lease_expires_at > strftime('%Y-%m-%d %H:%M:%f', 'now', '+0.2 seconds')
                          THEN 'live' END); END""",
    # Every pass commit sets the cursor (even to the value it had), and nothing else does.
    """CREATE TRIGGER torture_commit AFTER UPDATE OF cursor ON django_jobruns_jobrun
       BEGIN INSERT INTO torture_events (kind, run_id, fence, holder, cursor_old, cursor_new, status, counters)
             VALUES ('commit', NEW.id, NEW.lease_fence, OLD.lease_holder, OLD.cursor, NEW.cursor, NEW.status,
                     NEW.counters); END""",
]

POSTGRES_DDL = [
    """CREATE TABLE torture_events (id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, run_id TEXT, step TEXT,
       fence BIGINT, holder TEXT, cursor_old TEXT, cursor_new TEXT, status TEXT, counters TEXT, pid INTEGER,
       backend INTEGER, note TEXT)""",
    """CREATE FUNCTION torture_memo() RETURNS trigger AS $$ BEGIN
         IF NEW.result IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.result IS NULL) THEN
           INSERT INTO torture_events (kind, run_id, step) VALUES ('memo', NEW.run_id, NEW.step);
         END IF;
         RETURN NEW;
       END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER torture_memo AFTER INSERT OR UPDATE ON django_jobruns_jobstep
       FOR EACH ROW EXECUTE FUNCTION torture_memo()""",
    """CREATE FUNCTION torture_claim() RETURNS trigger AS $$ BEGIN
         IF NEW.lease_fence <> OLD.lease_fence THEN
           INSERT INTO torture_events (kind, run_id, fence, holder, note)
           VALUES ('claim', NEW.id, NEW.lease_fence, NEW.lease_holder,
                   -- another process took a lease that had not expired by the server's clock
                   -- (which judges leases as each statement runs: no margin): a live lease taken.
                   CASE WHEN OLD.lease_holder IS NOT NULL AND OLD.lease_holder <> NEW.lease_holder
                        AND OLD.lease_expires_at > clock_timestamp()
                        THEN 'live' END);
         END IF;
         RETURN NEW;
       END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER torture_claim AFTER UPDATE OF lease_fence ON django_jobruns_jobrun
       FOR EACH ROW EXECUTE FUNCTION torture_claim()""",
    # Every pass commit sets the cursor (even to the value it had), and nothing else does.
    """CREATE FUNCTION torture_commit() RETURNS trigger AS $$ BEGIN
         INSERT INTO torture_events (kind, run_id, fence, holder, cursor_old, cursor_new, status, counters, backend)
         VALUES ('commit', NEW.id, NEW.lease_fence, OLD.lease_holder, OLD.cursor, NEW.cursor, NEW.status,
                 NEW.counters, pg_backend_pid());
         RETURN NEW;
       END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER torture_commit AFTER UPDATE OF cursor ON django_jobruns_jobrun
       FOR EACH ROW EXECUTE FUNCTION torture_commit()""",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--passes", type=int, default=6, help="passes per run")
    parser.add_argument("--steps", type=int, default=4, help="steps per pass")
    parser.add_argument("--lease-ttl", type=float, default=2.0, help="seconds")
    parser.add_argument("--step-seconds", type=float, default=0.01, help="longest simulated upstream call")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="give up (and fail) after this long")
    parser.add_argument("--poison", type=int, default=0, help="runs whose every pass kills its worker")
    parser.add_argument("--poison-attempts", type=int, default=3, help="the poison job's max_attempts")
    parser.add_argument("--stalls", type=int, default=0, help="row-lock stalls past the lease")
    parser.add_argument("--stops", type=int, default=0, help="workers stopped (SIGSTOP) past their lease")
    parser.add_argument(
        "--skewed-workers", type=int, default=0, help="worker slots whose clock runs --skew-seconds fast (PostgreSQL)"
    )
    parser.add_argument("--skew-seconds", type=float, default=600.0)
    parser.add_argument(
        "--partitions", type=int, default=0, help="PostgreSQL: workers cut off (traffic dropped, sockets open)"
    )
    parser.add_argument(
        "--delays", type=int, default=0, help="PostgreSQL: workers whose clock reading is delayed on one leg"
    )
    parser.add_argument(
        "--terminations", type=int, default=0, help="PostgreSQL: a worker's connection ended by the server"
    )
    parser.add_argument(
        "--allow-skew-on-sqlite",
        action="store_true",
        help="skewed workers on SQLite, whose one clock is the host's: shows the harness catching live leases taken",
    )
    args = parser.parse_args()
    for name in ("workers", "runs", "passes", "steps", "poison_attempts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("kills", "poison", "stalls", "stops", "skewed_workers", "partitions", "delays", "terminations"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if (args.partitions or args.delays or args.terminations) and args.db != "postgres":
        parser.error("--partitions, --delays and --terminations need PostgreSQL")
    if args.skewed_workers > args.workers:
        parser.error("--skewed-workers cannot exceed --workers")
    if args.skewed_workers and args.db == "sqlite" and not args.allow_skew_on_sqlite:
        parser.error(
            "--skewed-workers needs PostgreSQL: SQLite's one clock is the host's "
            "(--allow-skew-on-sqlite to watch the harness catch what that costs)"
        )
    return args


def prepare_database(db: str, folder: Path) -> str:
    if db == "sqlite":
        return f"sqlite:///{folder / 'torture.sqlite3'}"
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {POSTGRES_DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {POSTGRES_DB}")
    return f"postgres://postgres@127.0.0.1:5432/{POSTGRES_DB}"


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.folder = Path(tempfile.mkdtemp(prefix="jobruns-torture-"))
        self.kills_dir = self.folder / "kills"
        self.url = prepare_database(args.db, self.folder)
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "BENCH_SQLITE_MODE": "wal",
            "DATABASE_URL": self.url,
            "JOBRUNS_VAR_DIR": str(self.folder),
            "PYTHONPATH": str(ROOT),
            "TORTURE_STEP_SECONDS": str(args.step_seconds),
            "TORTURE_POISON_ATTEMPTS": str(args.poison_attempts),
        }
        self.workers: list[tuple[subprocess.Popen[bytes], float]] = []
        self.external_kills = 0
        self.spawned = 0
        self.skewed: set[subprocess.Popen[bytes]] = set()
        self.skewed_spawned = 0
        # Workers stopped with SIGSTOP, and when each is to be resumed.
        self.stopped: dict[subprocess.Popen[bytes], float] = {}
        self.stops = 0
        # The third connection holding a worked run's row, and until when.
        self.stall: tuple[Any, float] | None = None
        self.stalls = 0
        # The network faults: each PostgreSQL worker reaches the server through
        # a forwarder of the harness's own (tests/netfault.py).
        self.forwarders: dict[subprocess.Popen[bytes], Any] = {}
        self.partitioned: dict[Any, float] = {}
        self.partitions = self.delays = self.terminations = 0

    # -- set-up ----------------------------------------------------------------

    def setup(self) -> None:
        os.environ.update({k: v for k, v in self.env.items() if k != "TORTURE_DIR"})
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        with connection.cursor() as cur:
            for statement in SQLITE_DDL if connection.vendor == "sqlite" else POSTGRES_DDL:
                cur.execute(statement)
        from django_jobruns import start_job_run

        for n in range(self.args.runs):
            start_job_run(
                "torture.walk", instance=f"r{n}", payload={"passes": self.args.passes, "steps": self.args.steps}
            )
        for n in range(self.args.poison):
            start_job_run("torture.poison", instance=f"poison{n}")
        # A quarter of the kills each inside a step body, between an effect and
        # its memo, and in a commit; the rest sent from here at random moments.
        per_point = self.args.kills // 4
        for point in ("step", "effect", "commit"):
            (self.kills_dir / point).mkdir(parents=True)
            for i in range(per_point):
                (self.kills_dir / point / f"token-{i}").touch()
        self.external_budget = self.args.kills - 3 * per_point
        self.env["TORTURE_DIR"] = str(self.kills_dir)

    # -- the workers -----------------------------------------------------------

    def spawn(self) -> None:
        log = open(self.folder / f"worker-{self.spawned}.log", "wb")  # noqa: SIM115 (owned by the process)
        self.spawned += 1
        skewed = len(self.skewed) < self.args.skewed_workers
        env = {**self.env, "JOBRUNS_TEST_CLOCK_SKEW": str(self.args.skew_seconds)} if skewed else self.env
        forwarder = None
        if self.args.db == "postgres" and (self.args.partitions or self.args.delays or self.args.terminations):
            from tests.netfault import Forwarder, delay_clock_reading

            rule = None
            if self.delays < self.args.delays and self.rng.random() < 0.5:
                rule = delay_clock_reading(self.rng.choice(["up", "down"]), self.args.lease_ttl * 0.8)
                self.delays += 1
            forwarder = Forwarder("127.0.0.1", 5432, rule or (lambda leg, chunk: 0.0))
            env = {
                **env,
                "DATABASE_URL": f"postgres://postgres@127.0.0.1:{forwarder.port}/{POSTGRES_DB}",
                "TORTURE_EVENTS_URL": self.url,
                "PGAPPNAME": f"torture-{self.spawned}",
            }
        # Short drives of random size, as cron would run them: every new worker
        # reads the due runs afresh and contends for them with the others.
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "run_due_jobs",
                "--max-passes",
                str(self.rng.randint(1, self.args.passes)),
                "--limit",
                str(self.rng.randint(1, max(1, self.args.runs // 2))),
                "--lease-ttl",
                str(self.args.lease_ttl),
                "--json",
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        if forwarder is not None:
            self.forwarders[proc] = forwarder
        self.workers.append((proc, time.monotonic()))
        if skewed:
            self.skewed.add(proc)
            self.skewed_spawned += 1

    # -- stalls and stops ------------------------------------------------------

    def hold_past_lease(self) -> float:
        return self.args.lease_ttl * 1.5 + 0.2

    def start_stall(self) -> bool:
        """A third connection takes a worked run's row (or SQLite's write lock) and keeps it past the lease."""
        table = "django_jobruns_jobrun"
        if self.args.db == "postgres":
            import psycopg

            conn: Any = psycopg.connect(self.url.replace("postgres://", "postgresql://"))
            row = conn.execute(
                f"SELECT id FROM {table} WHERE status = 'running' AND lease_holder IS NOT NULL "
                "ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED"
            ).fetchone()
        else:
            import sqlite3

            # Briefly: a worker stopped inside its write transaction holds the lock
            # until this loop resumes it.
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0.5, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                conn.close()
                return False
            row = conn.execute(
                f"SELECT id FROM {table} WHERE status = 'running' AND lease_holder IS NOT NULL LIMIT 1"
            ).fetchone()
        if row is None:
            conn.rollback()
            conn.close()
            return False
        self.stall = (conn, time.monotonic() + self.hold_past_lease())
        self.stalls += 1
        return True

    def end_stall(self, *, force: bool = False) -> None:
        if self.stall is not None and (force or time.monotonic() >= self.stall[1]):
            self.stall[0].commit()
            self.stall[0].close()
            self.stall = None

    def partition_one(self) -> bool:
        """Cut a worker off: its forwarder drops all traffic both ways, sockets kept open, past the lease."""
        ready = [f for p, started in self.workers if (f := self.forwarders.get(p)) and f not in self.partitioned]
        if not ready:
            return False
        victim = self.rng.choice(ready)
        victim.partitioned.set()
        self.partitioned[victim] = time.monotonic() + self.hold_past_lease()
        self.partitions += 1
        return True

    def heal(self, *, every: bool = False) -> None:
        for forwarder, until in list(self.partitioned.items()):
            if every or time.monotonic() >= until:
                forwarder.partitioned.clear()
                del self.partitioned[forwarder]

    def terminate_one(self) -> bool:
        """The server ends one worker's connection, wherever its pass is."""
        from django.db import connection

        names = [f"torture-{n}" for n in range(self.spawned + 1)]
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ANY(%s) "
                "ORDER BY random() LIMIT 1",
                [names],
            )
            landed = cur.fetchone() is not None
        self.terminations += landed
        return landed

    def stop_one(self) -> bool:
        ready = [p for p, started in self.workers if p not in self.stopped and time.monotonic() - started > 0.3]
        if not ready:
            return False
        victim = self.rng.choice(ready)
        victim.send_signal(signal.SIGSTOP)
        self.stopped[victim] = time.monotonic() + self.hold_past_lease()
        self.stops += 1
        return True

    def resume_stopped(self, *, every: bool = False) -> None:
        for proc, until in list(self.stopped.items()):
            if every or time.monotonic() >= until:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                del self.stopped[proc]

    def self_kills(self) -> dict[str, int]:
        killed = self.kills_dir / "killed"
        by_point: dict[str, int] = defaultdict(int)
        for marker in killed.iterdir() if killed.exists() else []:
            by_point[marker.name.split("-")[0]] += 1
        return by_point

    def tokens_left(self) -> int:
        return sum(len(list((self.kills_dir / p).glob("token-*"))) for p in ("step", "effect", "commit"))

    def progress(self) -> float:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM torture_events WHERE kind = 'commit'")
            (commits,) = cur.fetchone()
        return commits / (self.args.runs * self.args.passes)

    def running(self) -> int:
        from django_jobruns.models import JobRun

        return JobRun.objects.filter(status="running").count()

    def drive(self) -> None:
        deadline = time.monotonic() + self.args.max_minutes * 60
        next_kill = time.monotonic() + self.rng.uniform(0.3, 1.2)
        next_stall = time.monotonic() + self.rng.uniform(0.3, 1.5)
        next_stop = time.monotonic() + self.rng.uniform(0.3, 1.5)
        next_partition = time.monotonic() + self.rng.uniform(0.3, 1.5)
        next_termination = time.monotonic() + self.rng.uniform(0.3, 1.5)
        hurry = False
        while True:
            if time.monotonic() > deadline:
                raise SystemExit(f"gave up after {self.args.max_minutes} minutes with {self.running()} runs running")
            self.workers = [(p, t) for p, t in self.workers if p.poll() is None]
            for proc in [p for p in self.forwarders if p.poll() is not None]:
                forwarder = self.forwarders.pop(proc)
                self.partitioned.pop(forwarder, None)
                forwarder.close()
            self.heal()
            self.skewed &= {p for p, _ in self.workers}
            self.end_stall()
            self.resume_stopped()
            if self.running() == 0:
                break
            # Tokens the workers have not drawn by the last stretch become kills
            # sent from here, so the planned number of kills does land.
            if self.tokens_left() and self.progress() > 0.5:
                for token in list(self.kills_dir.glob("*/token-*")):
                    token.unlink(missing_ok=True)
                    self.external_budget += 1
                hurry = True
            while len(self.workers) < self.args.workers:
                self.spawn()
            now = time.monotonic()
            if self.external_budget and now >= next_kill:
                ready = [p for p, started in self.workers if now - started > 0.3]
                if ready:
                    victim = self.rng.choice(ready)
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    self.external_kills += 1
                    self.external_budget -= 1
                next_kill = now + (self.rng.uniform(0.05, 0.25) if hurry else self.rng.uniform(0.1, 0.8))
            if self.stalls < self.args.stalls and self.stall is None and now >= next_stall:
                landed = self.start_stall()
                next_stall = now + (self.rng.uniform(0.2, 1.0) if landed else 0.1)
            if self.stops < self.args.stops and now >= next_stop:
                landed = self.stop_one()
                next_stop = now + (self.rng.uniform(0.2, 1.0) if landed else 0.1)
            if self.partitions < self.args.partitions and now >= next_partition:
                landed = self.partition_one()
                next_partition = now + (self.rng.uniform(0.3, 1.5) if landed else 0.1)
            if self.terminations < self.args.terminations and now >= next_termination:
                landed = self.terminate_one()
                next_termination = now + (self.rng.uniform(0.1, 0.6) if landed else 0.1)
            time.sleep(0.05)
        self.end_stall(force=True)
        self.resume_stopped(every=True)
        self.heal(every=True)
        for proc, _ in self.workers:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in self.workers:
            proc.wait(timeout=60)

    # -- the verdict -----------------------------------------------------------

    def verdict(self) -> dict[str, object]:
        from django.db import connection

        from django_jobruns.models import JobRun

        with connection.cursor() as cur:
            cur.execute(
                "SELECT id, kind, run_id, step, fence, cursor_old, cursor_new, pid, backend, note "
                "FROM torture_events ORDER BY id"
            )
            events = cur.fetchall()
        poison = {run.id: run for run in JobRun.objects.filter(job="poison", module="torture")}
        poison_bodies: dict[str, int] = defaultdict(int)
        live_taken = lapsed_steps = 0
        effects: dict[tuple[str, str], list[int]] = defaultdict(list)
        memos: dict[tuple[str, str], int] = {}
        latest_claim: dict[str, int] = {}
        last_cursor: dict[str, int] = {}
        overlapping = regressions = 0
        # Who committed: on SQLite the worker's commit hook says so inside the
        # commit's transaction; on PostgreSQL the commit trigger records the
        # server process, which each pass's start recorded too.
        pass_started: dict[tuple[str, int], int] = {}
        committed: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        postgres = self.args.db == "postgres"
        for event_id, kind, run_id, step, fence, _cursor_old, cursor_new, pid, backend, note in events:
            if kind == "claim" and note == "live":
                live_taken += 1
            if kind == "effect" and note == "lapsed":
                lapsed_steps += 1
            if run_id in poison:
                if kind == "effect":
                    poison_bodies[run_id] += 1
                continue
            writer = backend if postgres else pid
            if kind == "pass":
                pass_started[(run_id, writer)] = event_id
            elif kind == "committed_by" or (kind == "commit" and postgres):
                start = pass_started.get((run_id, writer))
                if start is None:
                    overlapping += 1  # a commit no pass of that writer started
                else:
                    committed[run_id].append((start, event_id, writer))
            if kind == "effect":
                effects[(run_id, step)].append(event_id)
            elif kind == "memo":
                memos.setdefault((run_id, step), event_id)
            elif kind == "claim":
                latest_claim[run_id] = fence
            elif kind == "commit":
                # A commit under any fence but the latest claim's means a holder
                # that had been taken over still wrote: two holders overlapped.
                if fence != latest_claim.get(run_id):
                    overlapping += 1
                new = json.loads(cursor_new) if cursor_new is not None else -1
                if new < last_cursor.get(run_id, -1):
                    regressions += 1
                last_cursor[run_id] = new
        # The pass log: a committed pass spans from its start to its commit; two
        # by different processes must never overlap.
        for passes in committed.values():
            passes.sort()
            for (_, end, pid), (start, _, other) in zip(passes, passes[1:], strict=False):
                if start < end and pid != other:
                    overlapping += 1
        repeated = at_least_once = 0
        for key, ids in effects.items():
            memo = memos.get(key)
            for later in ids[1:]:
                if memo is not None and memo < later:
                    repeated += 1  # ran again after its memo had committed
                else:
                    at_least_once += 1  # died between its effect and its memo
        expected_steps = {(f"p{p}-s{s}") for p in range(self.args.passes) for s in range(self.args.steps)}
        runs = list(JobRun.objects.filter(job="walk", module="torture"))
        missing = sum(len(expected_steps - {step for (rid, step) in effects if rid == run.id}) for run in runs)
        exact = {"steps": self.args.passes * self.args.steps, "passes": self.args.passes}
        counters_exact = all(json.loads(r.counters) == exact and r.cursor == str(self.args.passes) for r in runs)
        # A poison run ends failed within its policy: its body ran at most once per
        # attempt, and the takeover that found the last attempt dead failed it.
        limit = self.args.poison_attempts
        poison_failed = sum(
            run.status == "failed"
            and run.attempts <= limit
            and "stopped reporting" in (run.last_error or "")
            and poison_bodies[run.id] <= limit
            for run in poison.values()
        )
        return {
            "poison_failed": poison_failed,
            "poison_bodies": sum(poison_bodies.values()),
            "live_leases_taken": live_taken,
            "steps_on_lapsed_lease": lapsed_steps,
            "partitions": self.partitions,
            "delays": self.delays,
            "terminations": self.terminations,
            "stalls": self.stalls,
            "stops": self.stops,
            "skewed_workers": self.skewed_spawned,
            "kills": self.external_kills + sum(self.self_kills().values()),
            "kills_by_point": {"external": self.external_kills, **self.self_kills()},
            "runs": self.args.runs,
            "done": sum(r.status == "done" for r in runs),
            "repeated_committed_steps": repeated,
            "overlapping_holders": overlapping,
            "cursor_regressions": regressions,
            "counters_exact": "yes" if counters_exact and missing == 0 else "no",
            "at_least_once_repeats": at_least_once,
            "missing_steps": missing,
            "workers_started": self.spawned,
        }

    def cleanup(self) -> None:
        from django.db import connections

        connections.close_all()
        if self.args.db == "postgres":
            import psycopg

            with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {POSTGRES_DB} WITH (FORCE)")


def main() -> int:
    args = parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    harness = Harness(args)
    started = time.monotonic()
    harness.setup()
    try:
        harness.drive()
        result = harness.verdict()
    finally:
        for proc, _ in harness.workers:
            if proc.poll() is None:
                proc.kill()
    print(
        f"db={args.db} seed={args.seed} workers={args.workers} passes={args.passes} steps={args.steps} "
        f"lease_ttl={args.lease_ttl}s workers_started={result['workers_started']} "
        f"kills_by_point={','.join(f'{k}:{v}' for k, v in result['kills_by_point'].items())} "
        f"missing_steps={result['missing_steps']} seconds={time.monotonic() - started:.0f} logs={harness.folder}"
    )
    ok = (
        result["done"] == args.runs
        and result["poison_failed"] == args.poison
        and result["live_leases_taken"] == 0
        and result["steps_on_lapsed_lease"] == 0
        and result["repeated_committed_steps"] == 0
        and result["overlapping_holders"] == 0
        and result["cursor_regressions"] == 0
        and result["counters_exact"] == "yes"
    )
    harness.cleanup()
    print(
        f"kills={result['kills']} runs={result['runs']} done={result['done']} "
        f"repeated_committed_steps={result['repeated_committed_steps']} "
        f"overlapping_holders={result['overlapping_holders']} cursor_regressions={result['cursor_regressions']} "
        f"counters_exact={result['counters_exact']} at_least_once_repeats={result['at_least_once_repeats']}"
        + (
            f" poison={args.poison} poison_failed_within_policy={result['poison_failed']}"
            f" poison_bodies={result['poison_bodies']}"
            if args.poison
            else ""
        )
        + f" stalls={result['stalls']} stops={result['stops']} skewed_workers={result['skewed_workers']}"
        f" live_leases_taken={result['live_leases_taken']}"
        f" partitions={result['partitions']} delays={result['delays']} terminations={result['terminations']}"
        f" steps_on_lapsed_lease={result['steps_on_lapsed_lease']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
