"""The optional drive task, where Django's Tasks framework (or its backport) is installed."""

from __future__ import annotations

import django
import pytest

pytest.importorskip("django_jobruns.tasks", reason="needs Django 6 or the django-tasks backport")

from django_jobruns import start_job_run  # noqa: E402
from django_jobruns.models import JobRun, Status  # noqa: E402

IMMEDIATE = {
    "default": {
        "BACKEND": "django.tasks.backends.immediate.ImmediateBackend"
        if django.VERSION >= (6, 0)
        else "django_tasks.backends.immediate.ImmediateBackend",
    }
}


@pytest.mark.django_db
def test_the_drive_task_runs_one_drive_pass(settings, behaviour):
    from django_jobruns.tasks import drive_due_jobs

    settings.TASKS = IMMEDIATE
    behaviour["task"] = lambda p: {"cursor": (p.cursor or 0) + 1, "done": p.cursor == 1}
    run, _ = start_job_run("tests.scripted", instance="task")
    result = drive_due_jobs.enqueue(limit=5, max_passes=5, jobs=["tests.scripted"])
    report = result.return_value
    assert report["attempted"] == 1 and report["advanced"] == 1 and report["completed"] == 1
    assert JobRun.objects.get(pk=run.pk).status == Status.DONE
