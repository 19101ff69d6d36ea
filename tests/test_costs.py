"""Cost pinned: statements per pass, memoized steps, the due read on its index (D9)."""

from __future__ import annotations

import contextlib
from typing import Any
from unittest import mock

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.drive import drive_run
from django_jobruns.store.postgresql import reaches_the_server_directly
from tests.support.factories import finished_runs
from tests.support.pgbouncer import available as pgbouncer_available

pytestmark = pytest.mark.django_db

_TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
#: MariaDB's session bounds: once per connection of a drive, not per pass (pinned below).
_PER_CONNECTION = ("SET SESSION",)


def statements(ctx):
    skipped = _TRANSACTION_CONTROL + _PER_CONNECTION
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].upper().startswith(skipped)]


def test_a_drives_session_is_set_up_once_per_connection(behaviour, clock):
    behaviour["session"] = lambda p: {"cursor": 1}
    sets = []
    for instance in ("first", "second"):
        start_job_run("tests.scripted", instance=f"session-{instance}")
        with CaptureQueriesContext(connection) as ctx:
            run_due_jobs(now=clock)
        sets.append([q["sql"] for q in ctx.captured_queries if q["sql"].upper().startswith(_PER_CONNECTION)])
    assert sets[1] == [], "the second drive on the connection sets nothing"
    assert len(sets[0]) <= 1 and (connection.vendor == "mysql") >= bool(sets[0])


@pytest.mark.parametrize("k", [1, 3, 10])
def test_one_pass_of_k_fresh_steps_costs_at_most_2k_plus_6_statements(behaviour, clock, k):
    def handler(p):
        for i in range(k):
            p.step(f"s{i}", lambda i=i: i)
        p.count("steps", k)
        return {"cursor": 1}

    behaviour["cost"] = handler
    start_job_run("tests.scripted", instance="cost")
    with CaptureQueriesContext(connection) as ctx:
        report = run_due_jobs(now=clock)
    assert report.advanced == 1
    sql = statements(ctx)
    assert len(sql) <= 2 * k + 6, "\n".join(sql)
    # As built: the due read, the claim, the ledger read (joined to the claim on
    # PostgreSQL), each step as a fence check and a record (one statement on
    # PostgreSQL), and the commit with the ledger's drop (one on PostgreSQL).
    # (MariaDB/MySQL: no UPDATE ... RETURNING, so the claim's re-read is its own read.)
    expected = {"postgresql": k + 3, "sqlite": 2 * k + 5}.get(connection.vendor, 2 * k + 6)
    assert len(sql) == expected, "\n".join(sql)
    print(f"k={k}: {len(sql)} statements")


def test_a_further_pass_under_the_same_claim_reads_nothing_again(behaviour, clock):
    # The commit says what the next pass needs (the fence held; whether an
    # operator paused the run), so a chained pass costs its steps and its
    # commit only, with no read of the run between passes: per further pass, 2
    # statements on PostgreSQL (the step, the commit with the ledger's drop), 4
    # on SQLite (the fence check, the step, the commit, the drop) and 5 on
    # MariaDB, whose commit reads the pause back in its transaction.
    def handler(p):
        p.step(f"s{p.cursor}", lambda: 1)
        return {"cursor": (p.cursor or 0) + 1}

    counts = {}
    for passes in (1, 3):
        behaviour[f"chain{passes}"] = handler
        run, _ = start_job_run("tests.scripted", instance=f"chain{passes}")
        with CaptureQueriesContext(connection) as ctx:
            report = drive_run(run.id, now=clock, max_passes=passes)
        assert report.advanced == passes
        counts[passes] = len(statements(ctx))
    per_pass = {"postgresql": 2, "sqlite": 4}.get(connection.vendor, 5)
    assert counts[3] - counts[1] == 2 * per_pass, counts


def test_a_memoized_step_issues_no_statement(behaviour, clock):
    replays: list[Any] = []

    def handler(p):
        if not replays:
            replays.append("first pass")
            p.step("fetch", lambda: "stored")
            raise ConnectionError("fail after the step, so the next pass replays it")
        with CaptureQueriesContext(connection) as ctx:
            value = p.step("fetch", lambda: "run again")
        replays.append((value, statements(ctx)))
        return {"done": True}

    behaviour["memo"] = handler
    start_job_run("tests.scripted", instance="memo")
    run_due_jobs(now=clock)
    clock.advance(hours=1)
    run_due_jobs(now=clock)
    assert replays == ["first pass", ("stored", [])]


