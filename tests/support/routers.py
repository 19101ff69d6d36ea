"""A router that gives django_jobruns a database of its own, as a project might."""

from __future__ import annotations

from typing import Any

APP = "django_jobruns"


class JobRunsRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "jobruns" if model._meta.app_label == APP else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "jobruns" if model._meta.app_label == APP else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return (app_label == APP) == (db == "jobruns")
