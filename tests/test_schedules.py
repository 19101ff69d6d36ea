"""Schedules (S1-S5): each tick starts once however many drives look, missed ticks once, cron's daylight saving."""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections
from django.test import override_settings

from django_jobruns import run_due_jobs, schedule_specs, schedules
from django_jobruns.checks import check_schedules
from django_jobruns.models import JobRun, JobSchedule, Status
from tests.conftest import call, manage

PARIS = ZoneInfo("Europe/Paris")
#: Every minute of every hour, listed: cron reads it; at 237 characters the schedule's row cannot hold it.
LONG_CRON = f"{','.join(map(str, range(60)))} {','.join(map(str, range(24)))} * * *"
#: A task of this backend the schedules start.
TASK = "tests.support.task_functions.add"


def every(cron: str, **extra: object) -> dict[str, object]:
    return {"nightly": {"job": "tests.walk", "cron": cron, "timezone": "UTC", "instance": "nightly", **extra}}


class Clock:
    def __init__(self, at: datetime) -> None:
        self.now = at

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(autouse=True)
def _fresh_sync():
    schedules.forget_sync()
    schedules._said.clear()
    yield
    schedules.forget_sync()
    schedules._said.clear()


def runs_of(instance: str) -> list[JobRun]:
    return list(JobRun.objects.filter(job="walk", instance=instance).order_by("id"))


@pytest.mark.django_db
def test_a_tick_starts_its_run_once_and_missed_ticks_start_once(effects):
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    with override_settings(JOBRUNS={"SCHEDULES": every("0 * * * *", payload={"log": str(effects), "passes": 1})}):
        assert run_due_jobs(now=clock).ticks == 0 and runs_of("nightly") == []
        row = JobSchedule.objects.get(name="nightly")
        assert row.next_tick == datetime(2026, 6, 1, 3, 0, tzinfo=UTC) and row.target == "job tests.walk"

        clock.now = datetime(2026, 6, 1, 3, 0, 30, tzinfo=UTC)
        report = run_due_jobs(now=clock)
        assert report.ticks == 1 and report.completed == 1, report  # started and driven in the same round
        assert run_due_jobs(now=clock).ticks == 0, "the same tick never starts twice"

        clock.now = datetime(2026, 6, 1, 6, 10, tzinfo=UTC)  # nothing drove at 4, 5 and 6 o'clock
        assert run_due_jobs(now=clock).ticks == 1
        assert run_due_jobs(now=clock).ticks == 0
    row = JobSchedule.objects.get(name="nightly")
    assert row.last_tick == datetime(2026, 6, 1, 6, 0, tzinfo=UTC), "the latest of the missed ticks"
    assert row.next_tick == datetime(2026, 6, 1, 7, 0, tzinfo=UTC) and row.ticks == 2
    assert [run.status for run in runs_of("nightly")] == [Status.DONE, Status.DONE]
    assert row.last_run_id == runs_of("nightly")[-1].id


@pytest.mark.django_db
def test_a_tick_whose_previous_run_is_live_joins_it_and_is_counted(behaviour):
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    slow = {"slow": {"job": "tests.scripted", "cron": "*/10 * * * *", "timezone": "UTC", "instance": "slow"}}
    behaviour["slow"] = lambda p: {"cursor": (p.cursor or 0) + 1}  # never done
    with override_settings(JOBRUNS={"SCHEDULES": slow}):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=1, seconds=1)
        first = run_due_jobs(now=clock)
        clock.now += timedelta(minutes=10)
        second = run_due_jobs(now=clock)
    assert (first.ticks, first.ticks_joined, second.ticks, second.ticks_joined) == (1, 0, 0, 1)
    row = JobSchedule.objects.get(name="slow")
    assert (row.ticks, row.joined) == (1, 1)
    (run,) = JobRun.objects.filter(job="scripted", instance="slow")
    assert row.last_run_id == run.id and run.status == Status.RUNNING


def task_every_minute(cron: str = "* * * * *") -> dict[str, object]:
    """A task's schedule: tasks are not coalesced, so only the compare-and-set keeps a tick to one start."""
    return {"nightly": {"task": "tests.support.task_functions.add", "cron": cron, "timezone": "UTC", "args": [1, 2]}}


