import os

from django.apps import AppConfig


class TortureConfig(AppConfig):
    name = "bench.torture_app"
    label = "torture"

    def ready(self) -> None:
        if os.environ.get("TORTURE_DIR"):
            from django.db.backends.signals import connection_created

            from .kills import install_commit_hook

            connection_created.connect(install_commit_hook)
