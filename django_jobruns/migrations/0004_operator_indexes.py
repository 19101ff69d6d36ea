"""Indexes for the operator's pages and retention at millions of retained runs, added without blocking writes.

On PostgreSQL each index is built CONCURRENTLY (writes go on while it builds),
and the admin's searches get trigram indexes (pg_trgm) on the upper-cased
instance and error text, which is what ``icontains`` compares. If the
extension cannot be created (no privilege), the searches still work, by
scanning, and a warning says so. On MariaDB/MySQL InnoDB builds secondary
indexes online; SQLite has no concurrent writers to block for long.
"""

import logging

from django.db import migrations, models

logger = logging.getLogger("django_jobruns")

INDEXES = [
    models.Index(fields=["instance", "id"], name="jobruns_instance"),
    models.Index(fields=["started_at"], name="jobruns_started"),
    models.Index(fields=["ended_at"], name="jobruns_ended"),
    models.Index(fields=["status", "ended_at"], name="jobruns_prune"),
]
TRIGRAM = {"jobruns_search_instance": "instance", "jobruns_search_error": "last_error"}


def forwards(apps, schema_editor):
    model = apps.get_model("django_jobruns", "JobRun")
    connection = schema_editor.connection
    for index in INDEXES:
        if connection.vendor == "postgresql":
            schema_editor.add_index(model, index, concurrently=True)
        else:
            schema_editor.add_index(model, index)
    if connection.vendor != "postgresql":
        return
    q = connection.ops.quote_name
    table = q(model._meta.db_table)
    try:
        with connection.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception as exc:  # noqa: BLE001 -- any refusal: go on without the search indexes
        logger.warning("django_jobruns: no trigram indexes for the admin's search (pg_trgm: %s)", exc)
        return
    for name, column in TRIGRAM.items():
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(name)} ON {table} USING gin ((UPPER({q(column)}::text)) "
            "gin_trgm_ops)"
        )


def backwards(apps, schema_editor):
    model = apps.get_model("django_jobruns", "JobRun")
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        for name in TRIGRAM:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(name)}")
    for index in INDEXES:
        if connection.vendor == "postgresql":
            schema_editor.remove_index(model, index, concurrently=True)
        else:
            schema_editor.remove_index(model, index)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("django_jobruns", "0003_exact_keys")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex("jobrun", index) for index in INDEXES],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