@pytest.mark.parametrize("kind", ["job", "task"])
@pytest.mark.django_db(transaction=True)
def test_each_tick_starts_once_however_many_drives_look_at_once(effects, kind):
    """Eight threads, each its own connection, look at the same due tick at the same moment: one start."""
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = every("* * * * *", payload={"log": str(effects), "passes": 1}) if kind == "job" else task_every_minute()
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        schedules.sync(clock())
        clock.now = datetime(2026, 6, 1, 3, 0, 5, tzinfo=UTC)
        barrier = threading.Barrier(8)
        started: list[int] = []
        failures: list[BaseException] = []

        def look() -> None:
            try:
                barrier.wait()
                ticks = schedules.fire_due(clock())
                started.append(ticks.started)
            except BaseException as exc:  # reported below
                failures.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=look) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == [] and sum(started) == 1, (failures, started)
    row = JobSchedule.objects.get(name="nightly")
    assert (row.ticks, row.joined) == (1, 0), "one start, and no other drive even tried it"
    assert JobRun.objects.count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_each_tick_starts_once_however_many_worker_processes_drive_at_once(tmp_path):
    """Six ``run_due_jobs`` processes started together on a due tick: one task enqueued, run once.

    The processes read the real clock, so the schedule's next tick must not fall due while they run:
    every minute, processes whose looks straddled a minute's turn rightly started that minute's tick
    too (a second tick, not the first twice). Once a year, the tick made due by hand is the only one.
    """
    spec = task_every_minute(cron="0 0 1 1 *")
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        schedules.sync(datetime.now(UTC))
    # Due now, whatever the minute: the tick a minute ago.
    JobSchedule.objects.filter(name="nightly").update(next_tick=datetime.now(UTC) - timedelta(minutes=1))
    os.mkfifo(tmp_path / "ready.fifo")
    os.mkfifo(tmp_path / "go.fifo")
    env = {"JOBRUNS_TEST_SCHEDULES": json.dumps(spec), "JOBRUNS_TEST_GATE": str(tmp_path)}
    workers = [manage("run_due_jobs", "--json", extra_env=env) for _ in range(6)]
    ready: set[int] = set()
    while len(ready) < len(workers):  # each worker is at the gate
        with open(tmp_path / "ready.fifo") as announced:
            ready.update(int(line) for line in announced)
    gate = os.open(tmp_path / "go.fifo", os.O_WRONLY)  # all of them go at once
    reports = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err
            reports.append(json.loads(out))
    finally:
        os.close(gate)
    assert sum(report["ticks"] for report in reports) == 1, reports
    (run,) = JobRun.objects.all()
    assert run.status == Status.DONE and json.loads(run.cursor) == 3
    row = JobSchedule.objects.get(name="nightly")
    assert (row.ticks, row.joined) == (1, 0)


def ticks_between(cron: str, zone: str, start: datetime, end: datetime) -> list[str]:
    schedule = schedule_specs.parse("s", {"job": "tests.walk", "cron": cron, "timezone": zone})
    found, at = [], start
    while (at := schedule.next_after(at)) < end:
        found.append(at.astimezone(ZoneInfo(zone)).strftime("%H:%M%z"))
    return found


def test_a_time_of_day_the_spring_change_skips_runs_once_right_after_it_as_cron_does():
    # Europe/Paris, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that night.
    day = ticks_between(
        "30 2 * * *", "Europe/Paris", datetime(2026, 3, 27, 12, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC)
    )
    assert day == ["02:30+0100", "03:00+0200", "02:30+0200"]
    half_hours = ticks_between(
        "*/30 * * * *", "Europe/Paris", datetime(2026, 3, 29, 0, 0, tzinfo=UTC), datetime(2026, 3, 29, 2, 0, tzinfo=UTC)
    )
    assert half_hours == ["01:30+0100", "03:00+0200", "03:30+0200"], "the skipped hour's ticks start once, after it"


