"""django-jobruns: long, resumable, coalesced background work for Django.

The public API::

    from django_jobruns import job, start_job_run, restart_job_run, run_due_jobs, job_runs, RetryPolicy
    from django_jobruns import cancel_job_run, pause_job_run, unpause_job_run, retry_job_run_now, GiveUp
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .exceptions import GiveUp
from .registry import job
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .drive import DriveReport, run_due_jobs
    from .passes import Pass
    from .records import JobRunRecord, job_runs
    from .starts import restart_job_run, start_job_run
    from .steering import cancel_job_run, pause_job_run, retry_job_run_now, unpause_job_run

__all__ = [
    "DriveReport",
    "GiveUp",
    "JobRunRecord",
    "Pass",
    "RetryPolicy",
    "cancel_job_run",
    "job",
    "job_runs",
    "pause_job_run",
    "restart_job_run",
    "retry_job_run_now",
    "run_due_jobs",
    "start_job_run",
    "unpause_job_run",
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
    "cancel_job_run": "steering",
    "pause_job_run": "steering",
    "unpause_job_run": "steering",
    "retry_job_run_now": "steering",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobruns' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
