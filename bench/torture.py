#!/usr/bin/env python
"""Crash-and-contention torture: kill real workers at random moments, check nothing was lost or doubled.

    python bench/torture.py --db {sqlite,postgres,mysql} --workers W --runs R --kills K [--seed S]
        [--poison P] [--stalls N] [--stops N] [--skewed-workers N]
        [--partitions N] [--holds N] [--delays N] [--terminations N] [--statement-terminations N]
        [--pgbouncer POOL] [--between-stalls N] [--long-steps N] [--hung N] [--concurrency N]

W ``manage.py run_due_jobs`` processes drive R runs of a job with several steps
per pass and several passes. K SIGKILLs land in all: some sent by this harness
at random moments, some taken by the workers themselves inside a step body,
between a step's effect and its memo, and in the middle of a pass's commit.
Killed workers are replaced and their leases left to lapse until every run is
done. The other faults production brings can be added: P poison runs whose
every pass kills its worker; N stalls in which a third connection holds a
worked run's row (PostgreSQL: ``FOR UPDATE``; SQLite: the write lock) past the
lease; N workers stopped (SIGSTOP) past their lease and then resumed; and
workers whose clock runs ten minutes fast (PostgreSQL). And the network's
faults, each worker reaching the database through a forwarder of the
harness's own (tests/support/netfault.py): partitions that drop all traffic or hold
it and deliver it late, sockets kept open; a clock reading delayed on one leg;
the server ending a worker's connection at each kind of statement in turn;
PgBouncer in transaction mode with its pool saturated; and on MariaDB workers
stopped between the two statements of a fenced write, the run's row locked.
And N runs whose step bodies each take two to three leases (``--long-steps``),
kept alive while they run and checking ``p.stopping``: no two bodies of one
run may overlap (counted from the bodies' own start and end rows). And N runs
whose step body never returns nor looks at ``p.stopping`` (``--hung``), with a
timeout of three leases: its worker must end before its run is taken over,
past its timeout or cut off from its renewals by a partition -- no beat of one
body after another body of its run began. With
``--concurrency N`` each worker drives with a random number of threads up to N
(a round's first runs claimed together, one for each thread).
Every worker is a drive with a budget (``--max-seconds``): how long each took
is checked against its budget plus one lease. The verdict comes from
independent evidence -- an event table the job's step bodies write to and
database triggers fill as memos, claims and commits land -- never from the
app's own bookkeeping. The last line is the summary;
the exit status is non-zero when an invariant fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
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
#: The shortest connect timeout libpq and mysqlclient honour (seconds).
CONNECT_FLOOR = 2.0
#: Seconds a step body may start after its lease check (the Python between the two).
BODY_SLACK = 0.05

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
       backend INTEGER, note TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp())""",
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


