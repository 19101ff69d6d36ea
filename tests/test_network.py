"""The lease when the network lies (D12): statements delayed on one leg, through a TCP forwarder of the tests' own.

The delay falls on the engine's reading of the database's clock alone -- what a
connect or a busy pooler's queue does to the first statement of a connection --
so a drive that trusted that reading would be out by half the delay. Leases are
judged by the database's clock as each statement runs, and a holder counts its
lease from when it sent the statement that set it, so neither leg can matter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, connections

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.models import JobRun
from django_jobruns.store import sentinel
from tests.conftest import effect_lines, manage, wait_until
from tests.support.netfault import Forwarder, delay_clock_reading, forwarding
from tests.support.task_functions import END_OWN_CONNECTION

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite's clock is the host's: no network"),
]

LATER = {
    "postgresql": "clock_timestamp() + interval '1.5 seconds'",
    "mysql": "UTC_TIMESTAMP(6) + INTERVAL 1500000 MICROSECOND",
}


def database() -> tuple[str, int]:
    db = settings.DATABASES["default"]
    return db["HOST"] or "127.0.0.1", int(db["PORT"])


def through(port: int) -> dict[str, str]:
    """A worker's environment with its database reached through the forwarder on ``port``."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    user = f"{parts.username}@" if parts.username else ""
    return {"DATABASE_URL": urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))}


def wait_for_holder(run_id: str, holder: str, timeout: float = 60) -> None:
    """Until the database says ``holder`` holds the run."""
    deadline = time.monotonic() + timeout
    while JobRun.objects.filter(pk=run_id, lease_holder=holder).count() == 0:
        assert time.monotonic() < deadline, f"{holder} never claimed run {run_id}"
        time.sleep(0.05)


def test_a_drive_whose_clock_reading_is_delayed_on_the_way_there_takes_no_live_lease(effects):
    """A live holder keeps its lease 1.5 s ahead; the drive's clock reading waits 4 s on the way up."""
    run, _ = start_job_run("tests.walk", instance="held", payload={"log": str(effects), "steps": 1})
    table, vendor = JobRun._meta.db_table, connection.vendor
    stop = threading.Event()

    def live_holder() -> None:
        # Another worker, alive and renewing: its lease never has less than ~1.4 s left.
        from django.db import connections

        conn = connections.create_connection("default")
        try:
            while not stop.is_set():
                with conn.cursor() as cur:
                    cur.execute(
                        f"UPDATE {table} SET lease_holder = 'A', lease_expires_at = {LATER[vendor]} WHERE id = %s",
                        [run.id],
                    )
                stop.wait(0.1)
        finally:
            conn.close()

    holder = threading.Thread(target=live_holder)
    holder.start()
    try:
        host, port = settings.DATABASES["default"]["HOST"] or "127.0.0.1", int(settings.DATABASES["default"]["PORT"])
        with forwarding(host, port, delay_clock_reading("up", 4.0)) as forwarder:
            worker = manage(
                "run_due_jobs", "--holder", "B", "--json", "--max-seconds", "3", extra_env=through(forwarder.port)
            )
            out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert forwarder.held["up"] >= 1, "the clock reading was delayed"
    finally:
        stop.set()
        holder.join()
    report = json.loads(out)
    assert report["attempted"] == 0 and report["taken_over"] == 0, report
    assert effect_lines(effects) == [], "no step body ran under a second holder"
    assert JobRun.objects.get(pk=run.pk).lease_holder == "A"