def test_a_time_of_day_in_the_repeated_autumn_hour_runs_once_and_intervals_keep_their_real_length():
    # Europe/Paris, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00-02:59 happens twice.
    day = ticks_between(
        "30 2 * * *", "Europe/Paris", datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 27, tzinfo=UTC)
    )
    assert day == ["02:30+0200", "02:30+0100"], "once on the night of the change (its first 02:30), once the next"
    half_hours = ticks_between(
        "*/30 * * * *",
        "Europe/Paris",
        datetime(2026, 10, 24, 23, 15, tzinfo=UTC),
        datetime(2026, 10, 25, 2, 15, tzinfo=UTC),
    )
    assert half_hours == ["01:30+0200", "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100", "03:00+0100"]


@pytest.mark.django_db
def test_drives_across_both_changes_of_a_real_zone_start_each_tick_once(effects):
    """A daily 02:30 in Paris, driven every ten minutes through both nights of change: one run a day."""
    spec = {
        "paris": {
            "job": "tests.walk",
            "cron": "30 2 * * *",
            "timezone": "Europe/Paris",
            "instance": "paris",
            "payload": {"log": str(effects), "passes": 1},
        }
    }
    for night in (datetime(2026, 3, 28, 20, tzinfo=UTC), datetime(2026, 10, 24, 20, tzinfo=UTC)):
        JobRun.objects.filter(instance="paris").delete()
        JobSchedule.objects.all().delete()
        schedules.forget_sync()
        clock = Clock(night)
        with override_settings(JOBRUNS={"SCHEDULES": spec}):
            while clock.now < night + timedelta(hours=12):
                run_due_jobs(now=clock)
                clock.now += timedelta(minutes=10)
        assert len(runs_of("paris")) == 1, night


@pytest.mark.django_db
def test_a_schedule_removed_from_settings_stops_and_says_so_and_its_runs_are_kept(effects):
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = every("* * * * *", payload={"log": str(effects), "passes": 1})
    other = {"other": {"job": "tests.walk", "cron": "0 0 1 1 *", "timezone": "UTC", "instance": "other"}}
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=2)
        assert run_due_jobs(now=clock).ticks == 1
    with override_settings(JOBRUNS={"SCHEDULES": other}):
        clock.now += timedelta(minutes=5)
        assert run_due_jobs(now=clock).ticks == 0
    row = JobSchedule.objects.get(name="nightly")
    assert row.removed_at is not None and len(runs_of("nightly")) == 1


@pytest.mark.django_db
def test_pause_run_now_and_unpause(effects):
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = every("* * * * *", payload={"log": str(effects), "passes": 1})
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        run_due_jobs(now=clock)
        assert schedules.pause("nightly") and not schedules.pause("nightly")
        clock.now += timedelta(minutes=30)
        assert run_due_jobs(now=clock).ticks == 0, "paused: no tick"
        run_id, created = schedules.run_now("nightly")
        assert created and JobRun.objects.get(pk=run_id).instance == "nightly"
        with pytest.raises(KeyError, match="no schedule 'nope'.*there are: nightly"):
            schedules.run_now("nope")
        assert schedules.unpause("nightly")
        row = JobSchedule.objects.get(name="nightly")
        assert row.paused_at is None and row.next_tick > datetime.now(UTC) - timedelta(minutes=1)


@pytest.mark.django_db
def test_a_schedule_whose_job_is_not_registered_here_is_left_named_never_a_crash(caplog):
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = {"gone": {"job": "tests.renamed_away", "cron": "* * * * *", "timezone": "UTC"}}
    with override_settings(JOBRUNS={"SCHEDULES": spec}), caplog.at_level("WARNING", logger="django_jobruns"):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=2)
        report = run_due_jobs(now=clock)
    assert report.ticks == 0 and report.errors == []
    assert "tests.renamed_away" in caplog.text and "cannot be started in this process" in caplog.text
    assert JobSchedule.objects.get(name="gone").ticks == 0, "left for a process that has the job"


@pytest.mark.django_db
def test_a_task_schedule_enqueues_its_task_on_its_backend():
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = {
        "sums": {"task": "tests.support.task_functions.add", "cron": "0 3 * * *", "timezone": "UTC", "args": [2, 3]}
    }
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=2)
        report = run_due_jobs(now=clock)
    assert report.ticks == 1 and report.completed == 1, report
    row = JobSchedule.objects.get(name="sums")
    assert json.loads(JobRun.objects.get(pk=row.last_run_id).cursor) == 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fail", [False, True], ids=["body returns", "body's statement fails"])
