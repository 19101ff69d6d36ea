"""The due read's index leads with priority (highest first), for the tasks of Django's Tasks framework (D9).

``status, priority DESC, COALESCE(next_attempt_at, started_at), id`` over the
runs in flight: built beside the old index (CONCURRENTLY on PostgreSQL), the
old one dropped, the new one given its name. MariaDB/MySQL have no partial or
expression indexes; there the due read sorts the runs in flight.
"""

from django.db import migrations

NAME = "jobruns_due_order"
BUILDING = "jobruns_due_order_building"


def _create(schema_editor, name, *, with_priority):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    priority = f"{q('priority')} DESC, " if with_priority else ""
    schema_editor.execute(
        f"CREATE INDEX {concurrently}IF NOT EXISTS {q(name)} ON {q('django_jobruns_jobrun')} "
        f"({q('status')}, {priority}(COALESCE({q('next_attempt_at')}, {q('started_at')})), {q('id')}) "
        f"WHERE {q('status')} = 'running'"
    )


def _swap(schema_editor, *, with_priority):
    connection = schema_editor.connection
    if connection.vendor not in ("postgresql", "sqlite"):
        return
    q = connection.ops.quote_name
    if connection.vendor == "postgresql":
        _create(schema_editor, BUILDING, with_priority=with_priority)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(NAME)}")
        schema_editor.execute(f"ALTER INDEX {q(BUILDING)} RENAME TO {q(NAME)}")
    else:  # SQLite: one writer, and no index rename
        schema_editor.execute(f"DROP INDEX IF EXISTS {q(NAME)}")
        _create(schema_editor, NAME, with_priority=with_priority)


def forwards(apps, schema_editor):
    _swap(schema_editor, with_priority=True)


def backwards(apps, schema_editor):
    _swap(schema_editor, with_priority=False)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("django_jobruns", "0012_tasks_backend")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
