"""Which database the app's rows live in: the one the project's router names for ``JobRun``.

Every read and write of the app goes there -- the engine's own statements,
its transactions, starts, steering, pruning and the admin -- so a project that
routes ``django_jobruns`` to a database of its own (``DATABASE_ROUTERS``) keeps
all of it in one place. Reads that decide what to write go to the write alias
too: a replica could be behind.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, router


def alias() -> str:
    """The alias the router names for writing ``JobRun`` (``"default"`` without a router)."""
    from .models import JobRun

    return router.db_for_write(JobRun) or "default"


def connection() -> Any:
    """The connection of :func:`alias`, for this thread."""
    return connections[alias()]