def test_a_task_schedule_on_another_backend_starts_once_per_tick_outside_the_ticks_transaction(tmp_path, caplog, fail):
    """Django's ImmediateBackend runs the body at enqueue: not inside the tick's compare-and-set, whose
    transaction a database error in the body would spoil (on PostgreSQL), undoing the tick to start it again.
    Its result's id (32 characters) is no run of this app's: the schedule's row does not keep it."""
    log = tmp_path / "log"
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    task = "tests.support.immediate_tasks.immediate_note"
    spec = {"imm": {"task": task, "cron": "0 3 * * *", "timezone": "UTC", "args": [str(log), fail]}}
    with override_settings(JOBRUNS={"SCHEDULES": spec}), caplog.at_level("ERROR", logger="django_jobruns"):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=2)
        reports = [run_due_jobs(now=clock) for _ in range(3)]
    assert log.read_text().splitlines() == ["ran in_atomic_block=False"], "once, outside any transaction"
    assert [report.ticks for report in reports] == [1, 0, 0], caplog.text
    row = JobSchedule.objects.get(name="imm")
    assert row.ticks == 1 and row.next_tick == datetime(2026, 6, 2, 3, 0, tzinfo=UTC)
    assert row.last_run_id is None, "the task's result is its backend's"
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        run_id, created = schedules.run_now("imm")
    assert created and len(run_id) == 32 and log.read_text().count("ran") == 2
    assert JobSchedule.objects.get(name="imm").ticks == 2
    ours = [record.getMessage() for record in caplog.records if record.name == "django_jobruns"]
    assert ours == [], "the tick started; its task failed on its backend, which says so"


def test_the_checks_name_each_schedule_that_cannot_work(settings):
    settings.JOBRUNS = {
        "SCHEDULES": {
            "bad-cron": {"job": "tests.walk", "cron": "61 * * * *"},
            "four-fields": {"job": "tests.walk", "cron": "* * * *"},
            "bad-zone": {"job": "tests.walk", "cron": "* * * * *", "timezone": "Mars/Olympus"},
            "no-job": {"job": "tests.nonesuch", "cron": "* * * * *"},
            "no-task": {"task": "tests.support.task_functions.nonesuch", "cron": "* * * * *"},
            "both": {"job": "tests.walk", "task": "x.y", "cron": "* * * * *"},
            "unsafe": {"job": "tests.walk", "cron": "* * * * *", "payload": {"when": datetime(2026, 1, 1)}},
            "typo": {"job": "tests.walk", "cron": "* * * * *", "playload": {}},
            "fine": {"job": "tests.walk", "cron": "*/5 * * * *", "timezone": "Europe/Paris"},
            "long-cron": {"job": "tests.walk", "cron": LONG_CRON},
            "long-path": {"task": "tests." + "x" * 300 + ".task", "cron": "* * * * *"},
            "nul\x00name": {"job": "tests.walk", "cron": "* * * * *"},
            "long-instance": {"job": "tests.walk", "cron": "* * * * *", "instance": "i" * 201},
            "long-label": {"job": "tests." + "x" * 300, "cron": "* * * * *"},
            "latin-1 \udce9": {"job": "tests.walk", "cron": "* * * * *"},
            # A task's arguments are held to Django's rules (normalize_json), not a job payload's (Q3).
            "task-django-takes": {"task": TASK, "cron": "* * * * *", "args": [(1, 2), 10**30], "kwargs": {"k": ("x",)}},
            "task-a-set": {"task": TASK, "cron": "* * * * *", "args": [{1, 2}]},
            "task-nan": {"task": TASK, "cron": "* * * * *", "kwargs": {"k": float("nan")}},
        }
    }
    found = {(m.id, re.search(r"SCHEDULES'\]\['([^']+)'", m.msg).group(1)) for m in check_schedules()}
    assert found == {
        ("jobruns.E020", "bad-cron"),
        ("jobruns.E020", "four-fields"),
        ("jobruns.E020", "bad-zone"),
        ("jobruns.E021", "no-job"),
        ("jobruns.E021", "no-task"),
        ("jobruns.E020", "both"),
        ("jobruns.E022", "unsafe"),
        ("jobruns.E020", "typo"),
        ("jobruns.E020", "long-cron"),
        ("jobruns.E020", "long-path"),
        ("jobruns.E020", "nul\\x00name"),
        ("jobruns.E020", "long-instance"),
        ("jobruns.E020", "long-label"),
        ("jobruns.E020", "latin-1 \\udce9"),
        ("jobruns.E022", "task-a-set"),
        ("jobruns.E022", "task-nan"),
    }, found
    said = {m.msg for m in check_schedules()}
    assert any("['cron'] must be at most 200 characters" in m and "0-59" in m for m in said), said
    # Each refusal in the words of the rule it broke: a payload's (Q3) or Django's, for a task's arguments.
    assert any("['unsafe']['payload'] is not queue-safe" in m for m in said), said
    assert any("['task-a-set']['args'] is refused by Django's tasks" in m and "set" in m for m in said), said


