"""The torture job: several passes of several steps, each step leaving an effect row."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from datetime import timedelta
from typing import Any

from django.db import connection

from django_jobruns import RetryPolicy, job

from .kills import CURRENT, maybe_die

#: Each thread's own connection for its events, where they go around the engine's (a driver's
#: connection is one thread's at a time: the threads of a drive with --concurrency each write theirs).
_direct = threading.local()

#: The harness's lease (``--lease-ttl``).
LEASE = float(os.environ.get("TORTURE_LEASE_TTL", "5"))
#: Each job's ``timeout`` (D19): well past its longest pass (a long body's three leases, a stop of
#: one and a half). A body blocked for good -- a job's statement on the drive's connection whose
#: answer a partition dropped, which nothing bounds (the torture job's own events go around it) --
#: is kept alive until then and then given up: its worker ends when a quarter of the lease is left,
#: and its run is taken over when the lease lapses, as in production. With the default hour, a run
#: whose holder's keep-alive got through again after the partition stayed held past the harness's
#: patience.
TIMEOUT = timedelta(seconds=8 * LEASE)


def _event(
    kind: str, run_id: str, step: str | None = None, note: str | None = None, *, entered: str | None = None
) -> None:
    # Autocommit, outside the app's transactions: durable the moment it
    # happens, whatever becomes of the step's memo or the pass. On PostgreSQL
    # the server process is recorded too: the commit trigger names it.
    from django_jobruns.holders import default_holder

    events_url = os.environ.get("TORTURE_EVENTS_URL")
    if events_url:
        # A worker behind a faulty network: its events go straight to the server. A statement of
        # the job's on its partitioned connection would wait, unbounded by the engine, until the
        # network healed (the drive then measured past its budget for the job's wait), and an
        # effect says whether this process's lease was live by the server's clock as the body
        # started -- a step on a lapsed lease is the fault.
        if getattr(_direct, "connection", None) is None:
            _direct.connection = _connect_direct(events_url)
        cur = _direct.connection.cursor()
        if kind == "effect":
            mysql = events_url.startswith("mysql://")
            now, text = ("UTC_TIMESTAMP(6)", "CHAR") if mysql else ("clock_timestamp()", "TEXT")
            # With the lease's holder and expiry as they stood, for the harness to say what a lapse was.
            cur.execute(
                "INSERT INTO torture_events (kind, run_id, step, pid, cursor_old, holder, counters, note) "
                f"SELECT %s, %s, %s, %s, %s, r.lease_holder, CAST(r.lease_expires_at AS {text}), "
                f"CASE WHEN r.lease_holder = %s AND r.lease_expires_at > {now} THEN NULL ELSE 'lapsed' END "
                "FROM django_jobruns_jobrun r WHERE r.id = %s",
                [kind, run_id, step, os.getpid(), entered or _now(), default_holder(), run_id],
            )
        else:
            # A pass's start names the worker's server connection, as the commit trigger does, from
            # what the client knows of it: asking that connection would wait on the partition.
            cur.execute(
                "INSERT INTO torture_events (kind, run_id, step, pid, backend, holder, note) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [kind, run_id, step, os.getpid(), _backend(), default_holder(), note],
            )
        cur.close()
        return
    with connection.cursor() as cur:  # the cursor opens the connection that _backend() names
        cur.execute(
            "INSERT INTO torture_events (kind, run_id, step, pid, backend, holder, note) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [kind, run_id, step, os.getpid(), _backend(), default_holder(), note],
        )


def _backend() -> int | None:
    """The server connection of this worker's Django connection (PostgreSQL's pid, MariaDB's id), asked of none."""
    raw = connection.connection
    if raw is None:
        return None
    if connection.vendor == "postgresql":
        return int(raw.info.backend_pid)
    if connection.vendor == "mysql":
        return int(raw.thread_id())
    return None


def _now() -> str:
    """This host's clock, which every worker shares: when a body began or saw it should stop.

    A body's end is when its loop saw ``p.stopping``, not when its record was
    written: on SQLite that write may wait behind a stopped worker's write lock
    while another worker takes the lapsed lease and starts its own body.
    """
    return f"{time.time():.6f}"