MYSQL_DDL = [
    """CREATE TABLE torture_events (id BIGINT AUTO_INCREMENT PRIMARY KEY, kind VARCHAR(20) NOT NULL,
       run_id VARCHAR(64), step VARCHAR(255), fence BIGINT, holder VARCHAR(255), cursor_old LONGTEXT,
       cursor_new LONGTEXT, status VARCHAR(20), counters LONGTEXT, pid INT, backend BIGINT, note VARCHAR(20),
       at DATETIME(6) DEFAULT (UTC_TIMESTAMP(6)))""",
    """CREATE TRIGGER torture_memo_insert AFTER INSERT ON django_jobruns_jobstep FOR EACH ROW BEGIN
         IF NEW.result IS NOT NULL THEN
           INSERT INTO torture_events (kind, run_id, step) VALUES ('memo', NEW.run_id, NEW.step);
         END IF;
       END""",
    """CREATE TRIGGER torture_memo_update AFTER UPDATE ON django_jobruns_jobstep FOR EACH ROW BEGIN
         IF NEW.result IS NOT NULL AND OLD.result IS NULL THEN
           INSERT INTO torture_events (kind, run_id, step) VALUES ('memo', NEW.run_id, NEW.step);
         END IF;
       END""",
    # No column triggers on MariaDB: a claim moves the fence; a pass commit of
    # the torture job always changes the counters (it counts its passes).
    """CREATE TRIGGER torture_run AFTER UPDATE ON django_jobruns_jobrun FOR EACH ROW BEGIN
         IF NEW.lease_fence <> OLD.lease_fence THEN
           INSERT INTO torture_events (kind, run_id, fence, holder, note)
           VALUES ('claim', NEW.id, NEW.lease_fence, NEW.lease_holder,
                   CASE WHEN OLD.lease_holder IS NOT NULL AND OLD.lease_holder <> NEW.lease_holder
                        AND OLD.lease_expires_at > UTC_TIMESTAMP(6) THEN 'live' END);
         END IF;
         IF NOT (NEW.counters <=> OLD.counters) THEN
           INSERT INTO torture_events (kind, run_id, fence, holder, cursor_old, cursor_new, status, counters, backend)
           VALUES ('commit', NEW.id, NEW.lease_fence, OLD.lease_holder, OLD.cursor, NEW.cursor, NEW.status,
                   NEW.counters, CONNECTION_ID());
         END IF;
       END""",
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "mysql"], required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--passes", type=int, default=6, help="passes per run")
    parser.add_argument("--steps", type=int, default=4, help="steps per pass")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="seconds (at least 5)")
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
        "--holds", type=int, default=0, help="workers whose traffic is held past the lease, then delivered"
    )
    parser.add_argument(
        "--statement-terminations",
        type=int,
        default=0,
        help="PostgreSQL: connections ended by the server at each kind of statement in turn",
    )
    parser.add_argument(
        "--pgbouncer", type=int, default=0, metavar="POOL", help="PostgreSQL: workers behind PgBouncer, pool POOL"
    )
    parser.add_argument(
        "--between-stalls",
        type=int,
        default=0,
        help="MariaDB: workers stopped between the two statements of a fenced write, past the lease",
    )
    parser.add_argument("--max-seconds", type=float, default=4.0, help="the longest budget a worker's drive gets")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="the most threads a worker drives with (each its own, from 1)"
    )
    parser.add_argument(
        "--long-steps", type=int, default=0, help="runs whose step bodies take 2-3 leases each (keep-alive)"
    )
    parser.add_argument(
        "--hung", type=int, default=0, help="runs whose step body never returns nor checks p.stopping (D17, D19)"
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
    if args.lease_ttl < 5:
        parser.error("--lease-ttl must be at least 5 (seconds): the shortest lease the workers accept")
    for name in ("workers", "runs", "passes", "steps", "poison_attempts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    faults = ("partitions", "holds", "delays", "terminations", "statement_terminations", "pgbouncer", "between_stalls")
    for name in ("kills", "poison", "stalls", "stops", "skewed_workers", *faults):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if (args.delays or args.terminations or args.statement_terminations or args.pgbouncer) and args.db != "postgres":
        parser.error("--delays, --terminations, --statement-terminations and --pgbouncer need PostgreSQL")
    if (args.partitions or args.holds) and args.db == "sqlite":
        parser.error("--partitions and --holds need a database server")
    if args.between_stalls and args.db != "mysql":
        parser.error("--between-stalls needs MariaDB (PostgreSQL writes each fenced change in one statement)")
    if args.pgbouncer and (args.partitions or args.holds or args.delays or args.statement_terminations):
        parser.error("--pgbouncer runs without the forwarder's faults")
    if args.db == "mysql" and (args.stalls or args.skewed_workers):
        parser.error("--stalls and --skewed-workers are not built for MariaDB")
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
    if db == "mysql":
        import MySQLdb

        admin = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
        try:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {POSTGRES_DB}")
            admin.cursor().execute(f"CREATE DATABASE {POSTGRES_DB} CHARACTER SET utf8mb4")
        finally:
            admin.close()
        return f"mysql://root@127.0.0.1:3306/{POSTGRES_DB}"
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
            "TORTURE_LEASE_TTL": str(args.lease_ttl),
            # A worker that outlives SIGTERM is ended with SIGABRT, which prints where it was.
            "PYTHONFAULTHANDLER": "1",
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
        # a forwarder of the harness's own (tests/support/netfault.py).
        self.forwarders: dict[subprocess.Popen[bytes], Any] = {}
        self.partitioned: dict[Any, float] = {}
        self.partitions = self.holds = self.delays = self.terminations = 0
        # Terminations aimed at each kind of statement in turn: the kind wanted
        # now, since when, and the workers whose statement of that kind is held.
        self.kinds = ["due", "claim", "step", "commit", "release", "renew", "ledger"]
        self.wanted = 0
        self.wanted_since = time.monotonic()
        self.pending_terminations: list[tuple[str, str]] = []
        self.terminations_by_statement: dict[str, int] = defaultdict(int)
        # MariaDB: workers stopped between the two statements of a fenced write.
        self.pending_between: list[tuple[dict[str, Any], str | None]] = []
        self.between_stalls = 0
        self.stalled_runs: list[tuple[str, Any]] = []  # (run id, the server's time as its holder stopped)
        # The stalled holders' sessions (MariaDB's thread ids), to look at
        # again once the lease has passed: is a transaction of theirs still open?
        self.to_probe: list[tuple[list[int], float]] = []
        self.probed = 0
        self.frozen = 0
        self.outlived_sigterm = 0
        self.second_signals = 0
        # Each worker stopped at some moment (its drive's length is not its own), by pid: when,
        # by this host's clock, [from, until (None while stopped)].
        self.stop_spans: dict[int, list[list[float | None]]] = defaultdict(list)
        # Each worker's budget and log, for the drives' lengths.
        self.budgets: dict[subprocess.Popen[bytes], tuple[float, Path]] = {}
        # (budget, the drive's own seconds, pid, log): a drive past its bound is printed with its log.
        self.finished: list[tuple[float, float | None, int, Path]] = []
        self.bouncer: Any = None
        self.bouncer_port = 0
        self.hogs_stop: Any = None
        self.hogs: list[Any] = []

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
            ddl = {"sqlite": SQLITE_DDL, "postgresql": POSTGRES_DDL, "mysql": MYSQL_DDL}[connection.vendor]
            for statement in ddl:
                cur.execute(statement)
        from django_jobruns import start_job_run

        for n in range(self.args.runs):
            start_job_run(
                "torture.walk", instance=f"r{n}", payload={"passes": self.args.passes, "steps": self.args.steps}
            )
        for n in range(self.args.poison):
            start_job_run("torture.poison", instance=f"poison{n}")
        for n in range(self.args.long_steps):
            start_job_run("torture.long_walk", instance=f"long{n}", payload={"passes": 2, "steps": 1})
        for n in range(self.args.hung):
            start_job_run("torture.hung", instance=f"hung{n}")
        # A quarter of the kills each inside a step body, between an effect and
        # its memo, and in a commit; the rest sent from here at random moments.
        per_point = self.args.kills // 4
        for point in ("step", "effect", "commit"):
            (self.kills_dir / point).mkdir(parents=True)
            for i in range(per_point):
                (self.kills_dir / point / f"token-{i}").touch()
        self.external_budget = self.args.kills - 3 * per_point
        self.env["TORTURE_DIR"] = str(self.kills_dir)
        if self.args.pgbouncer:
            self.start_pgbouncer()

    def start_pgbouncer(self) -> None:
        """PgBouncer in transaction mode before the server, its pool kept saturated by as many hogs."""
        import threading

        import psycopg

        from tests.support.pgbouncer import pgbouncer

        self.bouncer = pgbouncer("127.0.0.1", 5432, POSTGRES_DB, pool_size=self.args.pgbouncer)
        self.bouncer_port = self.bouncer.__enter__()
        self.hogs_stop = threading.Event()

        def hog() -> None:
            url = f"postgresql://postgres@127.0.0.1:{self.bouncer_port}/{POSTGRES_DB}"
            with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
                while not self.hogs_stop.is_set():
                    conn.execute("SELECT pg_sleep(0.2)")

        for _ in range(self.args.pgbouncer):
            thread = threading.Thread(target=hog, daemon=True)
            thread.start()
            self.hogs.append(thread)

    def stop_pgbouncer(self) -> None:
        if self.bouncer is not None:
            self.hogs_stop.set()
            for thread in self.hogs:
                thread.join(timeout=10)
            self.bouncer.__exit__(None, None, None)
            self.bouncer = None

    # -- the workers -----------------------------------------------------------

    def networked(self) -> bool:
        a = self.args
        return a.db != "sqlite" and bool(
            a.partitions or a.holds or a.delays or a.terminations or a.statement_terminations or a.between_stalls
        )

    def spawn(self) -> None:
        log_path = self.folder / f"worker-{self.spawned}.log"
        log = open(log_path, "wb")  # noqa: SIM115 (owned by the process)
        self.spawned += 1
        skewed = len(self.skewed) < self.args.skewed_workers
        env = {**self.env, "JOBRUNS_TEST_CLOCK_SKEW": str(self.args.skew_seconds)} if skewed else self.env
        forwarder = None
        slot: dict[str, Any] = {"name": f"torture-{self.spawned}", "proc": None}
        if self.networked():
            from tests.support.netfault import Forwarder, delay_clock_reading

            clock_rule = None
            if self.delays < self.args.delays and self.rng.random() < 0.5:
                clock_rule = delay_clock_reading(self.rng.choice(["up", "down"]), self.args.lease_ttl * 0.8)
                self.delays += 1

            def rule(leg: str, chunk: bytes, clock_rule: Any = clock_rule, slot: dict[str, Any] = slot) -> float:
                delay = clock_rule(leg, chunk) if clock_rule else 0.0
                return max(delay, self.watch(slot, chunk)) if leg == "up" else delay

            port = 5432 if self.args.db == "postgres" else 3306
            forwarder = Forwarder("127.0.0.1", port, rule)
            scheme = "postgres://postgres" if self.args.db == "postgres" else "mysql://root"
            env = {
                **env,
                "DATABASE_URL": f"{scheme}@127.0.0.1:{forwarder.port}/{POSTGRES_DB}",
                "TORTURE_EVENTS_URL": self.url,
                "PGAPPNAME": slot["name"],
            }
        elif self.args.pgbouncer:
            env = {
                **env,
                "DATABASE_URL": f"postgres://postgres@127.0.0.1:{self.bouncer_port}/{POSTGRES_DB}",
                "TORTURE_EVENTS_URL": self.url,
            }
        elif self.args.db == "mysql":
            env = {**env, "TORTURE_EVENTS_URL": self.url}
        budget = round(self.rng.uniform(1.0, self.args.max_seconds), 1)
        # Short drives of random size and budget, as cron would run them: every
        # new worker reads the due runs afresh and contends for them with the others.
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
                "--max-seconds",
                str(budget),
                "--json",
                *self.threads(),
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        slot["proc"] = proc
        self.budgets[proc] = (budget, log_path)
        if forwarder is not None:
            self.forwarders[proc] = forwarder
        self.workers.append((proc, time.monotonic()))
        if skewed:
            self.skewed.add(proc)
            self.skewed_spawned += 1

    def threads(self) -> list[str]:
        """A new worker's ``--concurrency``: a random number of threads up to ``--concurrency`` (none given: one)."""
        if self.args.concurrency <= 1:
            return []
        return ["--concurrency", str(self.rng.randint(1, self.args.concurrency))]

    def watch(self, slot: dict[str, Any], chunk: bytes) -> float:
        """Called by a worker's forwarder for each chunk going up: how long to hold it (a fault aimed at it)."""
        from tests.support.netfault import SECOND_OF_A_FENCED_WRITE, run_id_in, statement_kind

        if self.terminations_by_statement_total() + len(self.pending_terminations) < self.args.statement_terminations:
            kind = statement_kind(chunk)
            if kind is not None and kind == self.kinds[self.wanted] and not self.pending_terminations:
                # Held until the harness has ended this worker's connection.
                self.pending_terminations.append((slot["name"], kind))
                return 1.0
        if (
            self.between_stalls + len(self.pending_between) < self.args.between_stalls
            and not self.pending_between
            and SECOND_OF_A_FENCED_WRITE.search(chunk)
            and self.rng.random() < 0.3
        ):
            # The first statement locked the run's row; this one does not reach
            # the server until the worker, stopped meanwhile, is resumed.
            self.pending_between.append((slot, run_id_in(chunk)))
            return self.hold_past_lease() + 0.5
        return 0.0

    def terminations_by_statement_total(self) -> int:
        return sum(self.terminations_by_statement.values())

    def land_statement_terminations(self) -> None:
        """End the connection of each worker whose wanted statement is held; move on to the next kind."""
        from django.db import connection

        while self.pending_terminations:
            name, kind = self.pending_terminations[0]
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", [name]
                )
                landed = cur.fetchall()
            self.pending_terminations.pop(0)
            if landed:
                self.terminations_by_statement[kind] += 1
            self.wanted = (self.wanted + 1) % len(self.kinds)
            self.wanted_since = time.monotonic()
        if time.monotonic() - self.wanted_since > 3.0:
            # A kind no worker sent for a while (PostgreSQL reads the ledger with
            # the claim, say): the next one.
            self.terminations_by_statement.setdefault(self.kinds[self.wanted], 0)
            self.wanted = (self.wanted + 1) % len(self.kinds)
            self.wanted_since = time.monotonic()

    def land_between_stalls(self) -> None:
        """Stop each worker whose second statement of a fenced write is held; note its sessions."""
        from django.db import connection

        while self.pending_between:
            slot, run_id = self.pending_between.pop(0)
            proc = slot["proc"]
            if proc is None or proc.poll() is not None or proc in self.stopped:
                continue
            self.stop(proc)
            self.between_stalls += 1
            # The stopped worker's sessions reach the server from its
            # forwarder's upstream sockets (the process list is read live).
            forwarder = self.forwarders.get(proc)
            ports = [str(s.getsockname()[1]) for s in forwarder.sockets[1::2]] if forwarder else ["0"]
            marks = ", ".join(["%s"] * len(ports))
            with connection.cursor() as cur:
                cur.execute("SELECT UTC_TIMESTAMP(6)")
                (at,) = cur.fetchone()
                cur.execute(
                    f"SELECT ID FROM information_schema.PROCESSLIST WHERE SUBSTRING_INDEX(HOST, ':', -1) IN ({marks})",
                    ports,
                )
                sessions = [row[0] for row in cur.fetchall()]
            if run_id is not None:
                self.stalled_runs.append((run_id, at))
            if sessions:
                # Probed while the holder is still stopped and its statement held.
                self.to_probe.append((sessions, time.monotonic() + self.args.lease_ttl + 0.6))

    def probe_frozen(self, *, every: bool = False) -> None:
        """Once a lease has passed, the holder still stopped: is a transaction of its sessions still open?

        Asked of the stalled worker's own sessions, not of the run's row: by
        then another worker may hold that row for a moment of its own (a
        takeover's claim), or be stopped or cut off inside its own fenced write.
        InnoDB's transaction table is a cache refreshed when it was not read for
        0.1 s, so the due probes are read at once, and nothing else reads it.
        """
        from django.db import connection

        due = [entry for entry in self.to_probe if every or time.monotonic() >= entry[1]]
        if not due:
            return
        sessions = [session for entry in due for session in entry[0]]
        marks = ", ".join(["%s"] * len(sessions))
        with connection.cursor() as cur:
            cur.execute(
                "SELECT DISTINCT trx_mysql_thread_id FROM information_schema.INNODB_TRX "
                f"WHERE trx_mysql_thread_id IN ({marks})",
                sessions,
            )
            open_in = {row[0] for row in cur.fetchall()}
        for entry in due:
            self.to_probe.remove(entry)
            self.probed += 1
            if open_in & set(entry[0]):
                self.frozen += 1  # the stopped holder still has its transaction open, and its locks

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

    def partition_one(self, *, hold: bool = False) -> bool:
        """Cut a worker off past the lease, sockets kept open: its traffic dropped, or held and delivered late."""
        ready = [f for p, started in self.workers if (f := self.forwarders.get(p)) and f not in self.partitioned]
        if not ready:
            return False
        victim = self.rng.choice(ready)
        if hold:
            victim.hold()
            self.holds += 1
        else:
            victim.partitioned.set()
            self.partitions += 1
        self.partitioned[victim] = time.monotonic() + self.hold_past_lease()
        return True

    def heal(self, *, every: bool = False) -> None:
        for forwarder, until in list(self.partitioned.items()):
            if every or time.monotonic() >= until:
                forwarder.partitioned.clear()
                forwarder.deliver()
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
        self.stop(victim)
        self.stops += 1
        return True

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop ``proc`` (SIGSTOP) until past the lease, noting when by this host's clock."""
        self.stop_spans[proc.pid].append([time.time(), None])
        proc.send_signal(signal.SIGSTOP)
        self.stopped[proc] = time.monotonic() + self.hold_past_lease()

    def stop_began(self, pid: int, start: float, end: float) -> bool:
        """Whether the harness stopped worker ``pid`` at some moment from ``start`` to ``end`` (this host's clock)."""
        return any(start <= began <= end for began, _ in self.stop_spans.get(pid, []))

    def resume_stopped(self, *, every: bool = False) -> None:
        for proc, until in list(self.stopped.items()):
            if every or time.monotonic() >= until:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                del self.stopped[proc]
                self.stop_spans[proc.pid][-1][1] = time.time()

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
        next_hold = time.monotonic() + self.rng.uniform(0.3, 1.5)
        hurry = False
        while True:
            if time.monotonic() > deadline:
                raise SystemExit(f"gave up after {self.args.max_minutes} minutes with {self.running()} runs running")
            for proc, _ in self.workers:
                if proc.poll() is not None:
                    self.finish(proc)
            self.workers = [(p, t) for p, t in self.workers if p.poll() is None]
            if self.args.statement_terminations:
                self.land_statement_terminations()
            if self.args.between_stalls:
                self.land_between_stalls()
                self.probe_frozen()
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
            if self.holds < self.args.holds and now >= next_hold:
                landed = self.partition_one(hold=True)
                next_hold = now + (self.rng.uniform(0.3, 1.5) if landed else 0.1)
            if self.terminations < self.args.terminations and now >= next_termination:
                landed = self.terminate_one()
                next_termination = now + (self.rng.uniform(0.1, 0.6) if landed else 0.1)
            time.sleep(0.05)
        if self.args.between_stalls:
            # Every run has ended, so no stalled holder can still lock one.
            self.probe_frozen(every=True)
        self.end_stall(force=True)
        self.resume_stopped(every=True)
        self.heal(every=True)
        self.stop_pgbouncer()
        for proc, _ in self.workers:
            proc.send_signal(signal.SIGTERM)
        # SIGTERM ends a drive within one lease (its pass in flight may finish). A handler blocked
        # in a statement of its own on a partitioned connection (the torture job's event write)
        # is the job's, which the engine does not cut: the operator's second SIGTERM stops the
        # process at once, as documented; only a process that outlives that too is a failure.
        ends_by = time.monotonic() + self.args.lease_ttl + 5.0
        for proc, _ in self.workers:
            try:
                proc.wait(timeout=max(0.0, ends_by - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.second_signals += 1
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self.outlived_sigterm += 1
                    proc.send_signal(signal.SIGABRT)
                    proc.wait(timeout=60)
            self.finish(proc)

    def finish(self, proc: subprocess.Popen[bytes]) -> None:
        """A worker ended: how long its drive took by its own report (none if it was killed or stopped)."""
        if proc not in self.budgets:
            return
        budget, log = self.budgets.pop(proc)
        if proc.returncode != 0 or proc.pid in self.stop_spans:
            return
        seconds = None
        for line in reversed(log.read_text(errors="replace").splitlines()):
            if line.startswith("{"):
                seconds = json.loads(line).get("seconds")
                break
        self.finished.append((budget, seconds, proc.pid, log))

    # -- the verdict -----------------------------------------------------------

    def verdict(self) -> dict[str, object]:
        from django.db import connection

        from django_jobruns.models import JobRun

        with connection.cursor() as cur:
            cur.execute(
                "SELECT id, kind, run_id, step, fence, cursor_old, cursor_new, pid, backend, note, holder "
                "FROM torture_events ORDER BY id"
            )
            events = cur.fetchall()
        poison = {run.id: run for run in JobRun.objects.filter(job="poison", module="torture")}
        # The long steps' bodies, by run: (began, saw it should stop or ended, or None; pid),
        # by this host's clock, which every worker shares: a record's order is not enough,
        # as a body's end may be written after another body's start (a write waiting for
        # SQLite's lock) though the first body had stopped before the second began.
        bodies: dict[str, list[list[Any]]] = defaultdict(list)
        # The hung bodies' starts and beats, by run: (when, kind, pid), by this host's clock.
        hung: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
        stopped_pids = set(self.stop_spans)
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
        postgres = self.args.db in ("postgres", "mysql")  # the commit's writer is the server's connection
        for event_id, kind, run_id, step, fence, _cursor_old, cursor_new, pid, backend, note, holder in events:
            if kind == "claim" and note == "live":
                live_taken += 1
            if kind == "effect" and note == "lapsed":
                lapsed_steps += 1
            if kind == "body_start":
                bodies[run_id].append([float(note), None, pid])
                continue
            if kind in ("hung_start", "hung_beat"):
                hung[run_id].append((float(note), kind, pid))
                continue
            if kind == "body_end":
                for body in reversed(bodies[run_id]):
                    if body[2] == pid and body[1] is None:
                        body[1] = float(note)
                        break
                continue
            if run_id in poison:
                if kind == "effect":
                    poison_bodies[run_id] += 1
                continue
            # Behind PgBouncer a worker's transactions run on any server connection:
            # the lease's holder (the pass's process) names the writer instead.
            writer = holder if self.args.pgbouncer else backend if postgres else pid
            if kind == "pass":
                # A pass can begin before its thread's connection is open (its run was claimed for it
                # by the drive's own connection, a round's first runs together): its server connection
                # is then not known yet, and the pass names its process's holder, as its commit will.
                pass_started[(run_id, writer if writer is not None else ("holder", holder))] = event_id
            elif kind == "committed_by" or (kind == "commit" and postgres):
                start = pass_started.get((run_id, writer))
                if start is None and postgres:
                    start = pass_started.pop((run_id, ("holder", holder)), None)
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
        # Two bodies of one run that overlap in time: a live holder's run taken over.
        # A body with no end was killed (it ended then, unseen), so it ends at the
        # next body's start at the latest. A worker stopped with SIGSTOP was not live
        # while stopped: on SIGCONT its body sees p.stopping within one check.
        overlapping_bodies = 0
        for spans in bodies.values():
            spans.sort()
            for (_, end, pid), (later, _, other) in zip(spans, spans[1:], strict=False):
                if end is not None and later < end and pid != other and pid not in stopped_pids:
                    overlapping_bodies += 1
        # A hung body never ends by itself: its process ends (D17, D19). A beat of one after another
        # body of its run began (another process's) is two bodies at once, seen; the last beat
        # is before the end, so an overlap shorter than a beat's interval goes unseen, never
        # one that is not. A worker resumed after a stop beats once or twice before its
        # watchdog ends it: not counted, as for the long bodies.
        overlapping_hung = 0
        for seen in hung.values():
            # One body a process: the process ends with it.
            began = {pid: when for when, kind, pid in seen if kind == "hung_start"}
            for pid, start in began.items():
                if pid in stopped_pids:
                    continue
                last = max(when for when, _, beat_pid in seen if beat_pid == pid)
                overlapping_hung += any(start < other < last for by, other in began.items() if by != pid)
        # A body checks its lease as it starts (D11), so an effect on a lapsed lease is the
        # engine's fault -- unless the harness stopped its worker (SIGSTOP) after the body had
        # started and before the effect's write. A stop that began before the body started
        # excuses nothing: the body should have checked the lease on resuming. (The slack is the
        # few statements of Python between the check and the body's first line.)
        lapsed_while_stopped = 0
        if lapsed_steps:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT run_id, step, pid, cursor_old, at, holder, counters FROM torture_events "
                    "WHERE kind = 'effect' AND note = 'lapsed' ORDER BY id"
                )
                for run_id, step, pid, entered, at, holder, expiry in cur.fetchall():
                    written = (at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp()
                    if self.stop_began(pid, float(entered) - BODY_SLACK, written):
                        lapsed_while_stopped += 1
                        continue
                    print(
                        f"lapsed effect: run {run_id} step {step} by pid {pid}, its body started at "
                        f"{float(entered):.3f} and wrote at {written:.3f}; the lease then {holder}'s until "
                        f"{expiry}; that worker's stops: {self.stop_spans.get(pid, [])}",
                        flush=True,
                    )
            lapsed_steps -= lapsed_while_stopped
        long_runs = list(JobRun.objects.filter(job="long_walk", module="torture"))
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
        # A poison run ends failed within its policy: its body ran at most as often as
        # the policy allows, it was not failed early, and the takeover that found the
        # last attempt dead failed it. Its charged attempts may exceed the policy: a
        # claimer the harness killed or stalled between its claim and its write is a
        # silent pass too, and charged as one (D10), without running the body.
        limit = self.args.poison_attempts
        poison_failed = sum(
            run.status == "failed"
            and run.attempts >= limit
            and "stopped reporting" in (run.last_error or "")
            and poison_bodies[run.id] <= limit
            for run in poison.values()
        )
        # Every drive ends by its budget plus one lease (the last pass it began
        # may run to its lease's end), whatever the network did.
        # On a database server only: on SQLite a drive waits out a write lock held by another
        # connection (the harness's stalls) for as long as its busy timeout, by design. The
        # drivers wait at least 2 s for a connect (libpq, mysqlclient): where half a lease is
        # less, a reconnect in the drive's last moment may take that much longer.
        measured = [
            (seconds - budget, budget, seconds, pid, log)
            for budget, seconds, pid, log in self.finished
            if seconds is not None and self.args.db != "sqlite"
        ]
        over = [excess for excess, *_ in measured]
        allowance = self.args.lease_ttl + max(0.0, CONNECT_FLOOR - self.args.lease_ttl / 2)
        if self.args.long_steps:
            allowance += 1.0  # a long body sees the budget spent (p.stopping) within a check, and fails its step
        past = [drive for drive in measured if drive[0] > allowance]
        for excess, budget, seconds, pid, log in past:
            print(
                f"drive past its budget plus a lease: pid {pid}, budget {budget} s, took {seconds} s "
                f"({excess:.2f} s past, {allowance:.2f} allowed); its log: {log}",
                flush=True,
            )
        # A run whose holder stopped between two statements (its row locked) is
        # free to take once its lease and the statement bound (lease / 2) have
        # passed (probed while the holder is still stopped); how long until
        # another worker took it is reported beside.
        waits = []
        with connection.cursor() as cur:
            for run_id, stopped_at in self.stalled_runs:
                cur.execute(
                    "SELECT MIN(at) FROM torture_events WHERE kind = 'claim' AND run_id = %s AND at > %s",
                    [run_id, stopped_at],
                )
                (taken,) = cur.fetchone()
                waits.append((taken - stopped_at).total_seconds() if taken is not None else float("inf"))
        frozen = self.frozen
        # A pass given up past its timeout (D19), by the workers' own warnings: a body blocked
        # for good on a statement of its own (a partition dropped its answer).
        timed_out = sum(log.read_bytes().count(b"ran past its timeout") for log in self.folder.glob("worker-*.log"))
        return {
            "timed_out_passes": timed_out,
            "drives_measured": len(over),
            "drives_past_budget_plus_lease": len(past),
            "longest_drive_past_budget": round(max(over, default=0.0), 2),
            "between_stalls": self.between_stalls,
            "frozen_runs": frozen,
            "stalled_holders_probed": self.probed,
            "longest_takeover_after_stall": round(max(waits, default=0.0), 2),
            "holds": self.holds,
            "outlived_sigterm": self.outlived_sigterm,
            "second_sigterms": self.second_signals,
            "terminations_by_statement": dict(self.terminations_by_statement),
            "poison_failed": poison_failed,
            "poison_bodies": sum(poison_bodies.values()),
            "live_leases_taken": live_taken,
            "steps_on_lapsed_lease": lapsed_steps,
            "lapsed_after_a_stop": lapsed_while_stopped,
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
            "long_done": sum(r.status == "done" for r in long_runs),
            "long_bodies": sum(len(spans) for spans in bodies.values()),
            "overlapping_live_bodies": overlapping_bodies,
            "hung_failed": sum(r.status == "failed" for r in JobRun.objects.filter(job="hung", module="torture")),
            "hung_bodies": sum(kind == "hung_start" for seen in hung.values() for _, kind, _ in seen),
            "overlapping_hung_bodies": overlapping_hung,
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
        self.stop_pgbouncer()
        if self.args.db == "postgres":
            import psycopg

            with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {POSTGRES_DB} WITH (FORCE)")
        elif self.args.db == "mysql":
            import MySQLdb

            admin = MySQLdb.connect(host="127.0.0.1", port=3306, user="root")
            try:
                admin.cursor().execute(f"DROP DATABASE IF EXISTS {POSTGRES_DB}")
            finally:
                admin.close()


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
        and result["overlapping_live_bodies"] == 0
        and result["long_done"] == args.long_steps
        and result["hung_failed"] == args.hung
        and result["overlapping_hung_bodies"] == 0
        and result["cursor_regressions"] == 0
        and result["counters_exact"] == "yes"
        and result["drives_past_budget_plus_lease"] == 0
        and result["frozen_runs"] == 0
        and result["outlived_sigterm"] == 0
        and (not args.between_stalls or result["between_stalls"] > 0)
        and result["stalled_holders_probed"] == result["between_stalls"]
        and (not args.statement_terminations or sum(result["terminations_by_statement"].values()) > 0)
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
        f" lapsed_after_a_stop={result['lapsed_after_a_stop']}"
        f" holds={result['holds']} outlived_sigterm={result['outlived_sigterm']}"
        f" second_sigterms={result['second_sigterms']}"
        f" terminations_by_statement={','.join(f'{k}:{v}' for k, v in result['terminations_by_statement'].items())}"
        f" between_stalls={result['between_stalls']} frozen_runs={result['frozen_runs']}"
        f" stalled_holders_probed={result['stalled_holders_probed']}"
        f" longest_takeover_after_stall={result['longest_takeover_after_stall']}s"
        + (
            f" long_steps={args.long_steps} long_done={result['long_done']} long_bodies={result['long_bodies']}"
            f" overlapping_live_bodies={result['overlapping_live_bodies']}"
            if args.long_steps
            else ""
        )
        + (
            f" hung={args.hung} hung_failed={result['hung_failed']} hung_bodies={result['hung_bodies']}"
            f" overlapping_hung_bodies={result['overlapping_hung_bodies']}"
            if args.hung
            else ""
        )
        + f" timed_out_passes={result['timed_out_passes']}"
        f" drives={result['drives_measured']} drives_past_budget_plus_lease={result['drives_past_budget_plus_lease']}"
        f" longest_drive_past_budget={result['longest_drive_past_budget']}s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
