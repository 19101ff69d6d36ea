from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from tests import jobs

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """An injected clock: one instant, moved only by the test."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def behaviour() -> Iterator[dict]:
    jobs.BEHAVIOUR.clear()
    yield jobs.BEHAVIOUR
    jobs.BEHAVIOUR.clear()


@pytest.fixture
def effects(tmp_path: Path) -> Path:
    return tmp_path / "effects.log"


def wait_until(condition, what: str, timeout: float = 60) -> None:
    """Poll for a state the database reports (another thread or process brings it about), until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def effect_lines(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    return [tuple(line.split()[:2]) for line in path.read_text().splitlines()]  # type: ignore[misc]


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def worker_env() -> dict[str, str]:
    """Environment for a worker process that talks to this test database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
    env["JOBRUNS_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(ROOT)
    return env


def spawn_env() -> dict[str, str]:
    """What a spawned process (multiprocessing) needs to reach this test database."""
    keep = (
        "DJANGO_SETTINGS_MODULE",
        "JOBRUNS_TEST_DB_NAME",
        "DATABASE_URL",
        "PYTHONPATH",
        "JOBRUNS_VAR_DIR",
        "JOBRUNS_SQLITE_DEFAULTS",
    )
    return {k: v for k, v in worker_env().items() if k in keep}


def manage(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``manage.py`` in a new process against the test database."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env={**worker_env(), **(extra_env or {})},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def call(name: str, *args: Any) -> str:
    """A management command's output, stripped (its stderr discarded)."""
    out = StringIO()
    call_command(name, *args, stdout=out, stderr=StringIO())
    return out.getvalue().strip()
