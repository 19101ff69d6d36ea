"""A ``@task`` on Django's own ImmediateBackend (the ``reference`` alias of the tests' settings).

Apart from :mod:`tests.support.task_functions`, which projects with only this app's backend import.
"""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]


@task(backend="reference")
def immediate_note(log: str, fail: bool) -> None:
    """On Django's ImmediateBackend: a line in ``log`` (whether in a transaction), then if ``fail`` a statement
    the database refuses."""
    from django.db import connection

    with open(log, "a") as out:
        out.write(f"ran in_atomic_block={connection.in_atomic_block}\n")
    if not fail:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table_of_the_tests")
