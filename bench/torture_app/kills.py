"""Self-inflicted SIGKILLs at chosen points, drawn from a shared budget of token files.

The budget lives in files, not the database: a token taken inside a transaction
that the kill then rolls back would otherwise be handed out again.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

POINTS = ("step", "effect", "commit")
# The run whose pass this process is in (workers drive one run at a time).
CURRENT: dict[str, str | None] = {"run": None}
CHANCE = float(os.environ.get("TORTURE_CHANCE", "0.04"))


def maybe_die(point: str) -> None:
    """With a small chance, take a token for ``point`` and SIGKILL this process."""
    folder = os.environ.get("TORTURE_DIR")
    if not folder or random.random() >= CHANCE:
        return
    tokens = sorted(Path(folder, point).glob("token-*"))
    for token in tokens:
        try:
            token.unlink()
        except FileNotFoundError:
            continue  # another worker took it
        Path(folder, "killed").mkdir(exist_ok=True)
        Path(folder, "killed", f"{point}-{os.getpid()}").touch()
        os.kill(os.getpid(), signal.SIGKILL)


def _commit_hook(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    connection = context["connection"]
    if sql.startswith('WITH fenced AS (UPDATE "django_jobruns_jobrun" SET "cursor"'):
        # PostgreSQL commits a pass in one statement: die just before it is
        # sent, or just after it returned (committed, not yet released).
        if random.random() < 0.5:
            maybe_die("commit")
            return execute(sql, params, many, context)
        result = execute(sql, params, many, context)
        maybe_die("commit")
        return result
    result = execute(sql, params, many, context)
    # SQLite: the run's UPDATE has run inside the commit's transaction, which
    # has not committed yet.
    if sql.startswith('UPDATE "django_jobruns_jobrun"') and '"cursor"' in sql and connection.in_atomic_block:
        if context["cursor"].rowcount == 1:
            # The pass log: which process committed, written in the commit's own
            # transaction so it exists exactly when the commit does.
            with connection.cursor() as cur:
                cur.execute(
                    "INSERT INTO torture_events (kind, run_id, pid) VALUES ('committed_by', %s, %s)",
                    [CURRENT["run"], os.getpid()],
                )
        maybe_die("commit")
    return result


def install_commit_hook(sender: Any, connection: Any, **kwargs: Any) -> None:
    if _commit_hook not in connection.execute_wrappers:
        connection.execute_wrappers.append(_commit_hook)
