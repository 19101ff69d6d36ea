"""The drive: bounded, isolated, stoppable (D1, D4-D8)."""

from __future__ import annotations

import json
import os
import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.drive import default_holder
from django_jobruns.exceptions import InvalidDriveOptions, UnknownJob
from django_jobruns.models import JobRun, Status
from tests import jobs

pytestmark = pytest.mark.django_db


def _runs(behaviour, n, fn, prefix="r"):
    runs = []
    for i in range(n):
        behaviour[f"{prefix}{i}"] = fn
        runs.append(start_job_run("tests.scripted", instance=f"{prefix}{i}")[0])
    return runs


def test_d1_limit_counts_runnable_runs_and_orphans_are_stepped_over(behaviour, clock):
    now = clock.now
    for i in range(5):  # runs of a job this process does not register
        JobRun.objects.create(module="elsewhere", job="gone", instance=f"o{i}", started_at=now, updated_at=now)
    runs = _runs(behaviour, 3, lambda p: {"cursor": 1})
    report = run_due_jobs(limit=2, now=clock)
    assert report.attempted == 2 and report.advanced == 2
    orphans = JobRun.objects.filter(module="elsewhere")
    assert all(o.status == Status.RUNNING and o.attempts == 0 and o.lease_holder is None for o in orphans)
    assert JobRun.objects.filter(pk__in=[r.id for r in runs], cursor="1").count() == 2


def test_d1_at_most_500_rows_are_read_per_call(behaviour, clock):
    _runs(behaviour, 2, lambda p: None)
    with CaptureQueriesContext(connection) as ctx:
        run_due_jobs(limit=10_000, now=clock)
    due_reads = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("SELECT") and "ORDER BY" in q["sql"]]
    assert len(due_reads) == 1 and "LIMIT 500" in due_reads[0]


def test_d1_scan_cap_is_a_setting(behaviour, clock, settings):
    settings.JOBRUNS = {"SCAN_MAX": 2}
    _runs(behaviour, 4, lambda p: None)
    assert run_due_jobs(limit=50, now=clock).attempted == 2


def test_d1_the_functions_defaults_are_the_settings(behaviour, clock, settings):
    """``run_due_jobs()`` and ``drive_run()`` take their limit and lease from ``JOBRUNS``, as the command does."""
    from django_jobruns.drive import drive_run

    settings.JOBRUNS = {"DRIVE_LIMIT": 2, "LEASE_TTL": timedelta(minutes=17)}
    leases = []

    def lease_seen(p):
        leases.append(JobRun.objects.get(pk=p.run.id).lease_expires_at - clock.now)
        return {"cursor": 1}

    runs = _runs(behaviour, 3, lease_seen)
    assert run_due_jobs(now=clock).attempted == 2
    drive_run(runs[2].id, now=clock)
    assert leases == [timedelta(minutes=17)] * 3


def test_d1_jobs_option_limits_the_drive(behaviour, clock, effects):
    _runs(behaviour, 1, lambda p: {"done": True})
    start_job_run("tests.walk", instance="w", payload={"log": str(effects)})
    report = run_due_jobs(jobs=["tests.walk"], now=clock)
    assert report.completed == 1
    assert JobRun.objects.get(job="scripted").status == Status.RUNNING
    with pytest.raises(UnknownJob):
        run_due_jobs(jobs=["tests.missing"], now=clock)


def test_d4_run_changed_after_the_due_read_is_given_back_stale(behaviour, clock):
    called: list[Any] = []
    (run,) = _runs(behaviour, 1, lambda p: called.append(1))

    def finish_before_claim(execute, sql, params, many, context):
        if "lease_holder` = %s" in sql.replace('"', "`") and not called:  # the claim
            # Another actor finishes the run out of band between the read and the claim.
            called.append("finished")
            with connection.cursor() as cur:
                cur.execute("UPDATE django_jobruns_jobrun SET status = 'done', live = NULL WHERE id = %s", [run.id])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(finish_before_claim):
        report = run_due_jobs(now=clock)
    run.refresh_from_db()
    assert report.stale == 1 and report.attempted == 1 and report.advanced == 0
    assert called == ["finished"], "the handler never ran"
    assert run.lease_holder is None and run.lease_expires_at is None