@pytest.mark.django_db(transaction=True)
def test_a_schedule_its_row_cannot_hold_is_refused_and_the_others_still_tick():
    """A long list of minutes parses as cron, and on SQLite the row holds it; PostgreSQL's refused it,
    and with it the look at every schedule."""
    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = {
        **every("0 3 * * *", payload={"log": "/dev/null", "passes": 1}),
        "long": {"job": "tests.walk", "cron": LONG_CRON},
    }
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=2)
        assert run_due_jobs(now=clock).ticks == 1
    assert list(JobSchedule.objects.values_list("name", flat=True)) == ["nightly"]


@pytest.mark.django_db
def test_job_schedules_lists_runs_one_now_and_refuses_an_unknown_name(effects):
    spec = every("0 3 * * *", payload={"log": str(effects), "passes": 1})
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        listed = json.loads(call("job_schedules", "--json"))
        assert [s["name"] for s in listed] == ["nightly"]
        assert listed[0]["cron"] == "0 3 * * *" and listed[0]["in_words"] == "At 03:00 every day"
        assert listed[0]["target"] == "job tests.walk" and listed[0]["state"] == "active"
        text = call("job_schedules")
        assert "nightly" in text and "At 03:00 every day" in text
        assert call("job_schedules", "--run", "nightly").startswith("started run ")
        with pytest.raises(CommandError, match="no schedule 'nope'"):
            call_command("job_schedules", "--run", "nope")
    assert len(runs_of("nightly")) == 1


@pytest.mark.django_db
def test_a_drive_without_schedules_pays_no_statement_for_them_and_with_none_due_one_read():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    with CaptureQueriesContext(connection) as plain:
        run_due_jobs(now=clock)
    assert not [q for q in plain.captured_queries if "jobschedule" in q["sql"].lower()]
    with override_settings(JOBRUNS={"SCHEDULES": every("0 3 * * *")}):
        run_due_jobs(now=clock)  # the first look syncs the rows
        with CaptureQueriesContext(connection) as scheduled:
            run_due_jobs(now=clock)
    reads = [q for q in scheduled.captured_queries if "jobschedule" in q["sql"].lower()]
    assert len(reads) == 1 and reads[0]["sql"].lstrip().upper().startswith("SELECT"), reads


@pytest.mark.django_db
def test_the_admin_lists_schedules_in_words_with_their_ticks_and_last_run(admin_client, effects):
    from django.urls import reverse

    clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
    spec = every("0 3 * * *", payload={"log": str(effects), "passes": 1})
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        run_due_jobs(now=clock)
        clock.now += timedelta(minutes=2)
        run_due_jobs(now=clock)
        page = admin_client.get(reverse("admin:django_jobruns_jobschedule_changelist")).content.decode()
    row = JobSchedule.objects.get(name="nightly")
    assert "At 03:00 every day" in page and "0 3 * * *" in page and "(UTC)" in page
    assert "2026-06-01 03:00:00" in page, "the last tick, to the second"
    assert row.last_run_id in page and "jobruns-status-done" in page