def test_a_holder_whose_clock_reading_is_delayed_on_the_way_back_starts_no_step_on_a_lapsed_lease(effects):
    """The holder's clock reading comes back 4 s late; it thinks 8 s between steps; another drive waits to take over.

    The lease is 9 s: its statement bound (4.5 s) lets the late reading through rather than cutting it.
    """
    run, _ = start_job_run("tests.paced", instance="paced", payload={"log": str(effects), "think": 8.0})
    with forwarding(*database(), delay_clock_reading("down", 4.0)) as forwarder:
        holder = manage("run_due_jobs", "--holder", "A", "--lease-ttl", "9", extra_env=through(forwarder.port))
        wait_for_holder(run.id, "A")
        # B drives meanwhile, ready to take the run the moment its lease lapses by the database's clock.
        other = manage("run_due_jobs", "--holder", "B", "--max-seconds", "60", "--lease-ttl", "9")
        out, err = holder.communicate(timeout=120)
    other.send_signal(signal.SIGTERM)
    other.communicate(timeout=120)
    assert holder.returncode == 0, err
    assert forwarder.held["down"] >= 1, "the clock reading was delayed"
    lines = [step for _, step in effect_lines(effects)]
    started_c = [step for step in lines if step.startswith("c:")]
    assert started_c and all(step == "c:A:live" for step in started_c), lines


def drive_backend(marker: str) -> list[int]:
    """The server-side ids of the worker's connections, found by what the server says they are doing."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()", [marker]
            )
        else:
            cur.execute(
                "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID() "
                "AND command = 'Sleep'"
            )
        return [row[0] for row in cur.fetchall()]


def test_a_connection_lost_while_the_drive_waits_for_work_is_replaced_and_the_drive_goes_on(effects):
    """The server ends the waiting drive's connection; a run started afterwards is still driven, exit 0."""
    marker = "jobruns-waiting"
    worker = manage("run_due_jobs", "--max-seconds", "60", "--json", extra_env={"PGAPPNAME": marker})
    wait_until(lambda: drive_backend(marker), "the drive to connect and wait")
    victims = drive_backend(marker)
    with connection.cursor() as cur:
        for victim in victims:
            cur.execute("SELECT pg_terminate_backend(%s)" if connection.vendor == "postgresql" else "KILL %s", [victim])
    run, _ = start_job_run("tests.walk", instance="after-kill", payload={"log": str(effects), "steps": 1})
    try:
        wait_until(lambda: JobRun.objects.get(pk=run.pk).status == "done", "the run to be driven to the end")
    except AssertionError:
        worker.kill()
        raise AssertionError(worker.communicate()[1]) from None
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert json.loads(out)["completed"] == 1


def test_a_release_on_a_dropped_connection_is_made_on_a_new_one_and_never_charged(behaviour, clock):
    """Every pass committed; the connection drops under the release: the run is not charged for it."""
    stop = threading.Event()

    def handler(p):
        p.step("s", lambda: 1)
        stop.set()  # SIGTERM arrives while the pass runs: the drive releases after it
        return {"cursor": (p.cursor or 0) + 1}

    behaviour["dropped"] = handler
    run, _ = start_job_run("tests.scripted", instance="dropped")
    dropped: list[str] = []
    end_own_connection = END_OWN_CONNECTION[connection.vendor]

    def drop_the_connection_under_the_release(execute, sql, params, many, context):
        if stop.is_set() and not dropped and sql.startswith("UPDATE") and "lease_holder" in sql and "cursor" not in sql:
            dropped.append(sql)
            execute(end_own_connection, None, False, context)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(drop_the_connection_under_the_release):
        report = run_due_jobs(now=clock, max_passes=3, stop=stop)
    assert dropped, "the release's connection was dropped"
    assert report.advanced == 1 and report.unreleased == 0, report
    assert JobRun.objects.get(pk=run.pk).lease_holder is None, "released on a new connection"
    clock.advance(minutes=10)
    run_due_jobs(now=clock)
    run.refresh_from_db()
    assert (run.attempts, run.last_error, run.cursor) == (0, None, "2")


def drive_through(forwarder: Forwarder, budget: int, lease: int, **env: str) -> subprocess.Popen:
    """A worker driving for ``budget`` seconds with leases of ``lease``, its database reached through ``forwarder``."""
    return manage(
        "run_due_jobs",
        "--max-seconds",
        str(budget),
        "--lease-ttl",
        str(lease),
        extra_env={**through(forwarder.port), **env},
    )


def said_once_ended(worker: subprocess.Popen, timeout: float, hung: str) -> str:
    """What ``worker`` said on stderr, once it ended; one still running after ``timeout`` seconds fails the test."""
    try:
        _, err = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.communicate()
        pytest.fail(f"the drive hung on a partition {hung}")
    return str(err)


