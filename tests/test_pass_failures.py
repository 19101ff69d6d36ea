"""Failures a pass records and lets go: exits, unprintable and unstorable errors, GiveUp (P9-P11)."""

from __future__ import annotations

import sys

import pytest
from django.db import connection, transaction

from django_jobruns import GiveUp, RetryPolicy, run_due_jobs, start_job_run
from django_jobruns.models import JobRun, JobStep, Status
from tests import jobs
from tests.conftest import effect_lines

pytestmark = pytest.mark.django_db(transaction=True)


# A's step record: the heartbeat (MariaDB) or the heartbeat-and-insert statement (PostgreSQL);
# B's takeover claim, which charges the silent pass.


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_a_step_that_exits_is_recorded_and_does_not_starve_the_runs_behind_it(exc, clock):
    def exits(p):
        p.step("leave", lambda: (_ for _ in ()).throw(exc))
        return {"done": True}

    jobs.BEHAVIOUR["exits"] = exits
    jobs.BEHAVIOUR["behind"] = lambda p: {"done": True}
    first, _ = start_job_run("tests.scripted", instance="exits")
    behind, _ = start_job_run("tests.scripted", instance="behind")
    with pytest.raises(type(exc)):
        run_due_jobs(now=clock, limit=5)
    recorded = JobRun.objects.get(pk=first.pk)
    assert recorded.status == Status.RUNNING and recorded.attempts == 1
    assert recorded.last_error.startswith(f"step 'leave' failed (attempt 1 of 3): {type(exc).__name__}")
    assert recorded.lease_holder is None and recorded.next_attempt_at > clock.now
    assert JobStep.objects.get(run=first, step="leave").attempts == 1
    # The next drive goes on with the run behind it; the one that exited waits out its backoff.
    report = run_due_jobs(now=clock, limit=5)
    assert report.completed == 1 and JobRun.objects.get(pk=behind.pk).status == Status.DONE


def test_a_handler_that_calls_sys_exit_is_recorded_and_the_exit_goes_on():
    run, _ = start_job_run("tests.scripted", instance="sysexit")
    jobs.BEHAVIOUR["sysexit"] = lambda p: sys.exit(4)
    with pytest.raises(SystemExit) as caught:
        run_due_jobs()
    assert caught.value.code == 4
    after = JobRun.objects.get(pk=run.pk)
    assert after.attempts == 1 and after.last_error.startswith("SystemExit: 4") and after.lease_holder is None


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.parametrize(
    "error, expect",
    [
        (ValueError("bad\x00byte"), "ValueError: bad\\x00byte"),
        (ValueError("lone \udc80 surrogate"), "ValueError: lone \\udc80 surrogate"),
        (Unprintable(), "Unprintable (its message could not be printed)"),
        (ValueError("x" * 5_000_000), "ValueError: xxx"),
    ],
    ids=["nul", "surrogate", "unprintable", "megabytes"],
)
def test_every_failure_is_recordable_and_the_steps_own_policy_applies(error, expect, clock):
    def handler(p):
        p.step("upstream", lambda: (_ for _ in ()).throw(error), retry=RetryPolicy(max_attempts=1))
        return {"done": True}

    jobs.BEHAVIOUR["unstorable"] = handler
    run, _ = start_job_run("tests.scripted", instance="unstorable")
    report = run_due_jobs(now=clock)
    after = JobRun.objects.get(pk=run.pk)
    # The step's policy allows one attempt: the run fails now, with the error as it could be stored.
    assert report.failed == 1 and report.unrecorded == []
    assert after.status == Status.FAILED and after.attempts == 1
    assert expect in after.last_error and len(after.last_error) <= 10_000
    step = JobStep.objects.get(run=run, step="upstream")
    assert step.attempts == 1 and expect in step.last_error and len(step.last_error) <= 10_000


def test_a_step_inside_the_handlers_own_transaction_is_refused(effects, clock):
    def handler(p):
        with transaction.atomic():
            p.step("inside", lambda: jobs.effect(str(effects), "run", "inside"))
        return {"done": True}

    jobs.BEHAVIOUR["atomic"] = handler
    run, _ = start_job_run("tests.scripted", instance="atomic")
    report = run_due_jobs(now=clock)
    after = JobRun.objects.get(pk=run.pk)
    assert report.failed == 1 and after.status == Status.FAILED
    assert "inside a transaction the handler opened" in after.last_error
    assert effect_lines(effects) == []


def _written_inside() -> None:
    # Not in an atomic block: on SQLite, leaving the outermost savepoint commits.
    JobRun.objects.filter(instance="leaves").update(payload='{"written": "inside"}')


def _leaves_autocommit_off() -> None:
    transaction.set_autocommit(False)
    _written_inside()


def _begins_without_ending() -> None:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
    _written_inside()