@pytest.mark.django_db
def test_the_admins_run_now_pause_and_unpause_are_post_only_and_permission_checked(admin_client, effects):
    from django.contrib.auth.models import Permission, User
    from django.test import Client
    from django.urls import reverse

    spec = every("0 3 * * *", payload={"log": str(effects), "passes": 1})
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        schedules.sync(datetime.now(UTC))
        steer = reverse("admin:django_jobruns_jobschedule_steer", args=["nightly"])
        page = admin_client.get(reverse("admin:django_jobruns_jobschedule_change", args=["nightly"])).content.decode()
        assert 'id="jobruns-schedule-run_now"' in page and 'id="jobruns-schedule-pause"' in page
        assert admin_client.get(steer).status_code == 405, "POST only"

        viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
        viewer.user_permissions.set(Permission.objects.filter(codename="view_jobschedule"))
        client = Client()
        client.force_login(viewer)
        assert client.post(steer, {"verb": "pause"}).status_code == 403
        assert JobSchedule.objects.get(name="nightly").paused_at is None

        admin_client.post(steer, {"verb": "pause"})
        assert JobSchedule.objects.get(name="nightly").paused_at is not None
        admin_client.post(steer, {"verb": "unpause"})
        assert JobSchedule.objects.get(name="nightly").paused_at is None
        response = admin_client.post(steer, {"verb": "run_now"}, follow=True)
        assert "Started run" in response.content.decode()
    assert len(runs_of("nightly")) == 1


@pytest.mark.django_db(transaction=True)
def test_the_admins_run_now_of_a_task_on_another_backend_says_so_and_links_no_run_and_a_failure_is_a_message(
    admin_client, tmp_path
):
    from django.urls import reverse

    log = tmp_path / "log"
    task = "tests.support.immediate_tasks.immediate_note"
    spec = {"imm": {"task": task, "cron": "0 3 * * *", "timezone": "UTC", "args": [str(log), False]}}
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        schedules.sync(datetime.now(UTC))
        steer = reverse("admin:django_jobruns_jobschedule_steer", args=["imm"])
        page = admin_client.post(steer, {"verb": "run_now"}, follow=True).content.decode()
        assert re.search(r"Enqueued task \w{32} of schedule imm on its backend", page), page
        assert "/django_jobruns/jobrun/" not in page.split('class="messagelist"')[1].split("</ul>")[0]
        assert log.read_text() == "ran in_atomic_block=False\n"
        assert re.fullmatch(
            r"enqueued task \w{32} of schedule 'imm' on its backend", call("job_schedules", "--run", "imm")
        )
    broken = {"imm": {**spec["imm"], "args": [{"a set"}, False]}}  # Django's enqueue refuses it
    with override_settings(JOBRUNS={"SCHEDULES": broken}):
        response = admin_client.post(steer, {"verb": "run_now"}, follow=True)
        assert response.status_code == 200
        assert "Schedule imm could not start: TypeError: " in response.content.decode()
        with pytest.raises(CommandError, match=r"^schedule 'imm' could not start: TypeError: "):
            call("job_schedules", "--run", "imm")
    assert log.read_text().count("ran") == 2


@pytest.mark.django_db
def test_the_overview_shows_the_next_tick(admin_client):
    from django.urls import reverse

    with override_settings(JOBRUNS={"SCHEDULES": every("0 3 * * *")}):
        schedules.sync(datetime(2026, 6, 1, 2, 0, tzinfo=UTC))
        page = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist")).content.decode()
    assert "The next scheduled tick:" in page and ">nightly</a>" in page, page[:2000]
    plain = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist")).content.decode()
    assert "The next scheduled tick:" not in plain, "no schedules declared: nothing said, nothing read"


@pytest.mark.django_db
def test_a_tick_started_has_a_span_of_its_own(effects):
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.test_telemetry import _reset_globals

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset_globals()
    trace.set_tracer_provider(provider)
    try:
        clock = Clock(datetime(2026, 6, 1, 2, 59, tzinfo=UTC))
        with override_settings(JOBRUNS={"SCHEDULES": every("0 3 * * *", payload={"log": str(effects), "passes": 1})}):
            run_due_jobs(now=clock)
            clock.now += timedelta(minutes=2)
            run_due_jobs(now=clock)
    finally:
        provider.shutdown()
        _reset_globals()
    (tick,) = [span for span in exporter.get_finished_spans() if span.name == "tick nightly"]
    assert tick.attributes["jobruns.schedule.tick"] == "2026-06-01T03:00:00+00:00"
    assert any(span.parent and span.parent.span_id == tick.context.span_id for span in exporter.get_finished_spans())