@pytest.mark.parametrize("stop_with", ["budget", "SIGTERM"])
def test_a_partition_without_reset_ends_the_drive_within_its_budget_plus_one_lease(effects, stop_with):
    """Traffic stops both ways between a step's body and its record, sockets open: the drive still ends."""
    run, _ = start_job_run(
        "tests.paced", instance=f"partitioned-{stop_with}", payload={"log": str(effects), "think": 2, "probe": False}
    )
    budget, lease = (6, 5) if stop_with == "budget" else (600, 5)
    with forwarding(*database()) as forwarder:
        worker = drive_through(forwarder, budget, lease, PGAPPNAME="jobruns-partitioned")
        wait_until(lambda: [step for _, step in effect_lines(effects)] == ["a"], "step a to complete")
        forwarder.partitioned.set()  # the handler thinks for 2 s: its next statement is step c's
        started = time.monotonic()
        if stop_with == "SIGTERM":
            worker.send_signal(signal.SIGTERM)
        err = said_once_ended(worker, budget + lease + 30 if stop_with == "budget" else lease + 30, "between steps")
    took = time.monotonic() - started
    assert took < (budget if stop_with == "budget" else 0) + lease + 10, took
    # The connection cut under the waiting driver; or, where the driver waits holding the
    # interpreter's lock (mysqlclient), the process ended by the backstop.
    assert "outlasted its bound" in err or "outlasts twice its bound" in err or "Timeout (" in err, err
    # What could not be recorded is said as the database's error, not as one of the engine's own.
    assert "AttributeError" not in err, err
    # Nothing of the partitioned pass was charged: the run is taken again as after a kill.
    assert JobRun.objects.get(pk=run.pk).status == "running"


def test_a_drive_partitioned_from_its_first_statement_ends_within_its_budget_plus_one_lease():
    """The network is down as the drive starts (its connect and its first reading of the clock), sockets open."""
    budget, lease = 3, 5
    with forwarding(*database()) as forwarder:
        forwarder.partitioned.set()
        started = time.monotonic()
        worker = drive_through(forwarder, budget, lease)
        err = said_once_ended(worker, budget + lease + 30, "before its first statement")
        took = time.monotonic() - started
        assert forwarder.accepted_while_partitioned >= 1, "the drive did reach the partitioned link"
    # Process start-up (Django's set-up) is counted too: a few seconds of slack.
    assert took < budget + lease + 8, took
    said = ("cannot reach the database", "outlasted its bound", "Timeout (", "the due read failed", "could not LISTEN")
    assert any(words in err for words in said), err


@pytest.mark.skipif("connection.vendor != 'mysql'", reason="mysqlclient's connect")
def test_a_partition_as_the_driver_sets_a_connection_up_ends_the_drive_at_twice_its_bound(effects):
    """The network goes while mysqlclient sets a new connection up inside its connect (``SET autocommit``),
    sockets open: ``connect_timeout`` is over, and the driver has not yet returned the connection whose socket
    the watchdog would cut. The process is ended at twice the statement's bound, printing where it was."""
    start_job_run("tests.walk", instance="inside", payload={"log": str(effects), "steps": 1})
    budget, lease = 30, 5

    def rule(leg: str, chunk: bytes) -> float:
        if leg == "up" and b"SET autocommit" in chunk:
            forwarder.partitioned.set()  # this reaches the server; its answer never comes back
        return 0.0

    with forwarding(*database(), rule) as forwarder:
        started = time.monotonic()
        worker = drive_through(forwarder, budget, lease)
        err = said_once_ended(worker, budget + lease + 30, "as the driver set a connection up")
        took = time.monotonic() - started
        assert forwarder.partitioned.is_set(), "no connection was set up through the link"
    assert worker.returncode == sentinel.EXIT_STATUS, err
    assert "outlasted twice its bound" in err and "in autocommit" in err, err  # where each thread was
    assert took < lease + 8, took  # twice the bound (half a lease), a second, and the process's start-up