def test_d5_failed_release_is_reported_and_does_not_hide_the_pass_error(behaviour, clock):
    def handler(p):
        p.step("a", lambda: 1)
        return {"cursor": 1}

    (run,) = _runs(behaviour, 1, handler)

    broken: list[Any] = []

    def break_writes_after_the_step(execute, sql, params, many, context):
        # The database goes away as the pass commits: the commit fails, and so
        # does every statement after it, the release included.
        if "DELETE FROM" in sql or (broken and sql.split()[0] in ("UPDATE", "INSERT", "SELECT")):
            broken.append(sql)
            raise RuntimeError("injected: the commit" if len(broken) == 1 else "injected: later")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(break_writes_after_the_step):
        report = run_due_jobs(now=clock)
    assert report.unreleased == 1
    assert report.unrecorded == [(run.id, "RuntimeError: injected: the commit")] and report.errors == []
    assert broken[-1].startswith("UPDATE") and "lease_holder" in broken[-1], "the release was attempted"


def test_d5_lease_is_released_when_the_handler_fails(behaviour, clock):
    def handler(p):
        raise RuntimeError("nope")

    (run,) = _runs(behaviour, 1, handler)
    run_due_jobs(now=clock)
    run.refresh_from_db()
    assert run.lease_holder is None and run.lease_expires_at is None and run.lease_fence == 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"holder": ""}, "holder must be non-empty"),
        ({"holder": "   "}, "holder must be non-empty"),
        ({"holder": "pod-7\x00"}, r"holder 'pod-7\\x00' contains NUL"),
        ({"holder": "pod-\udce9"}, r"holder 'pod-\\udce9' is not valid Unicode"),  # a Latin-1 byte in argv or the env
        ({"lease_ttl": timedelta(0)}, "lease_ttl must be positive"),
        ({"lease_ttl": -5}, "lease_ttl must be positive"),
        ({"lease_ttl": "300"}, "lease_ttl must be a timedelta"),
        ({"lease_ttl": 2}, "lease_ttl must be at least 5 seconds, got 2"),
        ({"lease_ttl": timedelta(seconds=4.5)}, "lease_ttl must be at least 5 seconds"),
        ({"concurrency": 0}, "concurrency must be >= 1"),
        ({"concurrency": "2"}, "concurrency must be a whole number"),
        ({"limit": 0}, "limit must be >= 1"),
        ({"limit": -1}, "limit must be >= 1"),
        ({"limit": "50"}, "limit must be a whole number"),
        ({"limit": 2.5}, "limit must be a whole number"),
        ({"max_passes": 0}, "max_passes must be >= 1"),
        ({"jobs": []}, "jobs is empty"),
        ({"now": "2026-01-01"}, "now must be a callable"),
        ({"stop": True}, "stop must be a threading.Event"),
    ],
)
def test_d6_bad_options_are_refused_before_anything_is_claimed(behaviour, options, message):
    (run,) = _runs(behaviour, 1, lambda p: {"cursor": 1})
    with CaptureQueriesContext(connection) as ctx, pytest.raises(InvalidDriveOptions, match=message):
        run_due_jobs(**options)
    assert ctx.captured_queries == []
    run.refresh_from_db()
    assert run.lease_fence == 0 and run.cursor is None


def test_d6_naive_clock_is_refused(behaviour):
    with pytest.raises(InvalidDriveOptions, match="aware datetime"):
        run_due_jobs(now=lambda: __import__("datetime").datetime(2026, 1, 1))


def test_d6_default_holder_is_per_process():
    holder = default_holder()
    host, pid, suffix = holder.rsplit(":", 2)
    assert host == socket.gethostname() and pid == str(os.getpid()) and len(suffix) == 8
    assert default_holder() == holder


def test_d6_default_holder_is_written_on_the_claim(behaviour, clock):
    holders = []
    (run,) = _runs(behaviour, 1, lambda p: holders.append(JobRun.objects.get(pk=p.run.id).lease_holder))
    run_due_jobs(now=clock)
    assert holders == [default_holder()]
    run_due_jobs(now=clock.advance(hours=1) and clock, holder="pod-7:42")
    assert holders[-1] == "pod-7:42"


