"""``manage.py unpause_job_run RUN_ID ...``: see ``django_jobruns.unpause_job_run``."""

from django_jobruns.steering import unpause_job_run

from ._steer import command

Command = command("Unpaused", unpause_job_run, reason=False)
