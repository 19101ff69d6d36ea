"""Database routing: a project that routes django_jobruns to a database of its own keeps all of it there.

The check runs in its own pytest process under ``tests.support.settings_routed`` (two
databases and a router), against the same database server as this suite.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_starts_drives_restarts_reads_commands_and_admin_all_use_the_routed_database():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.settings_routed", "PYTHONPATH": str(ROOT)}
    env.pop("JOBRUNS_TEST_DB_NAME", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--ds=tests.support.settings_routed",
            "--create-db",
            str(ROOT / "tests" / "support" / "routed" / "check_routed.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