@pytest.mark.parametrize(
    "where, body",
    [
        ("step", _leaves_autocommit_off),
        ("handler", _leaves_autocommit_off),
        ("step", _begins_without_ending),
        ("handler", _begins_without_ending),
    ],
    ids=["step-autocommit-off", "handler-autocommit-off", "step-raw-begin", "handler-raw-begin"],
)
def test_a_body_that_leaves_a_transaction_open_fails_its_run_and_the_runs_behind_it_commit(where, body, clock):
    """Left open, the transaction would swallow the pass's commit and every write of the drive after it
    (the report counting them done); the body's own writes in it are rolled back, not committed for it."""
    if body is _begins_without_ending and connection.vendor == "mysql":
        pytest.skip("MySQL's client does not say, without asking the server, that a transaction is open")

    def leaves(p):
        if where == "step":
            p.step("open", lambda: body() or 1)
        else:
            body()
        return {"done": True}

    jobs.BEHAVIOUR["leaves"] = leaves
    jobs.BEHAVIOUR["behind"] = lambda p: {"done": True}
    left, _ = start_job_run("tests.scripted", instance="leaves")
    behind, _ = start_job_run("tests.scripted", instance="behind")
    report = run_due_jobs(now=clock, limit=5)
    assert connection.get_autocommit()
    connection.close()  # what was not committed is gone: read what is durable
    assert (report.failed, report.completed) == (1, 1), report
    after = JobRun.objects.get(pk=left.pk)
    assert after.status == Status.FAILED and after.lease_holder is None
    assert "left a database transaction open" in after.last_error
    assert JobRun.objects.get(pk=behind.pk).status == Status.DONE
    assert after.payload == "null"  # the body's write, rolled back


def test_a_step_or_a_count_called_after_its_pass_ended_is_refused_not_silently_lost(clock):
    kept = []

    def handler(p):
        kept.append(p)
        return {"done": True}

    jobs.BEHAVIOUR["late"] = handler
    start_job_run("tests.scripted", instance="late")
    assert run_due_jobs(now=clock).completed == 1
    from django_jobruns.exceptions import StepOutsidePass

    with pytest.raises(StepOutsidePass, match="after its pass ended"):
        kept[0].step("late", lambda: 1)
    with pytest.raises(StepOutsidePass, match=r"count\('late'\) was called after its pass ended"):
        kept[0].count("late")


@pytest.mark.parametrize("where", ["step", "handler"])
def test_give_up_fails_the_run_at_once_whatever_the_policy(where, clock):
    def handler(p):
        if where == "step":
            p.step(
                "lookup",
                lambda: (_ for _ in ()).throw(GiveUp("supplier 7 no longer exists")),
                retry=RetryPolicy(max_attempts=50),
            )
        raise GiveUp("supplier 7 no longer exists")

    jobs.BEHAVIOUR[f"giveup-{where}"] = handler
    run, _ = start_job_run("tests.scripted", instance=f"giveup-{where}")
    report = run_due_jobs(now=clock)
    after = JobRun.objects.get(pk=run.pk)
    assert report.failed == 1 and report.retrying == 0
    assert after.status == Status.FAILED and after.attempts == 1
    assert "GiveUp: supplier 7 no longer exists" in after.last_error


@pytest.mark.django_db
def test_a_runs_failed_passes_over_its_life_are_kept_after_it_is_done(behaviour, clock, admin_client):
    """``attempts`` counts the current pass's failures (reset by a commit); ``failed_passes`` never resets."""
    from django.urls import reverse

    failures = iter([RuntimeError("503"), RuntimeError("503 again"), None, RuntimeError("timeout"), None])

    def flaky(p):
        failure = next(failures)
        if failure is not None:
            raise failure
        return {"cursor": (p.cursor or 0) + 1, "done": p.cursor == 1}

    behaviour["flaky-life"] = flaky
    run, _ = start_job_run("tests.scripted", instance="flaky-life")
    while JobRun.objects.get(pk=run.pk).status == Status.RUNNING:
        run_due_jobs(now=clock)
        clock.advance(hours=1)
    run.refresh_from_db()
    assert run.status == Status.DONE and run.attempts == 0
    assert run.failed_passes == 3
    listing = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist")).content.decode()
    assert 'class="field-attempts_and_next">3' in listing or ">3 failed" in listing, listing
    page = admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[run.pk])).content.decode()
    assert "Failed passes" in page


def test_counters_past_the_payload_cap_fail_the_run_at_once_naming_it_and_keep_what_was_committed(
    behaviour, clock, settings
):
    """One counter name per item grows the run's counters without end: past the cap (that of the cursor
    committed beside them) the run fails at once, its committed counters kept, never a pass too large to record."""
    settings.JOBRUNS = {"PAYLOAD_MAX_BYTES": 4096}

    def per_item(p):
        start = p.cursor or 0
        p.step(f"page:{start}", lambda: start)
        for item in range(start, start + 50):
            p.count(f"sku-{item:08d}")  # a name per item: what a total would say in one
        return {"cursor": start + 50}

    behaviour["per-item"] = per_item
    run, _ = start_job_run("tests.scripted", instance="per-item")
    reports = [run_due_jobs(now=clock, max_passes=10) for _ in range(2)]
    run.refresh_from_db()
    assert run.status == Status.FAILED, (run.status, run.last_error)
    assert "counters are" in run.last_error and "JOBRUNS['PAYLOAD_MAX_BYTES']" in run.last_error, run.last_error
    assert "not retried" in run.last_error
    committed = run.counters_value
    assert 0 < len(committed) < 4096 / 10 and run.cursor_value == len(committed)  # the passes that fitted
    assert sum(r.failed for r in reports) == 1 and all(r.unrecorded == [] for r in reports), reports