def test_d7_stop_stops_taking_runs_but_the_pass_in_flight_finishes(behaviour, clock):
    stop = threading.Event()
    driven = []

    def handler(p):
        stop.set()  # arrives while this pass is in flight
        driven.append(p.run.id)
        p.step("s", lambda: "done anyway")
        return {"cursor": "first"}

    _runs(behaviour, 3, handler)
    report = run_due_jobs(stop=stop, max_passes=3, now=clock)
    assert report.stopped and report.attempted == 1 and report.advanced == 1
    (first,) = driven
    states = {r.id: r for r in JobRun.objects.all()}
    assert json.loads(states[first].cursor) == "first"
    assert states[first].lease_holder is None, "the run in flight was released"
    assert [r.cursor for i, r in states.items() if i != first] == [None, None]


@pytest.mark.django_db(transaction=True)
def test_d7_concurrency_is_windowed(behaviour):
    """With concurrency 2, a run's claim is taken as its work starts, not up front."""
    seen = []
    lock = threading.Lock()

    def handler(p):
        held = JobRun.objects.exclude(lease_holder=None).count()
        with lock:
            seen.append(held)
        return {"cursor": 1}

    _runs(behaviour, 6, handler)
    report = run_due_jobs(concurrency=2)
    assert report.attempted == 6 and report.advanced == 6
    assert max(seen) <= 2


@pytest.mark.django_db(transaction=True)
def test_d7_a_rounds_first_claims_are_taken_in_one_commit_and_each_started_at_once(behaviour):
    """With concurrency 3, the first three runs were claimed one commit each, by the threads that ran them.

    One transaction claims them now (each with its own fence), and each claimed run starts at once in
    its own thread: the three handlers meet at a barrier, and each sees the three runs held.
    """
    from django.db.backends.signals import connection_created

    met = threading.Barrier(3, timeout=30)
    held: list[int] = []
    claims: list[tuple[str, bool]] = []  # (thread, in a transaction) for each claim statement sent
    lock = threading.Lock()

    def handler(p):
        with lock:
            held.append(JobRun.objects.exclude(lease_holder=None).count())
        met.wait()  # all three started at once: none waits for another's work
        return {"done": True}

    def count_claims(execute, sql, params, many, context):
        if "claimer" in (params or ()):  # a claim sets the holder; every other write under it names its fence
            with lock:
                claims.append((threading.current_thread().name, context["connection"].in_atomic_block))
        return execute(sql, params, many, context)

    def watch(sender, connection, **kwargs):
        connection.execute_wrappers.append(count_claims)

    runs = _runs(behaviour, 3, handler)
    connection_created.connect(watch)
    try:
        with connection.execute_wrapper(count_claims):
            report = run_due_jobs(concurrency=3, limit=3, holder="claimer")
    finally:
        connection_created.disconnect(watch)
    assert report.completed == 3, report
    assert held == [3, 3, 3], "each run started while the others' claims held"
    assert len({thread for thread, _ in claims}) == 1, f"the round's claims were made by one thread: {claims}"
    assert len(claims) == 1 or all(atomic for _, atomic in claims), f"in one transaction: {claims}"
    states = JobRun.objects.in_bulk([r.id for r in runs])
    assert {state.lease_fence for state in states.values()} == {1}, "each run claimed once, with its own fence"


@pytest.mark.django_db(transaction=True)
def test_concurrent_threads_keep_their_connection_for_the_rounds_runs(behaviour):
    """A thread opened a connection for each run it drove: slower with four threads than with one."""
    from django.db.backends.signals import connection_created

    opened = []
    in_threads = threading.Lock()

    def count(sender, connection, **kwargs):
        if threading.current_thread().name.startswith("jobruns_"):
            with in_threads:
                opened.append(threading.current_thread().name)

    _runs(behaviour, 12, lambda p: {"done": True})
    connection_created.connect(count)
    try:
        report = run_due_jobs(concurrency=3, limit=12)
    finally:
        connection_created.disconnect(count)
    assert report.completed == 12
    assert 1 <= len(opened) <= 3, opened  # one per thread of the round, not one per run


