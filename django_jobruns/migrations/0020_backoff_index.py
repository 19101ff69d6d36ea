"""An index of the runs waiting out a backoff, for the overview's "in backoff" count on PostgreSQL.

The overview counts the running runs whose ``next_attempt_at`` is still ahead.
No index led by that column existed: the count read every running run's entry
of ``jobruns_due`` (2.5 million at ten million retained runs, 80 ms on each view
of the changelist) to find the few in backoff. This partial index holds only
the runs with a backoff's end recorded, which a failed pass writes and the next
committed pass clears: a run that never fails never enters it, so the hot path
pays nothing (a failed pass's UPDATE was not a HOT one already: it writes
``due_at``, which ``jobruns_due_at`` indexes). Built CONCURRENTLY.

PostgreSQL only: SQLite's overview reads the running runs once for all its
counts, and MariaDB/MySQL have no partial index (a plain one would be written by
every run's last pass).
"""

from django.db import migrations

NAME = "jobruns_backoff"
TABLE = "django_jobruns_jobrun"


def create(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    q = connection.ops.quote_name
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(NAME)} ON {q(TABLE)} ({q('next_attempt_at')}) "
        f"WHERE {q('status')} = 'running' AND {q('next_attempt_at')} IS NOT NULL"
    )


def drop(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(NAME)}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("django_jobruns", "0019_schedules"),
    ]

    # Database only, as 0015's and 0016's.
    operations = [migrations.RunPython(create, drop)]