def _due_sql(now):
    """The due read exactly as the drive issues it."""
    from django_jobruns.store import store

    at = connection.ops.adapt_datetimefield_value(now)
    return store().statements.due_first, [at, at, 50]


def _plan(now) -> str:
    sql, params = _due_sql(now)
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("EXPLAIN " + sql, params)
        elif connection.vendor == "mysql":
            cur.execute("EXPLAIN " + sql, params)
        else:
            cur.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(" ".join(str(c) for c in row) for row in cur.fetchall())


def test_d9_due_read_uses_the_due_index_with_a_large_history():
    now = timezone.now()
    finished_runs(2000, "old")
    start_job_run("tests.walk", instance="live")
    if connection.vendor != "mysql":  # MySQL's ANALYZE TABLE commits the test's transaction
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    plan = _plan(now)
    assert "jobruns_due" in plan, plan
    if connection.vendor == "sqlite":
        assert "USING INDEX jobruns_due_at" in plan, plan
        assert "TEMP B-TREE" not in plan, plan


def _counting_commits(monkeypatch: Any) -> tuple[list[str], Any]:
    """The commits of this thread's connection: each write outside a transaction, each transaction committed."""
    import re

    commits: list[str] = []
    real = connection.commit

    def commit() -> None:
        commits.append("a transaction")
        real()

    monkeypatch.setattr(connection, "commit", commit)

    def autocommitted(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not connection.in_atomic_block and re.match(r"\s*(INSERT|UPDATE|DELETE|WITH)", sql, re.I):
            commits.append(sql[:60])
        return execute(sql, params, many, context)

    return commits, connection.execute_wrapper(autocommitted)


@pytest.mark.django_db(transaction=True)
def test_a_task_costs_at_most_two_commits(monkeypatch):
    """The claim (with the attempt's record begun) and the pass's commit (the record ended, the lease given back)."""
    from tests.support import task_functions as t

    result = t.add.enqueue(20, 22)
    commits, counting = _counting_commits(monkeypatch)
    with counting:
        report = run_due_jobs()
    assert report.completed == 1 and len(commits) <= 2, commits
    result.refresh()
    assert result.return_value == 42 and result.errors == [] and len(result.worker_ids) == 1
    from django_jobruns.models import JobAttempt

    (attempt,) = JobAttempt.objects.filter(run_id=result.id)
    assert attempt.ended_at is not None and attempt.number == 1 and attempt.error_class is None


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_each_task_of_a_drive_is_one_statement_with_its_attempt_records(monkeypatch):
    """Three tasks in one drive: the due read, the first claim, then per task ONE statement.

    That statement commits the task, ends its attempt record, claims the next task and begins its
    record: each a write only while its fence holds, and no transaction of several round trips.
    Elsewhere each is its statements in one transaction, as many commits as on PostgreSQL.
    """
    from django_jobruns.models import JobAttempt
    from tests.support import task_functions as t

    results = [t.add.enqueue(i, 1) for i in range(3)]
    commits, counting = _counting_commits(monkeypatch)
    with CaptureQueriesContext(connection) as ctx, counting:
        report = run_due_jobs()
    assert report.completed == 3
    sql = statements(ctx)
    if connection.vendor == "postgresql":
        assert len(sql) == 1 + 1 + 3, "\n".join(sql)
        assert not [q for q in ctx.captured_queries if q["sql"].upper().startswith("BEGIN")], "a transaction"
    assert len(commits) <= 1 + 3, commits  # the first claim, then one per task
    for i, result in enumerate(results):
        result.refresh()
        assert result.return_value == i + 1 and result.errors == [] and len(result.worker_ids) == 1
        (attempt,) = JobAttempt.objects.filter(run_id=result.id)
        assert attempt.number == 1 and attempt.ended_at is not None and attempt.error_class is None


def test_on_postgresql_a_runs_claim_is_in_the_statement_that_commits_the_run_before_it(behaviour, clock):
    """Three runs of one step in one drive: the due read, the first claim, then per run its step and its commit."""
    for i in range(3):
        behaviour[f"line{i}"] = lambda p: (p.step("s", lambda: 1), {"done": True})[1]
        start_job_run("tests.scripted", instance=f"line{i}")
    with CaptureQueriesContext(connection) as ctx:
        report = run_due_jobs(now=clock)
    assert report.completed == 3
    sql = statements(ctx)
    # Elsewhere the next claim is a statement of its own in the last run's commit's transaction, as
    # many statements as a claim of its own; MariaDB adds the lock taken first (FOR UPDATE SKIP LOCKED).
    expected = {"postgresql": 2 + 3 * 2, "sqlite": 1 + 3 * 6}.get(connection.vendor, 1 + 3 * 7 + 2)
    assert len(sql) == expected, "\n".join(sql)


def _prepared_engine_statements() -> list[str]:
    """The statements prepared on this connection that write the engine's step records."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cur.fetchall() if "django_jobruns_jobstep" in row[0]]


def _eight_runs_of_one_step(behaviour, clock):
    """Drive eight runs of one step; return the engine's statements prepared on this connection."""
    for i in range(8):
        behaviour[f"prep{i}"] = lambda p: (p.step("s", lambda: 1), {"done": True})[1]
        start_job_run("tests.scripted", instance=f"prep{i}")
    assert run_due_jobs(now=clock).completed == 8
    return _prepared_engine_statements()


def _drive_eight_runs_of_one_step(behaviour, clock, threshold):
    """Eight runs of one step, psycopg's ``prepare_threshold`` set as ``OPTIONS`` would set it."""
    connection.ensure_connection()
    raw = connection.connection
    previous, raw.prepare_threshold = raw.prepare_threshold, threshold
    try:
        return _eight_runs_of_one_step(behaviour, clock)
    finally:
        raw.prepare_threshold = previous


_UNNAMED = object()


@contextlib.contextmanager
def _fresh_connection(prepare_threshold: Any = _UNNAMED):
    """A fresh connection (nothing prepared on it); ``OPTIONS`` name ``prepare_threshold`` as given, else not at all."""
    options = connection.settings_dict["OPTIONS"]
    with mock.patch.dict(options):
        options.pop("prepare_threshold", None)
        if prepare_threshold is not _UNNAMED:
            options["prepare_threshold"] = prepare_threshold
        connection.close()
        try:
            yield
        finally:
            connection.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's here")
def test_on_postgresql_the_engines_statements_are_prepared_where_the_project_allows_it(behaviour, clock):
    """``OPTIONS={"prepare_threshold": 5}`` with Django's default client-side binding, which alone prepares nothing."""
    assert connection.settings_dict["OPTIONS"].get("server_side_binding") is not True, "Django's default"
    prepared = _drive_eight_runs_of_one_step(behaviour, clock, 5)
    assert prepared, "the step's fenced write ran eight times on this connection and was never prepared"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's here")
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_by_default_the_engines_statements_are_prepared_and_the_projects_are_not(behaviour, clock):
    """``prepare_threshold`` unset (Django's default) on a direct connection: the engine's, and only the engine's."""
    import psycopg

    with _fresh_connection():
        prepared = _eight_runs_of_one_step(behaviour, clock)
        assert prepared, "the step's fenced write ran eight times on a direct connection and was never prepared"
        raw = connection.connection
        assert raw.prepare_threshold is None, "the connection's threshold is the project's, as it was"
        # The project's own queries, even with server-side binding, are prepared only if it asks.
        with psycopg.Cursor(raw) as cur:  # server-side binding, as ``"server_side_binding": True`` gives
            for _ in range(8):
                cur.execute("SELECT count(*) FROM django_jobruns_jobstep WHERE step = %s", ["project"])
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%'project'%"])
            assert cur.fetchone()[0] == 0
            cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%step = $1%"])
            assert cur.fetchone()[0] == 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's here")
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_options_that_turn_preparing_off_prepare_nothing(behaviour, clock):
    """``"prepare_threshold": None`` in ``OPTIONS`` (a pooler in transaction mode, as Django's docs say): nothing."""
    with _fresh_connection(prepare_threshold=None):
        assert _eight_runs_of_one_step(behaviour, clock) == []


@pytest.mark.skipif(
    connection.vendor != "postgresql" or not pgbouncer_available(), reason="needs PostgreSQL and Debian's pgbouncer"
)
def test_behind_a_pooler_the_engine_prepares_nothing_and_directly_it_does():
    """A pooler gives its clients a server process id of its own; the engine prepares only where they agree."""
    from tests.support.pgbouncer import pgbouncer

    settings_dict = connection.settings_dict
    connection.ensure_connection()
    assert reaches_the_server_directly(connection)
    with pgbouncer(settings_dict["HOST"] or "127.0.0.1", int(settings_dict["PORT"]), settings_dict["NAME"]) as port:
        pooled = connections["default"].__class__(
            {**settings_dict, "HOST": "127.0.0.1", "PORT": port, "OPTIONS": {}}, alias="pooled"
        )
        try:
            pooled.ensure_connection()
            assert not reaches_the_server_directly(pooled)
            assert getattr(pooled.connection, "prepare_threshold", "unset") is None
        finally:
            pooled.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's here")
@pytest.mark.django_db(transaction=True)
def test_a_prepared_statement_its_server_session_lost_is_not_charged_and_preparing_stops(behaviour, clock):
    """What a pooler the connect did not show would do: the session running the statement never prepared it."""
    with _fresh_connection():
        assert _eight_runs_of_one_step(behaviour, clock), "prepared on this connection"
        raw = connection.connection
        raw.pgconn.exec_(b"DEALLOCATE ALL")  # behind psycopg's back, as another server session would be
        behaviour["after"] = lambda p: (p.step("s", lambda: 1), {"done": True})[1]
        run, _ = start_job_run("tests.scripted", instance="after")
        first = run_due_jobs(now=clock)
        run.refresh_from_db()
        assert (first.completed, first.failed, first.retrying, run.attempts) == (0, 0, 0, 0), first
        assert "no longer prepared" in str(first.unrecorded), first.unrecorded
        second = run_due_jobs(now=clock)
        assert second.completed == 1, second
        assert raw._jobruns_direct is False and _prepared_engine_statements() == []


@pytest.mark.django_db(transaction=True)
def test_a_rounds_first_claims_are_one_transaction_and_on_postgresql_one_statement(behaviour, monkeypatch):
    """Three runs on three threads: the drive's own connection sends the due read, then the three claims together."""
    for i in range(3):
        behaviour[f"together{i}"] = lambda p: {"done": True}
        start_job_run("tests.scripted", instance=f"together{i}")
    commits, counting = _counting_commits(monkeypatch)  # this connection's: the threads' passes have their own
    with CaptureQueriesContext(connection) as ctx, counting:
        report = run_due_jobs(concurrency=3)
    assert report.completed == 3
    sql = statements(ctx)
    # PostgreSQL: one statement claims the three (with their ledgers), committed on its own. Elsewhere
    # each claim is its statement(s) in one transaction: SQLite's returns the row; MariaDB's takes the
    # row's lock first (FOR UPDATE SKIP LOCKED) and reads the claimed row back.
    expected = {"postgresql": 1 + 1, "sqlite": 1 + 3}.get(connection.vendor, 1 + 3 * 3)
    assert len(sql) == expected, "\n".join(sql)
    assert len(commits) == 1, commits


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the claims' result types are PostgreSQL's")
@pytest.mark.parametrize("concurrency", [1, 2])
def test_on_postgresql_a_claim_returns_no_column_read_by_a_loader_set_up_for_each_cursor(behaviour, concurrency):
    """The claim alone, with the last run's commit, and several together: their rows hold no timestamptz or json.

    psycopg reads those types with loaders of Python that each new cursor sets up again (Django's
    for timestamptz, psycopg's for json); the claims send the run's datetimes as integers and its
    ledger as text, which its C loaders read.
    """
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        pytest.skip("psycopg 3's loaders")
    from psycopg.postgres import types

    python_read = {types.get(name).oid for name in ("timestamptz", "json", "jsonb")}
    seen: list[tuple[str, set[int]]] = []

    def describing(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        description = context["cursor"].description
        if sql.startswith("WITH") and description:
            seen.append((sql, {column.type_code for column in description}))
        return result

    for i in range(4):
        behaviour[f"loaded{i}"] = lambda p: (p.step("s", lambda: 1), {"done": True})[1]
        start_job_run("tests.scripted", instance=f"loaded{i}")
    with connection.execute_wrapper(describing):
        report = run_due_jobs(concurrency=concurrency)
    assert report.completed == 4
    claims = [(sql, codes) for sql, codes in seen if "claimed AS" in sql]
    assert claims, "no claim was seen"
    assert not [sql for sql, codes in claims if codes & python_read], "a claim returns a type read by Python"
