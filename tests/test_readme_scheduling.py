"""Every scheduling line the README prints, run as printed in the environment that runs it.

A fresh ``startproject`` with the app installed (and one app of its own with a
job in its ``jobs.py``), a run started; then the README's cron line under
cron's environment (``env -i PATH=/usr/bin:/bin``, ``/bin/sh``), the systemd
unit's ``ExecStart`` from its ``WorkingDirectory`` with systemd's empty
environment, and the Kubernetes CronJob's ``command`` with an image's PATH (its
Python first). Each must drive the run to done. Only the paths are the test's
own (``/srv/app``, the virtualenv, the log) and ``--max-seconds 55`` is cut to
a few seconds; the rest is the README's text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.skipif("'DATABASE_URL' in __import__('os').environ")]

README = (ROOT / "README.md").read_text()
CRON_ENV = ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent", "SHELL=/bin/sh"]


def block(language: str) -> str:
    found = re.search(rf"```{language}\n(.*?)```", README, re.S)
    assert found, f"the README has no {language} block"
    return found.group(1)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``startproject``, the app and rangefilter installed, an app with a job, migrated."""
    root = tmp_path_factory.mktemp("srv") / "app"
    root.mkdir()
    subprocess.run([sys.executable, "-m", "django", "startproject", "mysite", str(root)], check=True)
    settings = root / "mysite" / "settings.py"
    text = settings.read_text().replace(
        "INSTALLED_APPS = [", 'INSTALLED_APPS = [\n    "rangefilter",\n    "django_jobruns",\n    "shop",'
    )
    settings.write_text(text)
    shop = root / "shop"
    shop.mkdir()
    (shop / "__init__.py").write_text("")
    (shop / "jobs.py").write_text(
        "from django_jobruns import job\n\n\n@job\ndef ping(p):\n    p.count('pinged')\n    return {'done': True}\n"
    )
    manage(root, "migrate", "-v", "0")
    return root


def manage(root: Path, *args: str) -> str:
    done = subprocess.run(
        [*CRON_ENV, sys.executable, "manage.py", *args], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def start(root: Path, instance: str) -> str:
    out = manage(root, "start_job_run", "shop.ping", "--instance", instance)
    return out.split()[2] if out.startswith("started run") else out.split()[-1]


def status(root: Path, instance: str) -> dict[str, Any]:
    (record,) = json.loads(manage(root, "job_runs", "--instance", instance, "--json"))
    assert isinstance(record, dict)
    return record


def ours(command: str, root: Path, log: Path | None = None) -> str:
    command = command.replace("/srv/app/.venv/bin/python", sys.executable).replace("/srv/app", str(root))
    if log is not None:
        command = command.replace("/var/log/jobruns.log", str(log))
    return command.replace("--max-seconds 55", "--max-seconds 3")


def test_the_cron_line_as_printed_runs_under_crons_environment(project: Path, tmp_path: Path):
    (line,) = [line for line in block("cron").splitlines() if line.strip()]
    fields = line.split(None, 5)
    assert fields[:5] == ["*"] * 5, line
    command = ours(fields[5], project, tmp_path / "jobruns.log").replace("\\%", "%")  # cron's own unescaping
    start(project, "cron")
    done = subprocess.run([*CRON_ENV, "/bin/sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    assert "completed=1" in (tmp_path / "jobruns.log").read_text()
    assert status(project, "cron")["status"] == "done"


def test_the_systemd_unit_as_printed_runs_with_systemds_empty_environment(project: Path):
    unit = block("ini")
    directory = re.search(r"^WorkingDirectory=(.*)$", unit, re.M).group(1)
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    assert directory == "/srv/app", directory
    start(project, "systemd")
    done = subprocess.run(
        ["env", "-i", *ours(exec_start, project).split()], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (exec_start, done.stderr)
    assert status(project, "systemd")["status"] == "done"


def test_the_kubernetes_cronjob_command_as_printed_runs_with_an_images_path(project: Path):
    command = json.loads(re.search(r"command: (\[.*\])", block("yaml")).group(1))
    assert command[:2] == ["python", "manage.py"], command
    start(project, "kubernetes")
    image_path = f"PATH={Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"  # the image's Python first
    args = ours(" ".join(command), project).split()
    done = subprocess.run(["env", "-i", image_path, *args], cwd=project, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (command, done.stderr)
    assert status(project, "kubernetes")["status"] == "done"
