"""Settings for the torture harness's workers: the demo project plus the torture app."""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.torture_app"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
