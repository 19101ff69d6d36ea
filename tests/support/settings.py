"""Test settings: the demo project plus the test app with its fixture jobs."""

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, INSTALLED_APPS, VAR_DIR

INSTALLED_APPS = [*INSTALLED_APPS, "tests"]

_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    # A file, not memory: worker processes spawned by the tests must see it.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.sqlite3")}
# Worker processes started by a test connect to the test database directly.
if os.environ.get("JOBRUNS_TEST_DB_NAME"):
    _db["NAME"] = os.environ["JOBRUNS_TEST_DB_NAME"]

if _db["ENGINE"].endswith("sqlite3") and os.environ.get("JOBRUNS_SQLITE_DEFAULTS"):
    # What `django-admin startproject` writes: DEFERRED transactions, a 5 s
    # timeout, the rollback journal. The engine must be correct on it.
    _db["OPTIONS"] = {}
    if not os.environ.get("JOBRUNS_TEST_SHOW_W001"):
        SILENCED_SYSTEM_CHECKS = ["jobruns.W001"]  # the advice for throughput, expected here

if os.environ.get("JOBRUNS_TEST_MISSPELT_SETTING"):
    JOBRUNS = {"LEASE_TLL": 60}  # a key the app does not know: jobruns.E001

if os.environ.get("JOBRUNS_TEST_SCHEDULES"):
    # Worker processes of the schedule tests: the schedules as JSON.
    import json as _json

    JOBRUNS = {"SCHEDULES": _json.loads(os.environ["JOBRUNS_TEST_SCHEDULES"])}

if os.environ.get("JOBRUNS_TEST_GATE"):
    # Worker processes that start their drives together: each says it is ready on one FIFO, then
    # waits on another until the test opens it (a barrier across processes, no sleep).
    _gate = os.environ["JOBRUNS_TEST_GATE"]
    with open(os.path.join(_gate, "ready.fifo"), "w") as _ready:
        _ready.write(f"{os.getpid()}\n")
    os.close(os.open(os.path.join(_gate, "go.fifo"), os.O_RDONLY))

if os.environ.get("JOBRUNS_TEST_CLOCK_SKEW"):
    # A worker process whose host clock is wrong by this many seconds (the skew tests).
    from datetime import timedelta as _timedelta

    from django.utils import timezone as _timezone

    _real_now = _timezone.now
    _skew = _timedelta(seconds=float(os.environ["JOBRUNS_TEST_CLOCK_SKEW"]))
    _timezone.now = lambda: _real_now() + _skew

if os.environ.get("JOBRUNS_TEST_STOP_AFTER_HEARTBEAT"):
    # A worker that stops itself (SIGSTOP) right after the first heartbeat of a
    # step record: stalled between the two statements of a fenced write.
    import signal as _signal

    from django.db.backends.signals import connection_created as _connection_created

    def _stop_after_the_heartbeat(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith("UPDATE") and "SET `lease_expires_at`" in sql:
            os.kill(os.getpid(), _signal.SIGSTOP)
        return result

    def _install(sender, connection, **kwargs):
        if _stop_after_the_heartbeat not in connection.execute_wrappers:
            connection.execute_wrappers.append(_stop_after_the_heartbeat)

    _connection_created.connect(_install, weak=False)

if _db["ENGINE"].endswith("postgresql") and os.environ.get("JOBRUNS_TEST_PREPARE_THRESHOLD"):
    # OPTIONS "prepare_threshold" named: a number (psycopg's prepared statements on at it, the
    # project's and the engine's), or "none" (nothing prepared, as a project behind a pooler says).
    # Unnamed, as Django leaves it, the engine prepares its own statements on a direct connection.
    _threshold = os.environ["JOBRUNS_TEST_PREPARE_THRESHOLD"]
    _db.setdefault("OPTIONS", {})["prepare_threshold"] = None if _threshold.lower() == "none" else int(_threshold)

if os.environ.get("JOBRUNS_TEST_READ_ONLY"):
    # A database that refuses writes: a read-only file (a root process ignores
    # file permissions, so not those), a standby's read-only transactions.
    _options = _db.setdefault("OPTIONS", {})
    if _db["ENGINE"].endswith("sqlite3"):
        _db["NAME"] = f"file:{_db['NAME']}?mode=ro"
        _options["uri"] = True
    elif _db["ENGINE"].endswith("postgresql"):
        _options["options"] = "-c default_transaction_read_only=on"
    else:
        _options["init_command"] = "SET SESSION TRANSACTION READ ONLY"

# Django's Tasks framework on this app (django_jobruns.backend); tests of the
# other backends override it.
from datetime import timedelta as _lease_length  # noqa: E402

from django_jobruns import RetryPolicy as _RetryPolicy  # noqa: E402

_tasks_framework = "django.tasks" if __import__("importlib.util").util.find_spec("django.tasks") else "django_tasks"

TASKS = {
    "default": {
        "BACKEND": "django_jobruns.backend.JobRunsBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "RETRY": _RetryPolicy(max_attempts=3, base_delay=0, jitter=0),
            "LEASE_TTL": _lease_length(seconds=5),
        },
    },
    # A second alias with its own retry policy: at most once.
    "once": {
        "BACKEND": "django_jobruns.backend.JobRunsBackend",
        "OPTIONS": {"RETRY": _RetryPolicy(max_attempts=1), "LEASE_TTL": 5},
    },
    # Django's own, the reference for what a task stores and reports.
    "reference": {"BACKEND": f"{_tasks_framework}.backends.immediate.ImmediateBackend"},
}
