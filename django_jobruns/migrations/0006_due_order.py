"""The due read in the order runs became due, as one range of an index (D9).

A partial index over the runs in flight, on ``status, COALESCE(next_attempt_at,
started_at), id`` (the status first, so SQLite's planner sees an equality to use): built CONCURRENTLY on PostgreSQL, plainly on SQLite.
MariaDB/MySQL have no partial or expression indexes; there the due read sorts
the runs in flight that ``jobruns_due`` finds (its cost still tracks what is in
flight, not the retained history).
"""

from django.db import migrations

NAME = "jobruns_due_order"


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor not in ("postgresql", "sqlite"):
        return
    q = connection.ops.quote_name
    table = q(apps.get_model("django_jobruns", "JobRun")._meta.db_table)
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    schema_editor.execute(
        f"CREATE INDEX {concurrently}IF NOT EXISTS {q(NAME)} ON {table} "
        f"({q('status')}, (COALESCE({q('next_attempt_at')}, {q('started_at')})), {q('id')}) "
        f"WHERE {q('status')} = 'running'"
    )


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor not in ("postgresql", "sqlite"):
        return
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {connection.ops.quote_name(NAME)}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("django_jobruns", "0005_no_db_constraints")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
