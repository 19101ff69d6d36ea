"""Create (or reset) the demo project's admin user and print its credentials."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

USERNAME = "admin"
PASSWORD = "jobruns-demo"


class Command(BaseCommand):
    help = "Create or reset the demo superuser (for the local demo only) and print its credentials."

    def handle(self, *args: Any, **options: Any) -> None:
        user, _ = get_user_model().objects.get_or_create(username=USERNAME)
        user.is_staff = user.is_superuser = True
        user.set_password(PASSWORD)
        user.save()
        self.stdout.write(f"demo admin: user {USERNAME!r}, password {PASSWORD!r}")
