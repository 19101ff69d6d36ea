"""``manage.py pause_job_run RUN_ID ...``: see ``django_jobruns.pause_job_run``."""

from django_jobruns.steering import pause_job_run

from ._steer import command

Command = command("Paused", pause_job_run, reason=False)