@pytest.mark.django_db(transaction=True)
def test_a_drives_threads_keep_their_connections_from_round_to_round_and_close_them_at_its_end(behaviour):
    """Each round made threads of its own: a drive of many rounds opened threads x rounds connections."""
    from django.db.backends.signals import connection_created

    opened = []
    in_threads = threading.Lock()
    stop = threading.Event()
    finished = []

    def count(sender, connection, **kwargs):
        if threading.current_thread().name.startswith("jobruns_"):
            with in_threads:
                opened.append(connection)

    def handler(p):
        with in_threads:
            finished.append(p.cursor)
            if len(finished) == 12:
                stop.set()  # the last run: the drive ends once its passes are in
        return {"done": True}

    _runs(behaviour, 12, handler)
    connection_created.connect(count)
    try:
        # Rounds of at most three runs (``limit``), so four rounds at least, three threads each.
        report = run_due_jobs(concurrency=3, limit=3, max_seconds=60, stop=stop)
    finally:
        connection_created.disconnect(count)
    assert report.completed == 12 and report.stopped
    assert 1 <= len(opened) <= 3, len(opened)  # one per thread of the drive, not one per thread of each round
    assert all(wrapper.connection is None for wrapper in opened)  # the drive closed them as it ended


def test_d8_max_passes_resume_from_what_was_committed(behaviour, clock):
    cursors = []

    def handler(p):
        cursors.append(p.cursor)
        p.step(f"s{p.cursor}", lambda: 1)
        nxt = (p.cursor or 0) + 1
        return {"cursor": nxt, "done": nxt == 5}

    (run,) = _runs(behaviour, 1, handler)
    report = run_due_jobs(max_passes=3, now=clock)
    assert cursors == [None, 1, 2] and report.advanced == 3 and report.attempted == 1
    report = run_due_jobs(max_passes=10, now=clock)
    assert cursors[3:] == [3, 4] and report.completed == 1 and report.advanced == 1
    run.refresh_from_db()
    assert run.status == Status.DONE and run.cursor == "5"


def test_d8_one_runs_failure_never_escapes_the_drive(behaviour, clock):
    def bad(p):
        raise SystemError("handler blew up")

    _runs(behaviour, 1, bad, prefix="bad")
    _runs(behaviour, 2, lambda p: {"done": True}, prefix="good")
    report = run_due_jobs(now=clock)
    assert report.attempted == 3 and report.completed == 2 and report.retrying == 1
    assert report.errors[0][1] == "SystemError: handler blew up"


def test_report_as_dict_and_summary(behaviour, clock):
    _runs(behaviour, 1, lambda p: {"done": True})
    report = run_due_jobs(now=clock)
    data = report.as_dict()
    assert data["completed"] == 1 and data["errors"] == [] and data["stopped"] is False
    assert report["completed"] == 1
    assert "completed=1" in report.summary()


def test_d1_orphans_ahead_of_a_runnable_run_cost_a_few_reads(behaviour, clock):
    now = clock.now
    JobRun.objects.bulk_create(
        [
            JobRun(module="elsewhere", job="gone", instance=f"o{i}", started_at=now, updated_at=now, due_at=now)
            for i in range(120)
        ]
    )
    (run,) = _runs(behaviour, 1, lambda p: {"cursor": 1})
    with CaptureQueriesContext(connection) as ctx:
        report = run_due_jobs(limit=1, now=clock)
    assert report.attempted == 1
    due_reads = [q for q in ctx.captured_queries if q["sql"].startswith("SELECT") and "ORDER BY" in q["sql"]]
    assert len(due_reads) == 3, "120 orphans and one run, read 50 rows at a time"


def test_d1_runs_are_taken_oldest_first(behaviour, clock):
    runs = _runs(behaviour, 5, lambda p: {"cursor": 1})
    run_due_jobs(limit=2, now=clock)
    advanced = set(JobRun.objects.filter(cursor="1").values_list("id", flat=True))
    assert advanced == {runs[0].id, runs[1].id}


