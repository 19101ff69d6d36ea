"""django_jobruns.testing: helpers for users' own tests."""

from __future__ import annotations

import pytest

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, Status
from django_jobruns.testing import assert_resumable, drive_to_completion
from tests import jobs

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_state():
    jobs.STATE.clear()
    yield
    jobs.STATE.clear()


def test_drive_to_completion_drives_one_run_through_its_retries(behaviour):
    attempts = []

    def handler(p):
        attempts.append(p.cursor)
        if len(attempts) == 2:
            raise ConnectionError("flaky")  # backoff of 60 s is skipped, not waited
        return {"cursor": (p.cursor or 0) + 1, "done": (p.cursor or 0) + 1 == 3}

    behaviour["dtc"] = handler
    behaviour["other"] = lambda p: {"done": True}
    run, _ = start_job_run("tests.scripted", instance="dtc")
    other, _ = start_job_run("tests.scripted", instance="other")
    finished = drive_to_completion(run)
    assert finished.status == Status.DONE and finished.cursor == "3" and attempts == [None, 1, 1, 2]
    assert JobRun.objects.get(pk=other.pk).status == Status.RUNNING, "only the given run was driven"


def test_drive_to_completion_says_when_a_run_does_not_finish(behaviour):
    behaviour["forever"] = lambda p: {"cursor": (p.cursor or 0) + 1}
    run, _ = start_job_run("tests.scripted", instance="forever")
    with pytest.raises(AssertionError, match="still running after 5 passes"):
        drive_to_completion(run, max_passes=5)


def test_assert_resumable_passes_a_right_job():
    assert_resumable(jobs.resumable)
    # Straight run plus one crash run per step boundary: 2 passes x 2 steps.
    assert JobRun.objects.filter(job="resumable", status=Status.DONE).count() == 1 + 4


def test_assert_resumable_catches_step_names_that_change_between_attempts():
    with pytest.raises(AssertionError) as caught:
        assert_resumable("tests.stamped_names")
    message = str(caught.value)
    assert "tests.stamped_names is not resumable" in message
    assert "crash after step 1 of 2: pass 1, step #1 was 'fetch@2' before the crash and 'fetch@3' after" in message
    assert "completed steps it never asked for: fetch@2" in message


def test_assert_resumable_catches_an_unused_memo():
    with pytest.raises(AssertionError) as caught:
        assert_resumable("tests.probing")
    assert "crash after step 1 of 2: pass committed with completed steps it never asked for: probe" in str(caught.value)


def test_assert_resumable_catches_a_final_state_that_differs():
    with pytest.raises(AssertionError, match=r"final cursor \d+ differs from the straight run's 1"):
        assert_resumable("tests.outside_state")


def test_assert_resumable_catches_a_completed_step_that_runs_again():
    """If memos were lost, the helper would say so: empty the ledger before every claim and watch it fail."""
    from django.db import connection

    from django_jobruns.models import JobStep

    ledger = connection.ops.quote_name(JobStep._meta.db_table)

    def forget_the_ledger(execute, sql, params, many, context):
        # A claim sets the holder: every resume then starts its pass afresh.
        if sql.startswith(("UPDATE", "WITH claimed")) and "lease_holder" in sql.split("WHERE")[0]:
            execute(f"DELETE FROM {ledger}", None, False, context)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(forget_the_ledger), pytest.raises(AssertionError) as caught:
        assert_resumable(jobs.resumable)
    assert "pass 1, step #1 'fetch:0' ran again after it had completed" in str(caught.value)


def test_drive_to_completion_fails_with_the_runs_last_error_unless_failure_is_allowed(behaviour):
    behaviour["doomed"] = lambda p: (_ for _ in ()).throw(ValueError("supplier 9 is gone"))
    run, _ = start_job_run("tests.scripted", instance="doomed")
    with pytest.raises(AssertionError, match=r"failed: ValueError: supplier 9 is gone"):
        drive_to_completion(run)
    failed = drive_to_completion(run, allow_failure=True)
    assert failed.status == Status.FAILED and "supplier 9 is gone" in failed.last_error


def test_the_drive_hook_sees_passes_and_steps_and_can_abandon_a_pass(behaviour):
    """``PassObserver`` / ``observing``: the documented hook the helpers use, usable by a project's own tools."""
    from django_jobruns.drive import PassObserver, observing
    from django_jobruns.passes import AbandonPass

    ran = []

    def handler(p):
        first = p.step("a", lambda: ran.append("a") or 1)
        second = p.step("b", lambda: ran.append("b") or 2)
        return {"cursor": first + second, "done": True}

    class Crash(AbandonPass):
        pass

    class Watcher(PassObserver):
        def __init__(self):
            self.seen = []

        def pass_started(self, run):
            self.seen.append(("start", run.instance))

        def step(self, p, name, body, perform):
            result = perform(body)
            self.seen.append(("step", name, result))
            if name == "a" and len(self.seen) == 2:
                raise Crash("after a's memo")
            return result

        def pass_ended(self, run, outcome):
            self.seen.append(("end", outcome.status))

    behaviour["hooked"] = handler
    run, _ = start_job_run("tests.scripted", instance="hooked")
    watcher = Watcher()
    with observing(watcher):
        with pytest.raises(Crash):
            drive_to_completion(run)
        finished = drive_to_completion(run)
    assert finished.status == Status.DONE and finished.cursor == "3"
    assert ran == ["a", "b"], "a's memo committed before the crash: not run again"
    assert watcher.seen == [
        ("start", "hooked"),
        ("step", "a", 1),
        ("start", "hooked"),
        ("step", "a", 1),
        ("step", "b", 2),
        ("end", "completed"),
    ]
    # Outside the block, nothing is observed.
    again, _ = start_job_run("tests.scripted", instance="hooked")
    drive_to_completion(again)
    assert len(watcher.seen) == 6


def test_assert_resumable_can_sample_its_crash_points_from_the_first_to_the_last(effects):
    payload = {"log": str(effects), "passes": 4, "steps": 5}  # 20 step boundaries
    assert_resumable("tests.walk", payload=payload, crash_points=3)
    crashed = set(JobRun.objects.filter(instance__contains=":crash-").values_list("instance", flat=True))
    assert len(crashed) == 3 and {"assert-resumable:crash-1", "assert-resumable:crash-20"} <= crashed, crashed


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_assert_resumable_refuses_a_crash_point_count_that_is_not_a_whole_number_of_one_or_more(bad):
    with pytest.raises(ValueError, match="crash_points must be a whole number of 1 or more"):
        assert_resumable(jobs.resumable, crash_points=bad)