def test_a_waiting_drive_wakes_for_the_next_tick_not_a_poll_later():
    """S4: the end of a wait is the budget's end, or the next tick when it comes first (never past either)."""
    import time

    from django_jobruns.report import DriveReport

    now = datetime(2026, 6, 1, 2, 59, 58, tzinfo=UTC)
    report = DriveReport()
    deadline = time.monotonic() + 50
    assert schedules.until_next_tick(report, now, deadline) == deadline, "no schedule: the budget's end"
    report.next_tick = now + timedelta(seconds=2)
    woken = schedules.until_next_tick(report, now, deadline)
    assert 1.5 < woken - time.monotonic() <= 2.0
    report.next_tick = now - timedelta(seconds=5)
    assert schedules.until_next_tick(report, now, deadline) <= time.monotonic(), "a tick due already: no wait"
    report.next_tick = now + timedelta(hours=2)
    assert schedules.until_next_tick(report, now, deadline) == deadline


@pytest.mark.django_db(transaction=True)
def test_a_drive_with_a_budget_starts_the_tick_that_comes_due_while_it_waits(effects):
    """A drive started a moment before the tick, with a budget past it: the tick's run is started and driven."""
    import time

    base = datetime(2026, 6, 1, 2, 59, 59, tzinfo=UTC)
    began = time.monotonic()

    def clock() -> datetime:
        return base + timedelta(seconds=time.monotonic() - began)

    spec = every("0 3 * * *", payload={"log": str(effects), "passes": 1})
    with override_settings(JOBRUNS={"SCHEDULES": spec}):
        report = run_due_jobs(now=clock, max_seconds=3)
    assert report.ticks == 1 and report.completed == 1, report


@pytest.mark.django_db(transaction=True)
def test_schedules_the_database_cannot_answer_for_cost_the_round_its_schedules_not_the_drive(caplog, behaviour):
    """Code deployed before migration 0019 (schedules declared, no table yet): runs are driven, the trouble said."""
    from django.db import connection

    behaviour["plain"] = lambda p: {"done": True}
    from django_jobruns import start_job_run

    start_job_run("tests.scripted", instance="plain")
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE django_jobruns_jobschedule RENAME TO jobschedule_elsewhere")
    try:
        with override_settings(JOBRUNS={"SCHEDULES": every("* * * * *")}), caplog.at_level("ERROR"):
            report = run_due_jobs()
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE jobschedule_elsewhere RENAME TO django_jobruns_jobschedule")
    assert report.completed == 1, report
    assert "the schedules could not be read" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_drive_asked_to_stop_while_its_pass_runs_begins_no_other_round_and_starts_no_tick(behaviour):
    """SIGTERM (a deploy) arrives while a pass runs and a tick comes due meanwhile: the drive finishes the pass and
    ends; the tick is left to the drives that go on, and no statement of another round (its due read, on a
    partitioned link a connect's timeout) is sent."""
    from django.test.utils import CaptureQueriesContext

    from django_jobruns import start_job_run

    clock = Clock(datetime(2026, 6, 1, 2, 50, tzinfo=UTC))
    stop = threading.Event()

    def until_sigterm(p):
        clock.now = datetime(2026, 6, 1, 3, 0, 30, tzinfo=UTC)  # the tick comes due while the pass runs
        stop.set()
        return {"done": True}

    behaviour["stopper"] = until_sigterm
    start_job_run("tests.scripted", instance="stopper")
    with override_settings(JOBRUNS={"SCHEDULES": every("0 3 * * *")}):
        with CaptureQueriesContext(connections["default"]) as sent:
            report = run_due_jobs(now=clock, max_seconds=60, stop=stop)
    assert report.completed == 1 and report.stopped and report.ticks == 0, report
    assert runs_of("nightly") == [], "a drive asked to stop started a tick"
    assert JobSchedule.objects.get(name="nightly").next_tick == datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
    reads = [query["sql"] for query in sent.captured_queries if "jobschedule" in query["sql"].lower()]
    assert len([sql for sql in reads if "first_tick" in sql]) == 1, "the schedules were looked at after the stop"
