"""``manage.py cancel_job_run RUN_ID ...``: see ``django_jobruns.cancel_job_run``."""

from django_jobruns.steering import cancel_job_run

from ._steer import command

Command = command("Cancelled", cancel_job_run, reason=True)
