"""Two small partial indexes for the admin's overview: the runs held under a lease, and the paused runs.

Built CONCURRENTLY on PostgreSQL (writers are not held up at millions of rows).
MariaDB/MySQL have no partial indexes: there they are plain indexes of the same
names (a range ``IS NOT NULL`` of each skips the many runs without a value).
SQLite gets the paused runs' index only (see ``create``).
"""

from django.db import migrations

INDEXES = {
    "jobruns_held": "lease_holder",
    "jobruns_paused": "paused_at",
}


def create(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    if connection.vendor == "mysql":
        for name, column in INDEXES.items():
            schema_editor.execute(f"CREATE INDEX {q(name)} ON {q('django_jobruns_jobrun')} ({q(column)})")
        return
    if connection.vendor not in ("postgresql", "sqlite"):
        return
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    for name, column in INDEXES.items():
        if connection.vendor == "sqlite" and name == "jobruns_held":
            # Every claim and release would write it: a tenth of SQLite's
            # throughput (bench/RESULTS.md); there the overview reads the running runs.
            continue
        schema_editor.execute(
            f"CREATE INDEX {concurrently}IF NOT EXISTS {q(name)} ON {q('django_jobruns_jobrun')} ({q(column)}) "
            f"WHERE {q(column)} IS NOT NULL"
        )


def drop(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    if connection.vendor == "mysql":
        for name in INDEXES:
            schema_editor.execute(f"DROP INDEX {q(name)} ON {q('django_jobruns_jobrun')}")
        return
    if connection.vendor not in ("postgresql", "sqlite"):
        return
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {q(name)}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("django_jobruns", "0014_trace_context"),
    ]

    # Database only: the model declares neither (a conditional index in the
    # model's state draws Django's models.W037 on MariaDB, in every check).
    operations = [migrations.RunPython(create, drop)]
