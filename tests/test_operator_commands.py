"""The operator's command line: ``job_runs`` (list, filter, show one) and ``restart_job_run``."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, JobSchedule, JobStep, Status
from tests.conftest import manage

pytestmark = pytest.mark.django_db


def call(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def failed(instance: str) -> JobRun:
    run, _ = start_job_run("tests.walk", instance=instance, payload={"log": "/dev/null"})
    now = timezone.now()
    JobRun.objects.filter(pk=run.pk).update(
        status=Status.FAILED,
        live=None,
        ended_at=now,
        last_error="UpstreamUnavailable: 503 from supplier\nTraceback ...",
        cursor="3",
        counters='{"imported": 30}',
    )
    run.refresh_from_db()
    return run


def test_job_runs_lists_runs_newest_first_with_status_job_age_progress_and_error():
    a, _ = start_job_run("tests.walk", instance="a", payload={"log": "/dev/null"})
    b = failed("b")
    lines = call("job_runs").splitlines()
    assert lines[0].startswith(b.id) and lines[1].startswith(a.id)
    assert "failed" in lines[0] and "tests.walk [b]" in lines[0] and "just now" in lines[0]
    assert "imported=30" in lines[0] and "UpstreamUnavailable: 503 from supplier" in lines[0]
    assert "Traceback" not in lines[0]


def test_job_runs_filters_by_status_job_instance_and_state_and_prints_json():
    live, _ = start_job_run("tests.walk", instance="live", payload={"log": "/dev/null"})
    dead = failed("dead")
    JobRun.objects.filter(pk=live.pk).update(paused_at=timezone.now())
    assert dead.id in call("job_runs", "--status", "failed") and live.id not in call("job_runs", "--status", "failed")
    assert call("job_runs", "--instance", "live").startswith(live.id)
    paused = call("job_runs", "--state", "paused")
    assert live.id in paused and "(paused)" in paused and dead.id not in paused
    assert call("job_runs", "--job", "tests.other") == "no runs\n"
    records = json.loads(call("job_runs", "--json", "--job", "tests.walk"))
    assert [r["id"] for r in records] == [dead.id, live.id]
    assert records[0]["counters"] == {"imported": 30} and records[1]["paused_at"] is not None
    with pytest.raises(CommandError, match="app_label.job_name"):
        call("job_runs", "--job", "walk")


def test_job_runs_shows_one_run_decoded_with_its_ledger_and_lineage():
    run = failed("one")
    JobStep.objects.create(run=run, step="fetch:3", result=None, attempts=2, last_error="503", recorded_at=run.ended_at)
    call("restart_job_run", run.id)
    text = call("job_runs", run.id.lower())
    assert "status: failed" in text and '"imported": 30' in text and "UpstreamUnavailable" in text
    assert "fetch:3: not completed (2 attempt(s))" in text
    restarted = JobRun.objects.get(restarted_from_id=run.id)
    assert f"restarted as: {restarted.id}" in text
    shown = json.loads(call("job_runs", run.id, "--json"))
    assert shown["ledger"][0]["step"] == "fetch:3" and shown["restarts"] == [restarted.id]
    with pytest.raises(CommandError, match="no run has the id"):
        call("job_runs", "0" * 26)


def test_restart_job_run_restarts_or_resumes_once_and_names_the_successor():
    run = failed("again")
    out = call("restart_job_run", run.id)
    successor = JobRun.objects.get(restarted_from_id=run.id)
    assert f"restarted run {run.id} as run {successor.id}" in out and successor.cursor is None
    assert f"its successor run {successor.id} is live" in call("restart_job_run", run.id)
    other = failed("resumed")
    call("restart_job_run", other.id, "--resume")
    resumed = JobRun.objects.get(restarted_from_id=other.id)
    assert resumed.cursor == "3" and json.loads(resumed.counters) == {"imported": 30}
    live, _ = start_job_run("tests.walk", instance="live-one", payload={"log": "/dev/null"})
    with pytest.raises(CommandError, match="only a failed run can be restarted"):
        call("restart_job_run", live.id)


@pytest.mark.django_db(transaction=True)
def test_the_commands_run_as_an_operator_types_them():
    run = failed("typed")
    listing = manage("job_runs", "--status", "failed")
    out, err = listing.communicate(timeout=60)
    assert listing.returncode == 0 and run.id in out, err
    restart = manage("restart_job_run", run.id)
    out, err = restart.communicate(timeout=60)
    assert restart.returncode == 0 and "restarted run" in out, err


def test_retry_now_on_a_paused_run_says_it_stays_paused_and_exits_non_zero():
    run, _ = start_job_run("tests.walk", instance="held", payload={"log": "/dev/null"})
    JobRun.objects.filter(pk=run.pk).update(
        paused_at=timezone.now(), next_attempt_at=timezone.now(), due_at=timezone.now()
    )
    err = StringIO()
    with pytest.raises(CommandError, match="could not be made due now"):
        call_command("retry_job_run_now", run.id, stdout=StringIO(), stderr=err)
    assert f"run {run.id} stays paused" in err.getvalue()


def test_a_steering_refusal_names_the_run_once():
    run = failed("finished")
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("cancel_job_run", run.id, stdout=StringIO(), stderr=err)
    line = err.getvalue().strip()
    assert line.count(run.id) == 1 and "only a live run can be cancelled" in line, line


def health(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("job_runs", "--health", *args, stdout=out, stderr=err)
        code = 0
    except CommandError as exc:
        err.write(str(exc))
        code = 1
    return code, out.getvalue(), err.getvalue()


def test_health_is_quiet_and_zero_on_a_healthy_queue():
    start_job_run("tests.walk", instance="fresh", payload={"log": "/dev/null"})
    code, out, err = health("--max-lag", "60")
    assert code == 0 and out.startswith("healthy: 1 running, 1 due"), (out, err)


def test_health_with_nothing_due_says_nothing_waits_not_a_wait_of_zero():
    code, out, err = health()
    assert code == 0 and out.strip() == "healthy: 0 running, 0 due, nothing waiting", (out, err)
    report = json.loads(health("--json")[1])
    assert report["oldest_due_wait_seconds"] is None and report["oldest_due_run"] is None


def test_health_fails_when_the_oldest_due_run_waited_past_the_lag():
    run, _ = start_job_run("tests.walk", instance="stuck", payload={"log": "/dev/null"})
    ten_minutes_ago = timezone.now() - timedelta(minutes=10)
    JobRun.objects.filter(pk=run.pk).update(started_at=ten_minutes_ago, due_at=ten_minutes_ago)
    code, out, err = health("--max-lag", "60")
    assert code == 1 and f"the oldest due run ({run.id}) has waited" in err, err
    report = json.loads(health("--max-lag", "60", "--json")[1])
    assert report["healthy"] is False and report["oldest_due_run"] == run.id
    assert report["oldest_due_wait_seconds"] > 590
    assert health("--max-lag", "3600")[0] == 0


def test_health_fails_when_a_lapsed_lease_was_never_taken_over():
    run, _ = start_job_run("tests.walk", instance="orphaned", payload={"log": "/dev/null"})
    JobRun.objects.filter(pk=run.pk).update(
        lease_holder="gone:1:x", lease_fence=1, lease_expires_at=timezone.now() - timedelta(minutes=10)
    )
    code, out, err = health("--max-lag", "60")
    assert code == 1 and "lease that lapsed over 60 s ago and no drive took them over" in err and run.id in err


@pytest.mark.django_db(transaction=True)
def test_health_fails_when_the_database_cannot_be_reached():
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "tests.support.settings",
        "DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "job_runs", "--health", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "cannot reach the database" in done.stderr, done.stderr
    assert json.loads(done.stdout)["healthy"] is False


@pytest.mark.parametrize("value", ["inf", "1e300", "nan", "-1", "0", "soon"])
def test_health_refuses_a_lag_that_is_not_a_finite_positive_number_in_one_line(value):
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "job_runs", "--health", "--max-lag", value],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "tests.support.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--max-lag" in done.stderr and value in done.stderr, done.stderr


def test_job_runs_lines_up_its_columns_whatever_their_widths():
    start_job_run("tests.walk", instance="a", payload={"log": "/dev/null"})
    paused, _ = start_job_run("tests.walk", instance="a-much-longer-instance", payload={"log": "/dev/null"})
    from django_jobruns import pause_job_run

    pause_job_run(paused)
    lines = call("job_runs").splitlines()
    assert len(lines) == 2
    starts = [line.index("just now") for line in lines]  # the age column starts alike on every line
    assert starts[0] == starts[1], lines
    assert all("\xa0" not in line for line in lines)


def test_health_fails_when_a_schedules_tick_waited_past_the_lag_to_start_and_a_paused_one_does_not():
    """Periodic work only, and no drive looking (cron broken): the schedules' due tick says so."""
    from django.test import override_settings

    from django_jobruns import schedules

    spec = {"nightly": {"job": "tests.walk", "cron": "0 3 * * *", "timezone": "UTC", "instance": "nightly"}}
    schedules.forget_sync()
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        schedules.sync(timezone.now() - timedelta(days=1, minutes=10))  # last looked at a day ago
        tick = JobSchedule.objects.get(name="nightly").next_tick
        code, out, err = health("--max-lag", "60")
        assert code == 1 and f"schedule 'nightly': its tick at {tick.isoformat()} has waited" in err, (out, err)
        report = json.loads(health("--max-lag", "60", "--json")[1])
        assert report["late_schedule"] == "nightly" and report["late_tick_wait_seconds"] > 590
        schedules.pause("nightly")
        code, out, err = health("--max-lag", "60")
        assert code == 0 and json.loads(health("--json")[1])["late_schedule"] is None, (out, err)
    schedules.forget_sync()
