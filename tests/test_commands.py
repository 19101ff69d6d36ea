"""``manage.py run_due_jobs``: options, output, refusals, signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, Status
from tests.conftest import ROOT, call, effect_lines, manage, wait_until


def run_command(*args):
    out, err = StringIO(), StringIO()
    call_command("run_due_jobs", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_command_prints_a_one_line_summary(behaviour):
    behaviour["cmd"] = lambda p: {"done": True}
    start_job_run("tests.scripted", instance="cmd")
    out, _ = run_command()
    assert out.strip() == (
        "attempted=1 advanced=0 completed=1 retrying=0 failed=0 skipped=0 stale=0 lost=0 unreleased=0 stopped=no"
    )


@pytest.mark.django_db
def test_command_json_report_and_options(behaviour, effects):
    behaviour["j"] = lambda p: (_ for _ in ()).throw(RuntimeError("bad upstream"))
    failing, _ = start_job_run("tests.scripted", instance="j")
    walking, _ = start_job_run("tests.walk", instance="w", payload={"log": str(effects), "passes": 3})
    out, _ = run_command(
        "--json", "--limit", "5", "--max-passes", "2", "--holder", "cron-1", "--lease-ttl", "30", "--concurrency", "1"
    )
    report = json.loads(out)
    assert report["attempted"] == 2 and report["advanced"] == 2 and report["retrying"] == 1
    assert report["errors"] == [[failing.id, "RuntimeError: bad upstream"]]
    walking.refresh_from_db()
    assert walking.cursor == "2"
    out, _ = run_command("--json", "--job", "tests.walk", "--max-passes", "5")
    assert json.loads(out)["completed"] == 1
    assert JobRun.objects.get(pk=failing.pk).attempts == 1, "--job kept the drive to tests.walk"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args, message",
    [
        (["--holder", ""], "holder must be non-empty"),
        (["--job", "tests.nothing"], "no job is registered as 'tests.nothing'"),
    ],
)
def test_command_refuses_options_that_cannot_mean_what_they_say(args, message):
    with pytest.raises(CommandError, match=message):
        run_command(*args)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--limit", "0"], "expected a whole number from 1 to 10000"),
        (["--limit", "ten"], "expected a whole number, got 'ten'"),
        (["--limit", "1" + "0" * 30], "expected a whole number from 1 to 10000"),
        (["--concurrency", "0"], "expected a whole number from 1 to 256"),
        (["--concurrency", "100000"], "expected a whole number from 1 to 256"),
        (["--max-passes", "-1"], "expected a whole number from 1 to 1000000"),
        (["--lease-ttl", "0"], "expected a positive number of seconds"),
        (["--lease-ttl", "soon"], "expected a number of seconds"),
        (["--lease-ttl", "1e12"], "expected at most 604800 seconds"),
        (["--lease-ttl", "2"], "expected at least 5 seconds, got '2'"),
        (["--max-seconds", "nan"], "expected a positive number of seconds"),
        (["--max-seconds", "1e300"], "expected at most 86400 seconds"),
    ],
)
def test_command_line_refuses_bad_numbers_with_a_clear_message(args, message):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "run_due_jobs", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["run_due_jobs"],
        ["start_job_run", "tests.walk"],
        ["prune_job_runs", "--older-than", "3"],
    ],
)
def test_command_exits_non_zero_with_one_line_when_the_database_is_unreachable(tmp_path, command):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings",
        "DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere",
    }
    env.pop("JOBRUNS_TEST_DB_NAME", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("CommandError: cannot reach the database:"), proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["job_runs", "--instance", b"supplier-\xe9"],
        ["job_runs", b"01M\xe9"],
        ["cancel_job_run", b"01M\xe9", "--reason", "r"],
        ["start_job_run", "tests.walk", "--instance", b"supplier-\xe9"],
        ["run_due_jobs", "--holder", b"pod-\xe9"],
    ],
    ids=["job_runs --instance", "job_runs RUN_ID", "cancel_job_run", "start_job_run", "run_due_jobs --holder"],
)
def test_an_argument_with_a_byte_that_is_not_utf8_is_refused_in_one_line_naming_it(command):
    """A Latin-1 byte in cron's environment or a pod's name: Python reads it as a lone surrogate, no database
    stores it, and each command said so with the database driver's traceback."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings"}
    env.pop("JOBRUNS_TEST_DB_NAME", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *command], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    stderr = proc.stderr.decode("utf-8", "backslashreplace")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), stderr
    assert "\\udce9" in lines[0] and "is not valid Unicode text" in lines[0], stderr


