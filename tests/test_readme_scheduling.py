"""A new user's first hour, replayed: the built wheel, a fresh ``startproject``, the README's lines.

The wheel is built from this checkout and installed with Django (the version
running the tests) into a virtualenv of its own; a fresh ``startproject`` gets
the app (and one app of its own with a job in its ``jobs.py``), a run started;
then the README's cron line under cron's environment (``env -i
PATH=/usr/bin:/bin``, ``/bin/sh``), the systemd unit's ``ExecStart`` from its
``WorkingDirectory`` with systemd's empty environment, and the Kubernetes
CronJob's ``command`` with an image's PATH (its Python first). Each must drive
the run to done. Only the paths are the test's own (``/srv/app``, the
virtualenv, the log) and ``--max-seconds 55`` is cut to a few seconds; the
rest is the README's text. Then the traps a first hour met before: a warning in
every cron log, a job outside ``jobs.py`` that looks healthy for ever, a drive
inside ``atomic()`` that loses its commits.
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


def install_the_wheel(venv: Path, scratch: Path) -> str:
    """A virtualenv with the wheel built from this checkout and this Django, as a new user installs it."""
    import django

    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(scratch), str(ROOT)], check=True, timeout=300)
    (wheel,) = scratch.glob("django_jobruns-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    subprocess.run([*install, str(wheel), f"django=={django.__version__}"], check=True, timeout=600)
    found = subprocess.run(
        [python, "-c", "import django_jobruns; print(django_jobruns.__file__)"],
        cwd=scratch,
        capture_output=True,
        text=True,
    ).stdout
    assert found.startswith(str(venv)), found  # the wheel's copy, not this checkout
    return python


def python_of(root: Path) -> str:
    return str(root_bin(root) / "python")


def root_bin(root: Path) -> Path:
    return root / ".venv" / "bin"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel in the project's virtualenv, ``startproject``, an app with a job, migrated."""
    root = tmp_path_factory.mktemp("srv") / "app"
    root.mkdir()
    python = install_the_wheel(root / ".venv", tmp_path_factory.mktemp("dist"))
    subprocess.run([python, "-m", "django", "startproject", "mysite", str(root)], check=True)
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
        [*CRON_ENV, python_of(root), "manage.py", *args], cwd=root, capture_output=True, text=True, timeout=120
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
    command = command.replace("/srv/app", str(root))
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
    image_path = f"PATH={root_bin(project)}:/usr/local/bin:/usr/bin:/bin"  # the image's Python first
    args = ours(" ".join(command), project).split()
    done = subprocess.run(["env", "-i", image_path, *args], cwd=project, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (command, done.stderr)
    assert status(project, "kubernetes")["status"] == "done"


def test_the_cron_log_carries_no_system_check_warning_which_check_itself_gives(project: Path, tmp_path: Path):
    """Startproject's SQLite settings draw jobruns.W001 once, where the user looks: not in a cron log every minute."""
    (line,) = [line for line in block("cron").splitlines() if line.strip()]
    command = ours(line.split(None, 5)[5], project, tmp_path / "jobruns.log").replace("\\%", "%")
    done = subprocess.run([*CRON_ENV, "/bin/sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "jobruns.log").read_text()
    assert "W001" not in log and "System check" not in log, log
    checked = subprocess.run(
        [*CRON_ENV, python_of(project), "manage.py", "check"], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert "jobruns.W001" in checked.stderr + checked.stdout


def test_a_job_outside_jobs_py_is_named_by_the_drive_and_refused_by_start_job_run(project: Path, tmp_path: Path):
    """A @job in a module only the caller imports: the start succeeds there; every drive here names it."""
    (project / "shop" / "stray.py").write_text(
        "from django_jobruns import job\n\n\n@job\ndef stray(p):\n    return {'done': True}\n"
    )
    refused = subprocess.run(
        [*CRON_ENV, python_of(project), "manage.py", "start_job_run", "shop.stray"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "jobs.py" in refused.stderr, refused.stderr
    manage(
        project,
        "shell",
        "-c",
        "import shop.stray\nfrom django_jobruns import start_job_run\nstart_job_run(shop.stray.stray)",
    )
    (line,) = [line for line in block("cron").splitlines() if line.strip()]
    command = ours(line.split(None, 5)[5], project, tmp_path / "jobruns.log").replace("\\%", "%")
    done = subprocess.run([*CRON_ENV, "/bin/sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "jobruns.log").read_text()
    assert "shop.stray are not driven" in log and "jobs.py" in log and "unregistered=1" in log, log
    (record,) = json.loads(manage(project, "job_runs", "--job", "shop.stray", "--json"))
    assert record["status"] == "running" and "job not registered" in (record["last_warning"] or ""), record


def test_a_drive_inside_atomic_is_refused_and_loses_nothing(project: Path):
    run_id = start(project, "atomic")
    refused = subprocess.run(
        [
            *CRON_ENV,
            python_of(project),
            "manage.py",
            "shell",
            "-c",
            "from django.db import transaction\nfrom django_jobruns import run_due_jobs\n"
            "with transaction.atomic():\n    run_due_jobs()",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "inside a database transaction" in refused.stderr, refused.stderr
    assert status(project, "atomic")["status"] == "running", run_id
    manage(project, "run_due_jobs")
    assert status(project, "atomic")["status"] == "done"


def test_the_readmes_sqlite_settings_in_a_fresh_project_pass_the_warning_gate(project: Path, tmp_path: Path):
    """A fresh project with the README's set-up passes ``check --fail-level WARNING`` (a common CI gate)."""
    (settings_block,) = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "transaction_mode" in b]
    options = settings_block[settings_block.index('DATABASES["default"]["OPTIONS"]') :]
    settings = project / "mysite" / "settings.py"
    before = settings.read_text()
    try:
        settings.write_text(before + "\n" + options)
        assert "jobruns.W001" not in manage(project, "check", "--fail-level", "WARNING")
        run_id = start(project, "immediate")
        manage(project, "run_due_jobs")
        assert status(project, "immediate")["status"] == "done", run_id
    finally:
        settings.write_text(before)
    done = subprocess.run(
        [*CRON_ENV, python_of(project), "manage.py", "check", "--fail-level", "WARNING"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "jobruns.W001" in done.stderr, "without them the gate says why"
