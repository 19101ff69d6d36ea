from django.apps import AppConfig


class JobRunsConfig(AppConfig):
    name = "django_jobruns"
    label = "django_jobruns"
    verbose_name = "Job runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the system checks)
        from .store.search_index import connect_index

        connection_created.connect(connect_index, dispatch_uid="django_jobruns.store.search_index.connect_index")

        # Each installed app's jobs.py registers its jobs, as admin.py does.
        autodiscover_modules("jobs")

        # A TASKS backend of this app: its internal job is registered here, so
        # a worker that never enqueues still drives the tasks.
        from . import conf

        if conf.task_backends():
            from .backend import register_configured_backends

            register_configured_backends()
