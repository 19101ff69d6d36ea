"""``JobRun.due_at``: when a run became due, the due order on every database (D9).

Online at millions of rows:

1. the column is added nullable with no default: a change of the catalogue only
   (PostgreSQL, MariaDB's instant ADD COLUMN, SQLite);
2. only the live runs are filled, in batches of 5 000 by id, each batch its own
   transaction (a finished run keeps NULL, as the model says): the time it
   became due is its backoff's end, else its last update;
3. the index in due order is built beside the old one (``CONCURRENTLY`` on
   PostgreSQL), then the old expression index is dropped. It is partial (the
   runs in flight) on PostgreSQL and SQLite, and a plain index on MariaDB/MySQL,
   whose descending priority key (MariaDB 10.8+, MySQL 8) reads the due runs in
   order instead of sorting them.

A drive of the old code keeps working during steps 1 and 2 (it orders by the
old expression); a drive of the new code needs step 2 done, which the migration
finishes before it returns.
"""

from django.db import migrations, models

NAME = "jobruns_due_at"
OLD = "jobruns_due_order"
BATCH = 5_000


def fill(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    table, running = q("django_jobruns_jobrun"), "'running'"
    after = ""
    while True:
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT {q('id')} FROM {table} WHERE {q('status')} = {running} AND {q('id')} > %s "
                f"ORDER BY {q('id')} LIMIT {BATCH}",
                [after],
            )
            ids = [row[0] for row in cur.fetchall()]
        if not ids:
            return
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE {table} SET {q('due_at')} = COALESCE({q('next_attempt_at')}, {q('updated_at')}) "
                f"WHERE {q('id')} >= %s AND {q('id')} <= %s AND {q('status')} = {running} AND {q('due_at')} IS NULL",
                [ids[0], ids[-1]],
            )
        after = ids[-1]


def create(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    table = q("django_jobruns_jobrun")
    columns = f"{q('priority')} DESC, {q('due_at')}, {q('id')}"
    if connection.vendor == "mysql":
        schema_editor.execute(f"CREATE INDEX {q(NAME)} ON {table} ({q('status')}, {columns})")
        return
    if connection.vendor not in ("postgresql", "sqlite"):
        schema_editor.execute(f"CREATE INDEX {q(NAME)} ON {table} ({q('status')}, {columns})")
        return
    concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
    schema_editor.execute(
        f"CREATE INDEX {concurrently}IF NOT EXISTS {q(NAME)} ON {table} ({columns}) WHERE {q('status')} = 'running'"
    )
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {q(OLD)}")


def drop(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    table = q("django_jobruns_jobrun")
    if connection.vendor in ("postgresql", "sqlite"):
        concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
        schema_editor.execute(
            f"CREATE INDEX {concurrently}IF NOT EXISTS {q(OLD)} ON {table} ({q('status')}, {q('priority')} DESC, "
            f"(COALESCE({q('next_attempt_at')}, {q('started_at')})), {q('id')}) WHERE {q('status')} = 'running'"
        )
        schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {q(NAME)}")
    else:
        schema_editor.execute(f"DROP INDEX {q(NAME)} ON {table}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY, and each batch of the fill its own transaction

    dependencies = [("django_jobruns", "0016_stray_index")]

    operations = [
        migrations.AddField(model_name="jobrun", name="due_at", field=models.DateTimeField(blank=True, null=True)),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=False),
        # Database only, as 0015's: a conditional index in the model's state draws models.W037 on MariaDB.
        migrations.RunPython(create, drop, elidable=False),
    ]
