"""An optional task for Django's Tasks framework: one drive pass, without cron.

Django 6 ships the framework as ``django.tasks``; on Django 5.2 the
``django-tasks`` backport provides it. With either installed, a project whose
tasks worker runs can schedule drive passes itself::

    from django_jobruns.tasks import drive_due_jobs

    drive_due_jobs.enqueue(limit=50, max_passes=5)

The task returns the drive's report as a dict (see ``DriveReport.as_dict``).
Without the framework, importing this module raises ``ImportError`` naming what
to install.
"""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    try:
        from django_tasks import task  # type: ignore[no-redef]
    except ImportError:
        raise ImportError(
            "django_jobruns.tasks needs Django's Tasks framework: Django 6, or `pip install django-tasks` on 5.2"
        ) from None


@task()
def drive_due_jobs(
    limit: int | None = None,
    max_passes: int = 1,
    jobs: list[str] | None = None,
    lease_ttl_seconds: float | None = None,
) -> dict[str, Any]:
    """Run one drive pass (``run_due_jobs``) and return its report (defaults: the ``JOBRUNS`` settings)."""
    from .drive import run_due_jobs

    return run_due_jobs(limit=limit, max_passes=max_passes, jobs=jobs, lease_ttl=lease_ttl_seconds).as_dict()
