from django.apps import AppConfig


class TestsConfig(AppConfig):
    """The test suite is an app, so its jobs.py is autodiscovered like any other."""

    name = "tests"
    label = "tests"
    default_auto_field = "django.db.models.BigAutoField"
