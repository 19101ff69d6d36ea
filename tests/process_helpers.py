"""Functions run in freshly spawned processes (no Django imports at module level)."""

from __future__ import annotations

import os
from typing import Any


def start_one_key(env: dict[str, str], barrier: Any, queue: Any) -> None:
    """Set Django up against the test database, wait for the others, then start the shared key."""
    os.environ.update(env)
    import django

    django.setup()
    from django.db import connections

    from django_jobruns import start_job_run

    barrier.wait()
    run, created = start_job_run("tests.walk", instance="race-proc", payload={"log": "/dev/null"})
    queue.put((run.id, created))
    connections.close_all()