def test_d2_a_claim_lost_to_another_worker_is_made_up_from_the_spares(behaviour, clock):
    runs = _runs(behaviour, 4, lambda p: {"cursor": 1})
    ids = {run.id for run in runs}
    lost: list[Any] = []

    def another_worker_claims_first(execute, sql, params, many, context):
        if "lease_holder` = %s" in sql.replace('"', "`") and not lost:
            # The run this claim is for: another worker takes it first.
            lost.append(next(value for value in params if value in ids))
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE django_jobruns_jobrun SET lease_fence = lease_fence + 1, lease_holder = 'other' "
                    "WHERE id = %s",
                    [lost[0]],
                )
        return execute(sql, params, many, context)

    with connection.execute_wrapper(another_worker_claims_first):
        report = run_due_jobs(limit=2, now=clock)
    assert lost == [runs[0].id]
    assert report.skipped == 1 and report.attempted == 2 and report.advanced == 2
    assert JobRun.objects.filter(cursor="1").count() == 2


@pytest.mark.django_db
def test_d9_a_run_that_backed_off_queues_behind_runs_that_became_due_before_it():
    from tests import jobs
    from tests.conftest import Clock

    clock = Clock()
    calls = []

    def handler(p):
        calls.append(p.run.instance)
        if p.run.instance == "first" and calls.count("first") == 1:
            raise ConnectionError("upstream down")
        return {"done": True}

    jobs.BEHAVIOUR.update({"first": handler, "second": handler})
    first, _ = start_job_run("tests.scripted", instance="first")  # the older id
    assert run_due_jobs(now=clock).retrying == 1
    clock.advance(minutes=30)
    second, _ = start_job_run("tests.scripted", instance="second")
    # "second" became due 10 minutes ago (its start); "first" when its backoff ended, 5 minutes ago.
    ago_10, ago_5 = clock.now - timedelta(minutes=10), clock.now - timedelta(minutes=5)
    JobRun.objects.filter(pk=second.pk).update(started_at=ago_10, due_at=ago_10)
    JobRun.objects.filter(pk=first.pk).update(next_attempt_at=ago_5, due_at=ago_5)
    assert run_due_jobs(now=clock, limit=1).completed == 1
    assert calls[-1] == "second"
    assert run_due_jobs(now=clock, limit=1).completed == 1
    assert calls[-1] == "first"


@pytest.mark.django_db
def test_d9_due_is_one_rule_in_python_the_orm_and_the_drives_due_read():
    """``JobRun.is_due`` defines due; the ORM's ``due()`` and the store's SQL read find exactly the runs it finds."""
    from django_jobruns.store import store
    from tests.conftest import Clock

    clock = Clock()
    runs = [start_job_run("tests.walk", instance=f"agree{i}")[0] for i in range(9)]
    JobRun.objects.filter(pk=runs[1].pk).update(
        next_attempt_at=clock.now - timedelta(seconds=1), due_at=clock.now - timedelta(seconds=1)
    )
    later = clock.now + timedelta(hours=1)
    JobRun.objects.filter(pk=runs[2].pk).update(next_attempt_at=later, due_at=later)  # backing off
    JobRun.objects.filter(pk=runs[3].pk).update(paused_at=clock.now)  # paused
    JobRun.objects.filter(pk=runs[4].pk).update(lease_holder="h", lease_expires_at=clock.now + timedelta(1))  # held
    JobRun.objects.filter(pk=runs[5].pk).update(due_at=clock.now - timedelta(days=3))
    JobRun.objects.filter(pk=runs[6].pk).update(lease_holder="h", lease_expires_at=clock.now)  # lapsed: due
    JobRun.objects.filter(pk=runs[7].pk).update(next_attempt_at=clock.now, due_at=clock.now)  # backoff ends now
    JobRun.objects.filter(pk=runs[8].pk).update(status=Status.DONE, live=None, ended_at=clock.now)  # ended
    python = {run.pk for run in JobRun.objects.all() if run.is_due(clock.now)}
    orm = list(JobRun.objects.due(clock.now).in_due_order().values_list("id", flat=True))
    raw = [row.id for row in store().due(clock.now, None, 50)]
    assert orm == raw and set(orm) == python == {runs[i].pk for i in (0, 1, 5, 6, 7)}
    assert orm[0] == runs[5].pk, "the longest waiting first"
    # Paging after a row continues in the same order.
    (first,) = store().due(clock.now, None, 1)
    rest = [row.id for row in store().due(clock.now, first, 50)]
    assert [first.id, *rest] == raw


