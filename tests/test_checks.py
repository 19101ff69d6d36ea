"""System checks."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.checks import run_checks

from django_jobruns.checks import sqlite_transaction_mode_warnings
from tests.conftest import ROOT


def test_w001_warns_when_sqlite_lacks_immediate_transactions():
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x", "OPTIONS": {}},
        "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "y"},
    }
    (warning,) = sqlite_transaction_mode_warnings(databases)
    assert warning.id == "jobruns.W001" and "'default'" in warning.msg and "IMMEDIATE" in warning.hint


def test_w001_is_silent_when_immediate_is_set():
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x", "OPTIONS": {"transaction_mode": "IMMEDIATE"}},
    }
    assert sqlite_transaction_mode_warnings(databases) == []


def test_the_test_project_passes_its_own_checks():
    silenced = set(settings.SILENCED_SYSTEM_CHECKS)
    assert [m for m in run_checks() if m.id.startswith("jobruns.") and m.id not in silenced] == []
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") and settings.DATABASES["default"]["OPTIONS"]:
        assert "journal_mode=WAL" in settings.DATABASES["default"]["OPTIONS"]["init_command"]


def test_settings_checks_refuse_unknown_keys_and_wrong_kinds(settings):
    from datetime import timedelta

    from django_jobruns import RetryPolicy
    from django_jobruns.checks import check_settings

    settings.JOBRUNS = {
        "DEFAULT_RETRY": RetryPolicy(max_attempts=2),
        "LEASE_TTL": timedelta(minutes=1),
        "DRIVE_LIMIT": 10,
        "SCAN_MAX": 100,
        "PAYLOAD_MAX_BYTES": 4096,
    }
    assert check_settings() == []
    settings.JOBRUNS = {
        "LEASE_TLL": 30,
        "DEFAULT_RETRY": {"max_attempts": 3},
        "LEASE_TTL": 0,
        "DRIVE_LIMIT": "50",
        "SCAN_MAX": 0,
    }
    found = {(m.id, m.msg.split(" must")[0].split(" has")[0]) for m in check_settings()}
    assert found == {
        ("jobruns.E001", "JOBRUNS"),
        ("jobruns.E002", "JOBRUNS['DEFAULT_RETRY']"),
        ("jobruns.E003", "JOBRUNS['LEASE_TTL']"),
        ("jobruns.E003", "JOBRUNS['DRIVE_LIMIT']"),
        ("jobruns.E003", "JOBRUNS['SCAN_MAX']"),
    }
    assert "'LEASE_TLL'" in next(m.msg for m in check_settings() if m.id == "jobruns.E001")
    settings.JOBRUNS = {"LEASE_TTL": 2}
    (short,) = check_settings()
    assert short.id == "jobruns.E003" and "at least 5 seconds" in short.msg, short.msg
    settings.JOBRUNS = {"LEASE_TTL": timedelta(seconds=5)}
    assert check_settings() == []
    settings.JOBRUNS = ["not", "a", "dict"]
    assert [m.id for m in check_settings()] == ["jobruns.E001"]


def test_default_retry_setting_applies_to_jobs_that_name_none(settings, behaviour, clock, db):
    from django_jobruns import RetryPolicy, run_due_jobs, start_job_run
    from django_jobruns.registry import job, unregister

    @job("no_policy")
    def no_policy(p):
        raise RuntimeError("always")

    try:
        settings.JOBRUNS = {"DEFAULT_RETRY": RetryPolicy(max_attempts=1)}
        run, _ = start_job_run("tests.no_policy")
        report = run_due_jobs(now=clock, jobs=["tests.no_policy"])
        assert report.failed == 1, "one attempt allowed by the setting"
    finally:
        unregister("tests.no_policy")


def test_e004_when_rangefilter_is_missing(settings):
    from django_jobruns.checks import check_rangefilter_installed

    assert check_rangefilter_installed() == []
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "rangefilter"]
    (error,) = check_rangefilter_installed()
    assert error.id == "jobruns.E004" and "rangefilter" in error.msg


def test_e005_without_use_tz_and_the_scheduled_commands_stop_on_it(settings, tmp_path):
    """With naive datetimes (local time on MariaDB and SQLite) the database's UTC clock would misjudge
    leases and due times by the zone's offset; schedules and the admin failed outright."""
    from django_jobruns.checks import check_time_zone_support

    assert check_time_zone_support() == []
    settings.USE_TZ = False
    (error,) = check_time_zone_support()
    assert error.id == "jobruns.E005" and "USE_TZ = True" in error.msg
    (tmp_path / "naive_settings.py").write_text("from tests.support.settings import *  # noqa\nUSE_TZ = False\n")
    env = {"DJANGO_SETTINGS_MODULE": "naive_settings", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = _command(tmp_path, "run_due_jobs", "--max-passes", "1", **env)
    assert done.returncode != 0 and "jobruns.E005" in done.stderr and "Traceback" not in done.stderr, done.stderr


def _command(tmp_path: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.sqlite3'}",
        "JOBRUNS_SQLITE_DEFAULTS": "1",
        "JOBRUNS_TEST_SHOW_W001": "1",
        **env,
    }
    environ.pop("JOBRUNS_TEST_DB_NAME", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=environ, capture_output=True, text=True
    )


def test_w001_is_said_where_the_user_looks_not_in_every_scheduled_commands_output(tmp_path):
    """startproject's SQLite settings: `check` and `migrate` give the advice; cron's commands stay quiet."""
    migrated = _command(tmp_path, "migrate", "-v", "0")
    assert migrated.returncode == 0 and "jobruns.W001" in migrated.stderr, migrated.stderr
    assert "jobruns.W001" in _command(tmp_path, "check").stderr
    for command in (["run_due_jobs"], ["start_job_run", "tests.walk"], ["prune_job_runs", "--older-than", "3"]):
        done = _command(tmp_path, *command)
        assert done.returncode == 0, done.stderr
        assert "W001" not in done.stderr and "System check" not in done.stderr, (command, done.stderr)
    # An error of the checks still stops a scheduled command, as it stops any command.
    refused = _command(tmp_path, "run_due_jobs", JOBRUNS_TEST_MISSPELT_SETTING="1")
    assert refused.returncode != 0 and "jobruns.E001" in refused.stderr, refused.stderr
