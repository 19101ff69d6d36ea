"""Settings for the benchmarks' and the torture harness's processes.

The demo project plus the bench apps. SQLite runs in the mode BENCH_SQLITE_MODE
names: ``rollback`` (a rollback journal, as DBOS uses it) or ``wal`` (WAL with
synchronous=NORMAL, what this app recommends); IMMEDIATE transactions either way.
"""

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.torture_app", "bench.perf"]
LOGGING = {"version": 1, "disable_existing_loggers": False}

if DATABASES["default"]["ENGINE"].endswith("sqlite3") and os.environ.get("BENCH_SQLITE_MODE") == "defaults":
    # What `startproject` writes: DEFERRED transactions, a 5 s timeout, the rollback journal.
    DATABASES["default"]["OPTIONS"] = {}
elif DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    _wal = os.environ.get("BENCH_SQLITE_MODE", "wal") == "wal"
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
        if _wal
        else "PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;",
    }

if os.environ.get("JOBRUNS_TEST_CLOCK_SKEW"):
    # A worker whose host clock is wrong by this many seconds (the torture harness's skewed workers).
    from datetime import timedelta as _timedelta

    from django.utils import timezone as _timezone

    _real_now = _timezone.now
    _skew = _timedelta(seconds=float(os.environ["JOBRUNS_TEST_CLOCK_SKEW"]))
    _timezone.now = lambda: _real_now() + _skew

if DATABASES["default"]["ENGINE"].endswith("postgresql") and os.environ.get("BENCH_PG_SERVER_SIDE_BINDING") == "1":
    # Django's default is client-side binding, and so is the bench's. With
    # BENCH_PG_SERVER_SIDE_BINDING=1, server-side parameters: psycopg prepares
    # a statement it has run five times, so it is parsed and planned once.
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True

if DATABASES["default"]["ENGINE"].endswith("postgresql") and os.environ.get("BENCH_PG_PREPARE_THRESHOLD"):
    # OPTIONS "prepare_threshold" named: a number (the project's and the engine's statements prepared
    # at it, with server-side binding), or "none" (nothing prepared, as behind a pooler). Unnamed
    # (Django's default), the engine prepares its own statements on a direct connection.
    _threshold = os.environ["BENCH_PG_PREPARE_THRESHOLD"]
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = (
        None if _threshold.lower() == "none" else int(_threshold)
    )

if os.environ.get("BENCH_TASKS"):
    # bench/tasks.py: Django's Tasks on this app's backend ("ours") or on django-tasks-db ("peer").
    if os.environ["BENCH_TASKS"] == "peer":
        INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]
        TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
    else:
        TASKS = {"default": {"BACKEND": "django_jobruns.backend.JobRunsBackend"}}