#: What Django sends as it sets a new connection up, before any statement of the engine's: PostgreSQL's
#: time zone (where the server's differs: ``PGTZ`` below sees to that), MariaDB's isolation level.
SETTING_UP = (b"set_config('TimeZone'", b"SET SESSION TRANSACTION")


def test_a_partition_as_a_connection_is_set_up_ends_the_drive_within_its_budget_plus_one_lease():
    """The network goes between a connect and Django's first statement on it, sockets open: the drive still ends."""
    budget, lease = 3, 5

    def rule(leg: str, chunk: bytes) -> float:
        if leg == "up" and any(words in chunk for words in SETTING_UP):
            forwarder.partitioned.set()  # this statement reaches the server; its answer never comes back
        return 0.0

    with forwarding(*database(), rule) as forwarder:
        started = time.monotonic()
        worker = drive_through(forwarder, budget, lease, PGTZ="Europe/Paris")
        err = said_once_ended(worker, budget + lease + 30, "as its connection was set up")
        took = time.monotonic() - started
        assert forwarder.partitioned.is_set(), "Django set no connection up through the link"
    assert took < budget + lease + 8, took
    # Cut by the watchdog: the statement waits with the interpreter's lock released, on either driver.
    assert "outlasted its bound" in err, err


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a drive LISTENs for work on PostgreSQL alone")
def test_a_drive_stopped_while_it_waits_for_work_on_a_partitioned_link_ends_within_a_lease():
    """The link goes as the drive begins to wait for work (its LISTEN answered), sockets open; then SIGTERM.

    The drive's UNLISTEN on its way out meets the partition: it is bounded as
    every statement of the drive's is.
    """
    lease = 5
    waiting = threading.Event()
    answers: list[bytes] = []

    def rule(leg: str, chunk: bytes) -> float:
        if leg == "down" and b"C\x00\x00\x00\x0bLISTEN\x00" in chunk:  # a LISTEN's answer, on its way
            answers.append(chunk)
            if len(answers) == 2:  # a wait's LISTEN, after the first one's check that a NOTIFY arrives
                waiting.set()
        return 0.0

    with forwarding(*database(), rule) as forwarder:
        worker = drive_through(forwarder, 600, lease)
        assert waiting.wait(30), "the drive never waited for work"
        forwarder.partitioned.set()  # nothing after the LISTEN's answer arrives
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        err = said_once_ended(worker, lease + 30, "as it stopped waiting for work")
    took = time.monotonic() - started
    assert took < lease + 5, (took, err)


def in_a_thread_through(forwarder: Forwarder, work: Callable[[Any], None], hung: str, **settings_dict: Any) -> None:
    """``work(wrapper)`` in a thread of its own whose connection reaches the database through ``forwarder``.

    ``settings_dict`` overrides the test database's settings. The test fails
    with ``hung`` if the thread has not ended within 30 s, and with what it
    raised if it raised.
    """
    wrapper_class = type(connections[connection.alias])
    ended = threading.Event()
    failures: list[BaseException] = []

    def target() -> None:
        link = {"HOST": "127.0.0.1", "PORT": forwarder.port, "OPTIONS": dict(connection.settings_dict["OPTIONS"])}
        wrapper = wrapper_class({**connection.settings_dict, **link, **settings_dict}, connection.alias)
        connections[connection.alias] = wrapper  # this thread's connection, through the link
        try:
            work(wrapper)
        except BaseException as exc:
            failures.append(exc)
        finally:
            ended.set()

    threading.Thread(target=target, daemon=True).start()
    assert ended.wait(30), hung
    assert not failures, failures


def test_a_connection_looked_at_after_an_error_while_the_link_is_down_is_given_up_within_the_bound():
    """After an error the engine asks the connection whether it still works (Django's ``SELECT 1``) before reusing it.

    With the link down, sockets open, that question is cut at the thread's
    bound and the connection given up, as any statement of the drive's is.
    """
    from django_jobruns import db
    from django_jobruns.store import watchdog

    with forwarding(*database()) as forwarder:

        def look(wrapper: Any) -> None:
            with wrapper.cursor() as cur, contextlib.suppress(DatabaseError):
                cur.execute("SELECT * FROM no_such_table")
            assert wrapper.errors_occurred
            forwarder.partitioned.set()
            with watchdog.bounding(1.0):
                db.replace_if_broken()
            assert wrapper.connection is None, "a connection that cannot answer was kept"

        in_a_thread_through(forwarder, look, "the look at the connection hung on the partition")