def _connect_direct(url: str) -> Any:
    from urllib.parse import urlsplit

    if url.startswith("mysql://"):
        import MySQLdb

        parts = urlsplit(url)
        conn = MySQLdb.connect(
            host=parts.hostname, port=parts.port or 3306, user=parts.username, database=parts.path.lstrip("/")
        )
        conn.autocommit(True)
        return conn
    import psycopg

    # Its own name: the harness ends the workers' connections by theirs, not this witness's.
    return psycopg.connect(url, autocommit=True, application_name="torture-effects")


@job(retry=RetryPolicy(max_attempts=1000, base_delay=0, jitter=0), timeout=TIMEOUT)
def walk(p: Any) -> dict[str, Any]:
    position = p.cursor or 0
    steps = p.payload["steps"]
    CURRENT["run"] = p.run.id
    _event("pass", p.run.id)
    for index in range(steps):
        name = f"p{position}-s{index}"

        def body(name: str = name) -> str:
            entered = _now()  # when the body started, by this host's clock (its lease checked just before)
            maybe_die("step")
            _event("effect", p.run.id, name, entered=entered)
            time.sleep(random.uniform(0, float(os.environ.get("TORTURE_STEP_SECONDS", "0.01"))))  # the upstream call
            maybe_die("effect")
            return name

        p.step(name, body)
    p.count("steps", steps)
    p.count("passes")
    following = position + 1
    return {"cursor": following, "done": following >= p.payload["passes"]}


class StoppedEarly(Exception):
    """A long step's body asked to stop (``p.stopping``) before its work was done."""


@job(retry=RetryPolicy(max_attempts=1000, base_delay=0, jitter=0), timeout=TIMEOUT)
def long_walk(p: Any) -> dict[str, Any]:
    """Steps whose bodies run 2-3 leases, checking ``p.stopping`` as a long loop would (D17, D18).

    Each body's start and end are events of their own, in the order the
    database received them: two bodies of one run must never overlap.
    """
    position = p.cursor or 0
    steps = p.payload["steps"]
    CURRENT["run"] = p.run.id
    _event("pass", p.run.id)
    for index in range(steps):
        name = f"long-p{position}-s{index}"

        def body(name: str = name) -> str:
            entered = _now()  # when the body started, by this host's clock (its lease checked just before)
            maybe_die("step")
            _event("effect", p.run.id, name, entered=entered)
            _event("body_start", p.run.id, name, _now())
            until = time.monotonic() + random.uniform(2.0, 3.0) * LEASE  # the slow upstream call
            while time.monotonic() < until:
                if p.stopping:
                    _event("body_end", p.run.id, name, _now())
                    raise StoppedEarly(f"{name} stopped early")
                time.sleep(0.05)
            _event("body_end", p.run.id, name, _now())
            maybe_die("effect")
            return name

        p.step(name, body)
    following = position + 1
    return {"cursor": following, "done": following >= p.payload["passes"]}


#: How many attempts a hung run gets, and how long its pass may run (D19): three leases, so that a hung
#: worker cut off from its renewals (a partition) meets its lease's lapse before its timeout (D17).
HUNG_ATTEMPTS = 2
HUNG_TIMEOUT = timedelta(seconds=3 * LEASE)


@job(retry=RetryPolicy(max_attempts=HUNG_ATTEMPTS, base_delay=0, jitter=0), timeout=HUNG_TIMEOUT)
def hung(p: Any) -> dict[str, Any]:
    """A body that never returns and never looks at ``p.stopping`` (a request with no timeout) (D17, D19).

    It says it still runs every tenth of a second, by this host's clock: a
    beat of one body after another body of its run began is two at once.
    Its worker ends before the lease lapses, past the pass's timeout or cut
    off from its renewals; the run is taken over, charged, and fails once its
    attempts are spent.
    """

    def body() -> None:
        _event("hung_start", p.run.id, "hang", _now())
        while True:
            _event("hung_beat", p.run.id, "hang", _now())
            time.sleep(0.1)

    p.step("hang", body)
    return {"done": True}


#: How many attempts a poison run gets: every one of its passes kills its worker.
POISON_ATTEMPTS = int(os.environ.get("TORTURE_POISON_ATTEMPTS", "3"))


@job(retry=RetryPolicy(max_attempts=POISON_ATTEMPTS, base_delay=0, jitter=0))
def poison(p: Any) -> dict[str, Any]:
    """A run that kills its worker on every pass (an out-of-memory kill, a segfault)."""

    def body() -> None:
        _event("effect", p.run.id, "die")
        os.kill(os.getpid(), signal.SIGKILL)

    p.step("die", body)
    return {"done": True}
