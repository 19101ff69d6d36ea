"""The migrations describe the models as they are, on the Django version and database the suite runs on."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_makemigrations_finds_nothing_left_to_write():
    # A model changed without its migration ships a project whose own `makemigrations` writes one
    # into site-packages, or fails its CI's `makemigrations --check`.
    out = StringIO()
    try:
        call_command("makemigrations", "django_jobruns", check=True, dry_run=True, stdout=out, verbosity=2)
    except SystemExit:  # --check exits non-zero when a migration is missing
        pytest.fail(f"the models differ from the migrations:\n{out.getvalue()}")
