"""Coalescing: one live run per key, enforced by the database (C1-C4)."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from django_jobruns import job_runs, run_due_jobs, start_job_run
from django_jobruns.exceptions import UnknownJob
from django_jobruns.models import JobRun, Status


def _start_in_thread(barrier, results, errors):
    try:
        barrier.wait()
        run, created = start_job_run("tests.walk", instance="race", payload={"log": "/dev/null"})
        results.append((run.id, created))
    except Exception as exc:  # reported to the test, which fails on it
        errors.append(exc)
    finally:
        connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_c1_sixteen_threads_starting_one_key_create_one_live_run():
    barrier = threading.Barrier(16)
    results: list = []
    errors: list = []
    threads = [threading.Thread(target=_start_in_thread, args=(barrier, results, errors)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 16
    assert sum(created for _, created in results) == 1
    assert len({run_id for run_id, _ in results}) == 1
    assert JobRun.objects.filter(instance="race").count() == 1


@pytest.mark.django_db(transaction=True)
def test_c1_processes_starting_one_key_create_one_live_run():
    from tests.conftest import spawn_env
    from tests.support.process_helpers import start_one_key

    # Spawned, not forked: each process is a fresh interpreter with its own connection.
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(6)
    queue = ctx.Queue()
    env = spawn_env()
    procs = [ctx.Process(target=start_one_key, args=(env, barrier, queue)) for _ in range(6)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(created for _, created in results) == 1
    assert len({run_id for run_id, _ in results}) == 1
    assert JobRun.objects.filter(instance="race-proc").count() == 1


@pytest.mark.django_db
def test_c1_the_database_refuses_a_second_live_run_for_a_key():
    run, _ = start_job_run("tests.walk", instance="db")
    now = timezone.now()
    with pytest.raises(IntegrityError), transaction.atomic():
        JobRun.objects.create(module=run.module, job=run.job, instance="db", started_at=now, updated_at=now)
    # Finished runs do not occupy the key.
    JobRun.objects.filter(pk=run.pk).update(status=Status.DONE, live=None)
    JobRun.objects.create(module=run.module, job=run.job, instance="db", started_at=now, updated_at=now)
    JobRun.objects.create(
        module=run.module, job=run.job, instance="db", status=Status.DONE, live=None, started_at=now, updated_at=now
    )


@pytest.mark.django_db
def test_c2_second_start_returns_the_live_run_unchanged():
    first, created = start_job_run("tests.walk", instance="c2", payload={"log": "/dev/null", "n": 1})
    JobRun.objects.filter(pk=first.pk).update(cursor="4", counters='{"steps": 12}')
    second, created_again = start_job_run("tests.walk", instance="c2", payload={"log": "/dev/null", "n": 2})
    assert created and not created_again
    assert second.pk == first.pk
    assert second.payload == '{"log":"/dev/null","n":1}'
    assert (second.cursor, second.counters) == ("4", '{"steps": 12}')
    other, created_other = start_job_run("tests.walk", instance="c2-other")
    assert created_other and other.pk != first.pk


@pytest.mark.django_db
@pytest.mark.parametrize("status", [Status.DONE, Status.FAILED])
def test_c3_a_done_or_failed_key_starts_afresh(status):
    first, _ = start_job_run("tests.walk", instance="c3")
    JobRun.objects.filter(pk=first.pk).update(status=status, live=None, ended_at=timezone.now())
    second, created = start_job_run("tests.walk", instance="c3")
    assert created and second.pk != first.pk
    assert second.status == Status.RUNNING and second.cursor is None


@pytest.mark.django_db
def test_c4_a_run_whose_worker_vanished_stays_running_and_is_taken_again(clock, effects):
    run, _ = start_job_run("tests.walk", instance="c4", payload={"log": str(effects), "passes": 1})
    # A worker claimed it and died: its lease is in place and nothing released it.
    JobRun.objects.filter(pk=run.pk).update(lease_holder="dead:1:x", lease_expires_at=clock.now, lease_fence=7)
    assert run_due_jobs(now=lambda: clock.now.replace(microsecond=0) - timedelta(seconds=1)).attempted == 0
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    report = run_due_jobs(now=clock)
    run.refresh_from_db()
    assert report.completed == 1 and run.status == Status.DONE and run.lease_fence == 8


@pytest.mark.django_db
def test_unknown_job_is_a_clear_error_and_creates_nothing():
    with pytest.raises(UnknownJob, match="no job is registered as 'tests.nope'"):
        start_job_run("tests.nope")
    with pytest.raises(UnknownJob, match="app_label.job_name"):
        start_job_run("nodot")
    with pytest.raises(LookupError):
        start_job_run(42)  # type: ignore[arg-type]
    assert not JobRun.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("first, second", [("Supplier-7", "supplier-7"), ("x ", "x"), ("é", "e"), ("ß", "ss")])
def test_keys_compare_exactly_on_every_backend(first, second):
    one, created_one = start_job_run("tests.walk", instance=first)
    two, created_two = start_job_run("tests.walk", instance=second)
    assert created_one and created_two and one.pk != two.pk
    assert [r.id for r in job_runs(instance=second)] == [two.pk]
    assert JobRun.objects.filter(instance=first).get().pk == one.pk


@pytest.mark.django_db(transaction=True)
def test_keys_differing_only_in_case_or_trailing_space_are_distinct_under_concurrent_processes():
    from tests.conftest import spawn_env
    from tests.support.process_helpers import start_one_key

    spellings = ["Supplier-7", "supplier-7", "supplier-7 ", "Supplier-7", "supplier-7", "supplier-7 "]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(spellings))
    queue = ctx.Queue()
    env = spawn_env()
    procs = [ctx.Process(target=start_one_key, args=(env, barrier, queue, name)) for name in spellings]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(created for _, created in results) == 3, "one run per exact spelling"
    assert sorted(JobRun.objects.values_list("instance", flat=True)) == ["Supplier-7", "supplier-7", "supplier-7 "]


@pytest.mark.django_db
def test_an_instance_with_nul_is_refused_on_every_backend_and_creates_nothing():
    with pytest.raises(ValueError, match="contains NUL"):
        start_job_run("tests.walk", instance="a\x00b")
    with pytest.raises(ValueError, match="is not valid Unicode text"):
        start_job_run("tests.walk", instance="pod-\udce9")  # a Latin-1 byte in --instance
    assert not JobRun.objects.exists()


@pytest.mark.skipif("connections['default'].vendor != 'mysql'", reason="collations are MariaDB's and MySQL's")
@pytest.mark.django_db(transaction=True)
def test_migrating_back_past_exact_keys_keeps_live_keys_that_differ_only_in_case():
    from django.core.management import call_command

    start_job_run("tests.walk", instance="Supplier-7")
    start_job_run("tests.walk", instance="supplier-7")
    try:
        call_command("migrate", "django_jobruns", "0002", verbosity=0)
        with connections["default"].cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM django_jobruns_jobrun WHERE live = 1")
            assert cur.fetchone()[0] == 2
    finally:
        call_command("migrate", "django_jobruns", verbosity=0)
    assert set(JobRun.objects.values_list("instance", flat=True)) == {"Supplier-7", "supplier-7"}
