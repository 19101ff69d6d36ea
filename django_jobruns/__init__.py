"""django-jobruns: long, resumable, coalesced background work for Django.

The public API::

    from django_jobruns import job, start_job_run, restart_job_run, run_due_jobs, job_runs, RetryPolicy
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .registry import job
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .drive import DriveReport, run_due_jobs
    from .passes import Pass
    from .records import JobRunRecord, job_runs
    from .starts import restart_job_run, start_job_run

__all__ = [
    "DriveReport",
    "JobRunRecord",
    "Pass",
    "RetryPolicy",
    "job",
    "job_runs",
    "restart_job_run",
    "run_due_jobs",
    "start_job_run",
]

# These need the models, which cannot be imported before the app registry is
# ready; importing them on first use keeps "import django_jobruns" safe anywhere.
_LAZY = {
    "run_due_jobs": "drive",
    "DriveReport": "drive",
    "Pass": "passes",
    "job_runs": "records",
    "JobRunRecord": "records",
    "start_job_run": "starts",
    "restart_job_run": "starts",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobruns' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