def test_a_connection_djangos_health_check_replaces_is_set_up_within_the_bound():
    """With ``CONN_HEALTH_CHECKS`` Django checks a connection kept for reuse and opens another for a dead one.

    The link goes down as that new connection is set up, sockets open: the
    guarded statement still ends within its bound.
    """
    from django_jobruns.store import watchdog

    next_set_up_cuts = threading.Event()

    def rule(leg: str, chunk: bytes) -> float:
        if next_set_up_cuts.is_set() and leg == "up" and any(words in chunk for words in SETTING_UP):
            forwarder.partitioned.set()
        return 0.0

    options = dict(connection.settings_dict["OPTIONS"])
    if connection.vendor == "postgresql":
        options["options"] = "-c TimeZone=Europe/Paris"  # Django then sets the zone on each new connection

    def reuse(wrapper: Any) -> None:
        wrapper.ensure_connection()
        for sock in list(forwarder.sockets):  # the connection dies while kept
            with contextlib.suppress(OSError):  # an end the other's shutdown already closed
                sock.shutdown(socket.SHUT_RDWR)
        wrapper.health_check_done = False  # as Django leaves a kept connection between requests
        next_set_up_cuts.set()
        with contextlib.suppress(DatabaseError), watchdog.bounding(1.0), watchdog.guarded(wrapper):
            with wrapper.cursor() as cur:
                cur.execute("SELECT 1")
        assert forwarder.partitioned.is_set(), "the dead connection was not replaced"

    with forwarding(*database(), rule) as forwarder:
        in_a_thread_through(
            forwarder, reuse, "the new connection's set-up hung", CONN_HEALTH_CHECKS=True, OPTIONS=options
        )


@pytest.mark.skipif("connection.vendor != 'mysql'", reason="a fenced write of two statements is MariaDB's and MySQL's")
def test_a_worker_stalled_between_the_statements_of_a_fenced_write_freezes_no_run(effects):
    """A holds the run's row lock between its heartbeat and its step record, and stops there (SIGSTOP)."""
    run, _ = start_job_run("tests.walk", instance="stalled", payload={"log": str(effects), "steps": 1})
    a = manage(
        "run_due_jobs", "--holder", "A", "--lease-ttl", "5", extra_env={"JOBRUNS_TEST_STOP_AFTER_HEARTBEAT": "1"}
    )
    try:
        wait_until(lambda: sentinel.state(a.pid) == "T", "A to stop between the two statements")
        started = time.monotonic()
        b = manage("run_due_jobs", "--holder", "B", "--lease-ttl", "5", "--max-seconds", "15", "--json")
        out, err = b.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        a.kill()
        a.communicate()
    assert b.returncode == 0, err
    report = json.loads(out)
    assert report["taken_over"] == 1 and report["completed"] == 1, (report, err)
    assert took < 15 + 5 + 10, took
    assert JobRun.objects.get(pk=run.pk).status == "done"