@pytest.mark.django_db(transaction=True)
def test_a_drive_on_a_database_that_refuses_writes_stops_with_one_line(effects):
    """A read-only file or a standby: every claim fails alike, so the drive says so once and exits non-zero."""
    ids = [start_job_run("tests.walk", instance=f"ro{n}", payload={"log": str(effects)})[0].id for n in range(3)]
    worker = manage("run_due_jobs", "--max-seconds", "3", extra_env={"JOBRUNS_TEST_READ_ONLY": "1"})
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 1, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("CommandError: the database refuses writes"), err
    assert list(JobRun.objects.filter(pk__in=ids).values_list("attempts", "lease_holder").distinct()) == [(0, None)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_command_on_signal_finishes_the_pass_in_flight_releases_and_exits_zero(tmp_path, effects, signum):
    entered_fifo, release_fifo = tmp_path / "entered.fifo", tmp_path / "release.fifo"
    os.mkfifo(entered_fifo)
    os.mkfifo(release_fifo)
    payload = {"log": str(effects), "fifo": str(entered_fifo), "release": str(release_fifo)}
    runs = [
        start_job_run("tests.blocking", instance=f"sig{i}", payload={**payload, "marker": str(tmp_path / f"m{i}")})[0]
        for i in range(2)
    ]
    worker = manage("run_due_jobs", "--json", "--limit", "2")
    with open(entered_fifo) as entered:
        assert int(entered.readline()) == worker.pid
    worker.send_signal(signum)  # delivered while the worker is inside a step
    with open(release_fifo, "w"):
        pass  # now let the step finish
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    report = json.loads(out)
    assert report["stopped"] is True and report["attempted"] == 1 and report["completed"] == 1
    done, untouched = sorted((JobRun.objects.get(pk=r.pk) for r in runs), key=lambda r: r.status)
    assert done.status == Status.DONE and done.lease_holder is None
    assert untouched.status == Status.RUNNING and untouched.lease_fence == 0, "no new run was taken after the signal"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_first_signal_says_what_it_waits_for_and_a_second_stops_at_once(tmp_path, effects):
    entered_fifo, release_fifo = tmp_path / "entered.fifo", tmp_path / "release.fifo"
    os.mkfifo(entered_fifo)
    os.mkfifo(release_fifo)
    payload = {
        "log": str(effects),
        "fifo": str(entered_fifo),
        "release": str(release_fifo),
        "marker": str(tmp_path / "m"),
    }
    run, _ = start_job_run("tests.blocking", instance="twice", payload=payload)
    worker = manage("run_due_jobs", "--json", "--lease-ttl", "30")
    with open(entered_fifo) as entered:
        assert int(entered.readline()) == worker.pid
    worker.send_signal(signal.SIGINT)  # the step is blocked: the pass stays in flight
    import select

    assert select.select([worker.stderr], [], [], 60)[0], "the first signal said nothing"
    first = worker.stderr.readline()
    assert "stopping after the pass in flight (1 running); SIGINT again to stop at once" in first, first
    worker.send_signal(signal.SIGINT)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 128 + signal.SIGINT, (out, err)
    assert "stopping at once: 1 run(s) in flight keep their lease" in err, err
    run.refresh_from_db()
    # As after a kill: still leased to the stopped worker, nothing recorded; a takeover follows the lapse.
    assert run.status == Status.RUNNING and run.lease_holder is not None and run.attempts == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_command_max_seconds_keeps_working_waits_for_work_and_a_signal_ends_the_wait(effects):
    for i in range(3):
        start_job_run("tests.walk", instance=f"t{i}", payload={"log": str(effects), "passes": 3})
    worker = manage("run_due_jobs", "--json", "--max-seconds", "600")
    wait_until(lambda: JobRun.objects.filter(status=Status.DONE).count() == 3, "the first runs to finish")
    # Started while the drive waits for work: the same invocation takes it.
    late, _ = start_job_run("tests.walk", instance="late", payload={"log": str(effects), "passes": 2})
    wait_until(lambda: JobRun.objects.get(pk=late.pk).status == Status.DONE, "the late run to finish")
    worker.send_signal(signal.SIGTERM)  # ends the wait at once, far inside the 600 s budget
    out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    report = json.loads(out)
    # Every pass of every run in one invocation: with a budget, passes per run are not capped at 1.
    assert report["completed"] == 4 and report["advanced"] == 3 * 2 + 1 and report["stopped"] is True
    assert len(effect_lines(effects)) == (3 * 3 + 2) * 3


@pytest.mark.django_db
def test_start_job_run_command_starts_or_joins():
    out = call("start_job_run", "tests.walk", "--instance", "cli", "--payload", '{"log": "/dev/null", "n": [1, 2]}')
    run = JobRun.objects.get(instance="cli")
    assert out == f"started run {run.id}"
    assert json.loads(run.payload) == {"log": "/dev/null", "n": [1, 2]}
    assert call("start_job_run", "tests.walk", "--instance", "cli").startswith(f"joined live run {run.id}")
    call("start_job_run", "tests.walk")
    assert JobRun.objects.get(instance="default").payload == "null"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args, message",
    [
        (["tests.walk", "--payload", "{nope"], "--payload is not valid JSON"),
        (["tests.walk", "--payload", '{"ratio": NaN}'], "payload.ratio is nan"),
        (["tests.walk", "--payload", '{"x": [1, Infinity]}'], "payload.x.1 is inf"),
        (["tests.nothing"], "no job is registered as 'tests.nothing'"),
        (["walk"], "app_label.job_name"),
        (["tests.walk", "--instance", ""], "instance must be non-empty"),
    ],
)
def test_start_job_run_command_says_why_and_creates_nothing(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call("start_job_run", *args)
    assert not JobRun.objects.exists()


@pytest.mark.django_db
def test_command_defaults_come_from_the_settings(behaviour, settings):
    settings.JOBRUNS = {"DRIVE_LIMIT": 1, "LEASE_TTL": 42}
    held = []
    for i in range(2):
        behaviour[f"s{i}"] = lambda p: held.append(JobRun.objects.get(pk=p.run.id).lease_expires_at) or {"done": True}
        start_job_run("tests.scripted", instance=f"s{i}")
    before = timezone.now()
    out, _ = run_command("--json")
    assert json.loads(out)["attempted"] == 1
    assert timedelta(seconds=41) < held[0] - before < timedelta(seconds=43)


@pytest.mark.django_db
def test_steering_commands_act_on_runs_by_id_and_refuse_finished_ones():
    run, _ = start_job_run("tests.walk", instance="steer-cli")
    assert call("pause_job_run", run.pk) == f"Paused run {run.pk} (tests.walk [steer-cli], now paused)"
    assert call("unpause_job_run", run.pk).startswith(f"Unpaused run {run.pk}")
    assert call("retry_job_run_now", run.pk).startswith(f"Made due now run {run.pk}")
    assert call("cancel_job_run", run.pk, "--reason", "wrong supplier").endswith("now cancelled)")
    assert "wrong supplier" in JobRun.objects.get(pk=run.pk).last_error
    with pytest.raises(CommandError, match="1 run\\(s\\) could not be cancelled"):
        call("cancel_job_run", run.pk)


@pytest.mark.django_db
def test_start_job_run_says_when_the_live_run_keeps_a_different_payload():
    call("start_job_run", "tests.walk", "--instance", "p", "--payload", '{"log": "/dev/null", "v": 1}')
    err = StringIO()
    out = StringIO()
    call_command(
        "start_job_run",
        "tests.walk",
        "--instance",
        "p",
        "--payload",
        '{"log": "/dev/null", "v": 2}',
        stdout=out,
        stderr=err,
    )
    assert out.getvalue().startswith("joined live run") and "payload differs" in err.getvalue()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_due_jobs_prints_each_error_once_with_its_time():

    start_job_run("tests.walk", instance="dies", payload={"passes": 1, "steps": 1})  # no "log": a KeyError
    proc = manage("run_due_jobs")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = [line for line in err.splitlines() if "KeyError" in line and "pass failed" in line]
    assert len(lines) == 1, err
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", lines[0]), lines[0]


@pytest.mark.django_db(transaction=True)
def test_verbosity_zero_quiets_an_idle_drive_but_not_one_that_worked(effects):
    idle = call("run_due_jobs", "-v", "0")
    assert idle == ""
    start_job_run("tests.walk", payload={"log": str(effects)})
    assert "completed=1" in call("run_due_jobs", "-v", "0")


def test_start_job_run_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        call_command("start_job_run", "--help")
    text = capsys.readouterr().out
    for option in ("--instance", "--payload", "APP.NAME"):
        assert option in text
    assert "'default'" in text and "p.payload is None" in text


@pytest.mark.django_db(transaction=True)
def test_a_run_that_ends_failed_is_logged_as_an_error_a_retry_as_a_warning(behaviour, caplog):
    from django_jobruns import run_due_jobs
    from tests import jobs

    def boom(p):
        raise RuntimeError("upstream gone")

    jobs.BEHAVIOUR["doomed"] = boom
    start_job_run("tests.scripted", instance="doomed")
    with caplog.at_level("WARNING", logger="django_jobruns"):
        for day in range(1, 5):
            later = timezone.now() + timedelta(days=day)

            def clock(at: Any = later) -> Any:
                return at

            run_due_jobs(now=clock)
    levels = [r.levelname for r in caplog.records if "upstream gone" in r.getMessage()]
    assert levels and levels[-1] == "ERROR" and set(levels[:-1]) <= {"WARNING"}, levels


@pytest.mark.django_db
def test_a_join_with_another_payload_warns_once(caplog):
    run, _ = start_job_run("tests.walk", instance="joined", payload={"log": "/dev/null", "v": 1})
    with caplog.at_level("WARNING", logger="django_jobruns"):
        for v in (2, 3, 2):
            joined, created = start_job_run("tests.walk", instance="joined", payload={"log": "/dev/null", "v": v})
            assert joined.pk == run.pk and not created
    said = [r for r in caplog.records if "payload differs" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