def test_the_report_counts_runs_of_jobs_this_process_does_not_register(clock):
    from django.utils import timezone

    now = timezone.now()
    JobRun.objects.create(module="gone", job="renamed", instance="x", started_at=now, updated_at=now)
    jobs.BEHAVIOUR["here"] = lambda p: {"done": True}
    start_job_run("tests.scripted", instance="here")
    report = run_due_jobs(now=clock)
    assert report.unregistered == 1 and report.completed == 1
    assert "unregistered=1" in report.summary()
    # A drive that looks again and again (a drive with a budget polls) counts each run once.
    again = run_due_jobs(max_seconds=1.5)
    assert again.unregistered == 1, again.summary()
    assert again.as_dict()["unregistered_jobs"] == {"gone.renamed": 1}


def test_a_run_whose_job_is_not_registered_is_named_in_the_log_and_report_and_marked_once(clock, caplog):
    """A @job outside jobs.py: the start succeeded elsewhere; here nothing drives it. Say which, and where to look."""
    from django.utils import timezone

    now = timezone.now()
    stray = JobRun.objects.create(module="catalog", job="import_feed", instance="x", started_at=now, updated_at=now)
    with caplog.at_level("WARNING", logger="django_jobruns"):
        report = run_due_jobs(now=clock)
        run_due_jobs(now=clock)
    assert report.as_dict()["unregistered_jobs"] == {"catalog.import_feed": 1}
    assert report.as_dict()["unregistered_runs"] == {"catalog.import_feed": [stray.id]}  # --json names its runs
    said = [r.getMessage() for r in caplog.records if "catalog.import_feed" in r.getMessage()]
    assert len(said) == 2 and "jobs.py" in said[0] and stray.id in said[0], said  # once per drive
    stray.refresh_from_db()
    assert stray.last_warning.startswith("job not registered in the process that drove it"), stray.last_warning
    first = stray.last_warning
    run_due_jobs(now=clock)
    stray.refresh_from_db()
    assert stray.last_warning == first, "marked once, not on every look"
    with pytest.raises(UnknownJob, match="jobs.py"):
        start_job_run("catalog.import_feed")


@pytest.mark.django_db(transaction=True)
def test_a_drive_inside_the_callers_transaction_is_refused_and_claims_nothing(behaviour, clock):
    """Its commits would roll back with the caller's transaction, and the passes it reported be lost."""
    from django.db import transaction

    from django_jobruns.exceptions import DriveInTransaction

    (run,) = _runs(behaviour, 1, lambda p: {"cursor": 1})
    with transaction.atomic():
        with pytest.raises(DriveInTransaction, match=r"inside a database transaction .*transaction\.on_commit"):
            run_due_jobs(now=clock)
        with pytest.raises(DriveInTransaction):
            drive_run_by_id(run.id, clock)
    run.refresh_from_db()
    assert run.lease_holder is None and run.cursor is None
    assert run_due_jobs(now=clock).advanced == 1, "outside the transaction it drives"


def drive_run_by_id(run_id, clock):
    from django_jobruns.drive import drive_run

    return drive_run(run_id, now=clock)


def test_the_models_json_fields_read_decoded_and_tolerate_a_row_that_does_not_parse(effects):
    run, _ = start_job_run("tests.walk", payload={"log": str(effects), "passes": 1})
    run_due_jobs()
    run.refresh_from_db()
    assert run.payload_value == {"log": str(effects), "passes": 1}
    assert run.counters_value and all(isinstance(v, int | float) for v in run.counters_value.values())
    assert run.cursor_value == json.loads(run.cursor)
    JobRun.objects.filter(pk=run.pk).update(counters="{not json", payload="[")
    run.refresh_from_db()
    assert run.counters_value == {} and run.payload_value is None
    bare, _ = start_job_run("tests.walk", instance="bare")
    assert bare.payload_value is None and bare.instance == "bare"
    from django.utils import timezone

    from django_jobruns.models import JobStep

    at = timezone.now()
    done = JobStep.objects.create(run=bare, step="fetch", result='{"page": 2}', recorded_at=at)
    failing = JobStep.objects.create(run=bare, step="save", result=None, last_error="boom", recorded_at=at)
    unreadable = JobStep.objects.create(run=bare, step="edited", result="{oops", recorded_at=at)
    assert done.result_value == {"page": 2} and failing.result_value is None and unreadable.result_value is None
