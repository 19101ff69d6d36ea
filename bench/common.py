"""Shared helpers of the benchmark scripts: fresh databases, Django set-up, medians."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MYSQL_HOST = {"host": "127.0.0.1", "port": 3306, "user": "root", "password": ""}


def _mysql_admin(statement: str) -> None:
    import MySQLdb  # the mysql extra's mysqlclient

    admin = MySQLdb.connect(**MYSQL_HOST)
    try:
        admin.cursor().execute(statement)
    finally:
        admin.close()


def fresh_database(db: str, name: str, folder: Path | None = None) -> str:
    """Return the URL of a new, empty database called ``name``."""
    if db == "sqlite":
        folder = folder or Path(tempfile.mkdtemp(prefix="jobruns-bench-"))
        path = Path(name + ".sqlite3") if name.startswith("/") else folder / f"{name}.sqlite3"
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return f"sqlite:///{path}"
    if db == "mysql":
        _mysql_admin(f"DROP DATABASE IF EXISTS {name}")
        _mysql_admin(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        return f"mysql://root@127.0.0.1:3306/{name}"
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def drop_database(db: str, name: str) -> None:
    if db == "mysql":
        _mysql_admin(f"DROP DATABASE IF EXISTS {name}")
    if db == "postgres":
        import psycopg

        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def setup_django(url: str, sqlite_mode: str = "wal") -> None:
    """Configure Django in this process for the bench settings and the database at ``url``."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["DATABASE_URL"] = url
    os.environ["BENCH_SQLITE_MODE"] = sqlite_mode
    os.environ.setdefault("JOBRUNS_VAR_DIR", tempfile.mkdtemp(prefix="jobruns-bench-var-"))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def run_phase(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one phase of a benchmark in a fresh process (``env`` added to its environment); return its last JSON."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return statistics.median(values)


def interleave(rounds: int, targets: dict[Any, Any], measure: Any) -> dict[Any, list[Any]]:
    """Call ``measure(key, target)`` for every target, round after round; collect the results by key.

    Interleaved so that a noisy moment on a shared machine falls on both sides.
    """
    samples: dict[Any, list[Any]] = {key: [] for key in targets}
    for _ in range(rounds):
        for key, target in targets.items():
            samples[key].append(measure(key, target))
    return samples


def filled_postgres_databases(prefix: str, counts: list[int]) -> dict[int, str]:
    """The URLs, by count, of the PostgreSQL databases ``fill_databases`` makes (and ``--keep`` leaves)."""
    return {count: f"postgresql://postgres@127.0.0.1:5432/bench_{prefix}_{index}" for index, count in enumerate(counts)}


def fill_databases(script: str, db: str, prefix: str, counts: list[int]) -> dict[int, str]:
    """Create one database per count, filled by ``script --phase fill``; return their URLs by count."""
    folder = Path(tempfile.mkdtemp(prefix=f"jobruns-{prefix}-"))
    urls = filled_postgres_databases(prefix, counts) if db != "sqlite" else {}
    for index, count in enumerate(counts):
        name = f"bench_{prefix}_{index}"
        target = str(folder / name) if db == "sqlite" else name
        run_phase(script, "--phase", "fill", "--db", db, "--name", target, "--count", str(count))
        if db == "sqlite":
            urls[count] = f"sqlite:///{target}.sqlite3"
    return urls


def drop_databases(db: str, prefix: str, counts: list[int]) -> None:
    for index in range(len(counts)):
        drop_database(db, f"bench_{prefix}_{index}")