def test_a_host_whose_clock_runs_ten_days_fast_prunes_nothing_that_just_ended():
    """Starts, cancels and prunes date by the database's clock, not the host's."""
    run, _ = start_job_run("tests.walk", instance="just-ended", payload={"log": "/dev/null"})
    JobRun.objects.filter(pk=run.pk).update(status="done", live=None, ended_at=JobRun.objects.get(pk=run.pk).started_at)
    pruner = manage("prune_job_runs", "--older-than", "7", extra_env={"JOBRUNS_TEST_CLOCK_SKEW": str(10 * 86400)})
    out, err = pruner.communicate(timeout=60)
    assert pruner.returncode == 0, err
    assert JobRun.objects.filter(pk=run.pk).exists(), out
    starter = manage(
        "start_job_run", "tests.walk", "--instance", "fast-host", extra_env={"JOBRUNS_TEST_CLOCK_SKEW": str(10 * 86400)}
    )
    assert starter.wait(timeout=60) == 0
    started = JobRun.objects.get(instance="fast-host").started_at
    assert abs((started - JobRun.objects.get(pk=run.pk).started_at).total_seconds()) < 3600


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PgBouncer is PostgreSQL's")
@pytest.mark.skipif(
    "not __import__('tests.support.pgbouncer').support.pgbouncer.available() "
    "and not os.environ.get('JOBRUNS_REQUIRE_PGBOUNCER')",
    reason="needs Debian's pgbouncer",
)
def test_behind_pgbouncer_in_transaction_mode_the_drive_says_wake_ups_cannot_arrive_and_polls(effects):
    from tests.support.pgbouncer import pgbouncer

    name = settings.DATABASES["default"]["NAME"]
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        (since,) = cur.fetchone()
    with pgbouncer(*database(), name) as port:
        worker = manage(
            "run_due_jobs",
            "--max-seconds",
            "30",
            "--json",
            # OPTIONS without "prepare_threshold", as Django leaves it: the engine sees the pooler
            # and prepares nothing (a statement prepared in one server session and run in another fails).
            extra_env={**through(port), "JOBRUNS_TEST_PREPARE_THRESHOLD": ""},
        )
        wait_until(lambda: drive_backend("") is not None, "the drive to start")
        run, _ = start_job_run("tests.walk", instance="pooled", payload={"log": str(effects), "steps": 12})
        try:
            wait_until(
                lambda: JobRun.objects.get(pk=run.pk).status == "done", "the run to be driven through the pooler"
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "never reached its LISTEN" in err and "polling every 0.2 s" in err, err
    assert json.loads(out)["completed"] == 1


def probed(since) -> bool:
    """Whether a drive has sent its probe NOTIFY since ``since``, as the server says."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE %s AND query_start > %s",
            ["SELECT pg_notify(%probe:%", since],
        )
        return bool(cur.fetchone()[0])


def test_a_body_cut_off_from_its_renewals_that_never_returns_ends_its_worker_before_the_run_is_taken_over(
    tmp_path, effects
):
    """D17: a body well within its timeout that never looks at ``p.stopping``, its worker partitioned from the
    database (sockets open), so that no renewal lands: its process ends just before its lease lapses, and the
    drive that takes the run over never runs it beside that body. It ran on beside it."""
    fifo, rescued = tmp_path / "entered.fifo", tmp_path / "rescued.fifo"
    os.mkfifo(fifo)
    os.mkfifo(rescued)
    # No release: the holder's body waits for ever, as an upstream call with no timeout does.
    payload = {"log": str(effects), "fifo": str(fifo), "rescued": str(rescued), "marker": str(tmp_path / "m")}
    run, _ = start_job_run("tests.blocking", instance="cut-off", payload=payload)
    rescuer = None
    with forwarding(*database()) as forwarder:
        holder = manage("run_due_jobs", "--holder", "A", "--lease-ttl", "5", extra_env=through(forwarder.port))
        try:
            with open(fifo) as announced:
                assert int(announced.readline()) == holder.pid
            forwarder.partitioned.set()
            rescuer = manage("run_due_jobs", "--json", "--holder", "B", "--max-seconds", "60", "--lease-ttl", "5")
            with open(rescued) as announced:
                assert int(announced.readline()) == rescuer.pid
            ended = holder.poll()
        finally:
            holder.kill()
            _, said = holder.communicate(timeout=60)
            if rescuer is not None:
                rescuer.send_signal(signal.SIGTERM)
                out, err = rescuer.communicate(timeout=120)
    assert ended is not None, "the body whose lease lapsed still ran when the other drive's body began"
    assert ended == sentinel.EXIT_STATUS and "its lease" in said, (ended, said)
    assert rescuer.returncode == 0, err
    assert json.loads(out)["taken_over"] == 1
    assert [step for _, step in effect_lines(effects)].count("first") == 2
