"""The pass: what a committed and a failed pass write (P1-P8, handler results)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from django_jobruns import RetryPolicy, run_due_jobs, start_job_run
from django_jobruns.exceptions import StepReused
from django_jobruns.models import JobRun, JobStep, Status

pytestmark = pytest.mark.django_db


def drive(clock, **kwargs):
    return run_due_jobs(now=clock, **kwargs)


def start(behaviour, instance, fn, payload=None):
    behaviour[instance] = fn
    run, created = start_job_run("tests.scripted", instance=instance, payload=payload)
    assert created
    return run


def test_p1_committed_pass_writes_cursor_counters_and_drops_ledger(behaviour, clock):
    def handler(p):
        p.step("a", lambda: 1)
        p.step("b", lambda: 2)
        p.count("seen", 2)
        return {"cursor": {"after": 2}}

    run = start(behaviour, "p1", handler)
    JobRun.objects.filter(pk=run.pk).update(attempts=2, last_error="old", next_attempt_at=clock.now, due_at=clock.now)
    report = drive(clock)
    run.refresh_from_db()
    assert (report.attempted, report.advanced) == (1, 1)
    assert json.loads(run.cursor) == {"after": 2}
    assert json.loads(run.counters) == {"seen": 2}
    assert (run.attempts, run.last_error, run.next_attempt_at) == (0, None, None)
    assert run.status == Status.RUNNING
    assert not JobStep.objects.filter(run=run).exists()
    assert run.lease_holder is None and run.lease_expires_at is None


def test_p1_commit_is_one_transaction_with_dropping_the_ledger(behaviour, clock):
    """A failure dropping the ledger leaves the run exactly as the last commit did."""

    def handler(p):
        p.step("a", lambda: "done")
        p.count("seen")
        return {"cursor": 1}

    run = start(behaviour, "p1-atomic", handler)

    def fail_ledger_delete(execute, sql, params, many, context):
        if "DELETE FROM" in sql and "jobstep" in sql:
            raise RuntimeError("injected failure dropping the ledger")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(fail_ledger_delete):
        report = drive(clock)
    run.refresh_from_db()
    assert run.cursor is None and json.loads(run.counters) == {}
    assert JobStep.objects.get(run=run, step="a").result == '"done"'
    assert report.unrecorded and "injected failure" in report.unrecorded[0][1]
    assert run.lease_holder is None, "the lease is released in finally"


def test_p2_failed_pass_keeps_cursor_and_counters(behaviour, clock):
    calls = []

    def handler(p):
        calls.append(p.cursor)
        if len(calls) == 1:
            p.count("seen", 5)
            return {"cursor": "page-2"}
        p.step("ok", lambda: "kept")
        p.count("seen", 7)
        raise ValueError("upstream said no")

    run = start(behaviour, "p2", handler)
    drive(clock)
    report = drive(clock)
    run.refresh_from_db()
    assert report.retrying == 1 and report.errors[0][0] == run.id
    assert json.loads(run.cursor) == "page-2"
    assert json.loads(run.counters) == {"seen": 5}
    assert run.attempts == 1
    assert run.last_error.startswith("ValueError: upstream said no")
    # FAST_RETRY: base 60 s, factor 2, no jitter: the first retry is 60 s out.
    assert run.next_attempt_at == clock.now + timedelta(seconds=60)
    assert JobStep.objects.get(run=run, step="ok").result == '"kept"', "the ledger survives"
    assert run.lease_holder is None


def test_p2_backoff_follows_the_curve_and_is_not_due_early(behaviour, clock):
    def handler(p):
        raise RuntimeError("down")

    behaviour["curve"] = handler
    run, _ = start_job_run("tests.scripted", instance="curve")
    drive(clock)
    run.refresh_from_db()
    assert run.next_attempt_at == clock.now + timedelta(seconds=60)
    clock.advance(seconds=59)
    assert drive(clock).attempted == 0, "not due before its backoff"
    clock.advance(seconds=1)
    drive(clock)
    run.refresh_from_db()
    assert run.attempts == 2
    assert run.next_attempt_at == clock.now + timedelta(seconds=120)


def test_p3_completed_step_is_not_rerun_after_a_failed_pass(behaviour, clock, effects):
    attempts = []

    def handler(p):
        p.step("fetch", lambda: effect_of("fetch"))
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("flaky")
        p.step("save", lambda: effect_of("save"))
        return {"done": True}

    ran = []

    def effect_of(name):
        ran.append(name)
        return name

    run = start(behaviour, "p3", handler)
    drive(clock)
    clock.advance(minutes=5)
    report = drive(clock)
    assert report.completed == 1
    assert ran == ["fetch", "save"]
    run.refresh_from_db()
    assert run.status == Status.DONE and run.ended_at == clock.now


def test_p4_step_that_raised_keeps_null_result_and_runs_again(behaviour, clock):
    seen = []

    def flaky():
        seen.append(1)
        if len(seen) < 3:
            raise TimeoutError(f"attempt {len(seen)}")
        return {"rows": 3}

    def handler(p):
        result = p.step("fetch", flaky, retry=RetryPolicy(max_attempts=5, base_delay=1, jitter=0))
        return {"cursor": result["rows"]}

    run = start(behaviour, "p4", handler)
    drive(clock)
    row = JobStep.objects.get(run=run, step="fetch")
    assert (row.result, row.attempts) == (None, 1)
    assert "TimeoutError: attempt 1" in row.last_error
    run.refresh_from_db()
    # The step's own policy sets the backoff: 1 s after its first attempt.
    assert run.next_attempt_at == clock.now + timedelta(seconds=1)
    clock.advance(seconds=1)
    drive(clock)
    assert JobStep.objects.get(run=run, step="fetch").attempts == 2
    clock.advance(seconds=2)
    drive(clock)
    run.refresh_from_db()
    assert json.loads(run.cursor) == 3 and len(seen) == 3


def test_p4_step_at_its_recorded_limit_is_not_called_again(behaviour, clock):
    called = []

    def handler(p):
        p.step("spent", lambda: called.append(1), retry=RetryPolicy(max_attempts=2))
        return {"done": True}

    run = start(behaviour, "p4-spent", handler)
    # A stop between the step's last failed attempt and the run being marked failed.
    JobStep.objects.create(run=run, step="spent", result=None, attempts=2, last_error="boom", recorded_at=clock.now)
    report = drive(clock)
    run.refresh_from_db()
    assert called == []
    assert report.failed == 1 and run.status == Status.FAILED
    assert "spent" in run.last_error and "boom" in run.last_error


def test_p5_exhausted_step_policy_fails_the_run_and_keeps_evidence(behaviour, clock):
    def handler(p):
        p.step("done-part", lambda: "ok")
        p.step("bad", lambda: 1 / 0, retry=RetryPolicy(max_attempts=2, base_delay=0))
        return {"done": True}

    run = start(behaviour, "p5-step", handler, payload={"k": 1})
    first = drive(clock)
    assert first.retrying == 1
    second = drive(clock)
    run.refresh_from_db()
    assert second.failed == 1 and second.errors[0][0] == run.id
    assert run.status == Status.FAILED and run.ended_at == clock.now
    assert run.next_attempt_at is None and run.live is None
    assert "ZeroDivisionError" in run.last_error and "'bad'" in run.last_error
    ledger = {s.step: s for s in JobStep.objects.filter(run=run)}
    assert ledger["done-part"].result == '"ok"' and ledger["bad"].attempts == 2
    assert drive(clock).attempted == 0, "a failed run is not driven again"


def test_p5_exhausted_job_policy_fails_the_run_without_raising(behaviour, clock):
    def handler(p):
        raise KeyError("missing")

    run = start(behaviour, "p5-job", handler)
    for _ in range(3):  # FAST_RETRY allows three attempts
        report = drive(clock)
        clock.advance(hours=1)
    run.refresh_from_db()
    assert report.failed == 1
    assert run.status == Status.FAILED and run.attempts == 3
    assert "KeyError" in run.last_error


def test_p6_second_step_under_one_name_is_refused(behaviour, clock):
    caught = []

    def handler(p):
        p.step("same", lambda: 1)
        try:
            p.step("same", lambda: 2)
        except StepReused as exc:
            caught.append(exc)
            raise

    run = start(behaviour, "p6", handler)
    report = drive(clock)
    assert caught and caught[0].reason == "job_step_reused" and "'same'" in str(caught[0])
    # A contract violation: retrying runs the same code again, so the run fails at once (P10).
    assert report.failed == 1 and report.retrying == 0
    run.refresh_from_db()
    assert "job_step_reused" in run.last_error and run.status == Status.FAILED and run.attempts == 1


@pytest.mark.parametrize(
    "column, text",
    [
        ("payload", "{not json"),
        ("cursor", "[1,"),
        ("counters", "nope"),
        ("counters", "[1, 2]"),
        ("counters", '{"n": "three"}'),
    ],
)
def test_p7_malformed_row_is_a_failed_pass_on_that_run_only(behaviour, clock, column, text):
    behaviour["bad"] = lambda p: {"cursor": 1}
    behaviour["good"] = lambda p: {"cursor": 1}
    bad, _ = start_job_run("tests.scripted", instance="bad")
    good, _ = start_job_run("tests.scripted", instance="good")
    JobRun.objects.filter(pk=bad.pk).update(**{column: text})
    report = drive(clock)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert report.retrying == 1 and report.advanced == 1
    assert bad.attempts == 1 and column in bad.last_error
    assert getattr(bad, column) == text, "the evidence is left as it was"
    assert json.loads(good.cursor) == 1


def test_p8_unused_completed_memos_are_reported(behaviour, clock, caplog):
    stamp = iter(["t1", "t2"])

    def handler(p):
        # A step name that is not a pure function of payload and prior results.
        name = f"fetch-{next(stamp)}"
        p.step(name, lambda: name)
        if name == "fetch-t1":
            raise ConnectionError("first try fails after the step completed")
        return {"cursor": 1}

    run = start(behaviour, "p8", handler)
    drive(clock)
    clock.advance(hours=1)
    with caplog.at_level(logging.WARNING, logger="django_jobruns"):
        report = drive(clock)
    run.refresh_from_db()
    assert report.advanced == 1
    assert len(report.warnings) == 1 and "fetch-t1" in report.warnings[0]
    assert "fetch-t1" in run.last_warning
    assert any("fetch-t1" in r.getMessage() for r in caplog.records)


def test_handler_result_missing_cursor_keeps_it_and_none_resets_it(behaviour, clock):
    results = iter([{"cursor": 5}, None, {}, {"cursor": None}])
    behaviour["keep"] = lambda p: next(results)
    run, _ = start_job_run("tests.scripted", instance="keep")
    cursors = []
    for _ in range(4):
        drive(clock)
        run.refresh_from_db()
        cursors.append(run.cursor)
    assert cursors == ["5", "5", "5", "null"]
    assert run.status == Status.RUNNING


@pytest.mark.parametrize(
    "result, message",
    [
        ({"cusor": 3}, r"'cusor' \(did you mean 'cursor'\?\)"),
        ({"done": "yes"}, "'done' must be True or False"),
        ([1], "returns None or a mapping"),
        ({"cursor": {1, 2}}, "cursor.*is a set"),
    ],
)
def test_bad_handler_result_fails_the_run_at_once_and_keeps_the_cursor(behaviour, clock, result, message):
    import re

    behaviour["typo"] = lambda p: result
    run, _ = start_job_run("tests.scripted", instance="typo")
    JobRun.objects.filter(pk=run.pk).update(cursor='"kept"')
    report = drive(clock)
    run.refresh_from_db()
    assert report.failed == 1 and report.retrying == 0 and run.status == Status.FAILED
    assert re.search(message, report.errors[0][1]), report.errors[0][1]
    assert "not retried" in run.last_error
    assert run.cursor == '"kept"'


def test_pass_sees_payload_run_and_read_only_counters(behaviour, clock):
    seen: dict[str, Any] = {}

    def handler(p):
        p.count("a", 2)
        seen.update(payload=p.payload, run=p.run, counters=dict(p.counters))
        with pytest.raises(TypeError):
            p.counters["a"] = 10
        return {"done": True}

    run = start(behaviour, "view", handler, payload={"supplier": 7})
    drive(clock)
    assert seen["payload"] == {"supplier": 7}
    assert (seen["run"].id, seen["run"].module, seen["run"].job, seen["run"].instance) == (
        run.id,
        "tests",
        "scripted",
        "view",
    )
    assert seen["counters"] == {"a": 2}


def test_step_returning_nothing_is_stored_as_json_null_and_counts_as_completed(behaviour, clock):
    calls = []

    def handler(p):
        p.step("effect-only", lambda: calls.append("ran"))
        if len(calls) == 1 and "failed once" not in calls:
            calls.append("failed once")
            raise RuntimeError("fail after the step")
        return {"done": True}

    run = start(behaviour, "null", handler)
    drive(clock)
    assert JobStep.objects.get(run=run, step="effect-only").result == "null"
    clock.advance(hours=1)
    assert drive(clock).completed == 1
    assert calls == ["ran", "failed once"]


def test_step_result_without_a_json_form_fails_the_step_with_a_clear_message(behaviour, clock):
    def handler(p):
        p.step("odd", lambda: object())
        return {"done": True}

    run = start(behaviour, "nojson", handler)
    report = drive(clock)
    assert report.failed == 1 and report.retrying == 0
    assert "step 'odd' returned object, which has no JSON form" in report.errors[0][1]
    step = JobStep.objects.get(run=run, step="odd")
    assert step.result is None and step.attempts == 1


def test_a_step_result_over_the_cap_fails_the_run_at_once_naming_the_cap(behaviour, clock, settings):
    settings.JOBRUNS = {"STEP_RESULT_MAX_BYTES": 1000}
    bodies: list[str] = []

    def handler(p):
        p.step("big", lambda: bodies.append("big") or "x" * 2000)
        return {"done": True}

    run = start(behaviour, "big-result", handler)
    report = drive(clock)
    assert report.failed == 1 and report.retrying == 0 and bodies == ["big"]
    assert (
        "step 'big' returned 2002 bytes as JSON, over the cap of 1000 (JOBRUNS['STEP_RESULT_MAX_BYTES'])"
        in (report.errors[0][1])
    )
    run.refresh_from_db()
    assert run.status == Status.FAILED


@pytest.mark.skipif("connection.vendor != 'mysql'", reason="max_allowed_packet is MariaDB's and MySQL's")
@pytest.mark.django_db(transaction=True)
def test_a_step_result_the_database_refuses_fails_the_run_instead_of_looping(behaviour, clock, settings):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT @@max_allowed_packet")
        (packet,) = cur.fetchone()
    settings.JOBRUNS = {"STEP_RESULT_MAX_BYTES": 4 * packet}
    bodies: list[str] = []

    def handler(p):
        p.step("huge", lambda: bodies.append("huge") or "x" * (2 * packet))
        return {"done": True}

    run = start(behaviour, "huge-result", handler)
    for _ in range(3):
        drive(clock)
        clock.advance(hours=2)
    run.refresh_from_db()
    assert bodies == ["huge"], "the body ran once"
    assert run.status == Status.FAILED and "the database refused step 'huge'" in run.last_error
