"""System checks."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import run_checks

from django_jobruns.checks import sqlite_transaction_mode_warnings


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
    assert [m for m in run_checks() if m.id.startswith("jobruns.")] == []
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        assert "journal_mode=WAL" in settings.DATABASES["default"]["OPTIONS"]["init_command"]
