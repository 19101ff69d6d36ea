"""``manage.py retry_job_run_now RUN_ID ...``: see ``django_jobruns.retry_job_run_now``."""

from django_jobruns.steering import retry_job_run_now

from ._steer import command

Command = command("Made due now", retry_job_run_now, reason=False)
# A paused run made due still does not run: say so, and exit non-zero.
Command.stays_paused_is_a_failure = True
