from django.apps import AppConfig


class JobRunsConfig(AppConfig):
    name = "django_jobruns"
    label = "django_jobruns"
    verbose_name = "Job runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the system checks)

        # Each installed app's jobs.py registers its jobs, as admin.py does.
        autodiscover_modules("jobs")
