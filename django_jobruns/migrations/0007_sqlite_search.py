"""The admin's text search at scale on SQLite: an FTS5 trigram index kept by triggers.

PostgreSQL has its trigram GIN indexes (0004). On SQLite, an FTS5 table with
the trigram tokenizer (SQLite 3.34+) indexes each run's ``instance`` and
``last_error`` as an external-content index of the runs table, kept in step by
triggers; the admin's search narrows by it (``django_jobruns.search``). Where
FTS5 or its trigram tokenizer is missing, nothing is created and the search
scans, as before.
"""

import logging

from django.db import migrations

logger = logging.getLogger("django_jobruns")

TABLE = "jobruns_search"
TRIGGERS = ("jobruns_search_insert", "jobruns_search_delete", "jobruns_search_update")


def statements(table, quote):
    run, fts = quote(table), quote(TABLE)
    instance, error = quote("instance"), quote("last_error")
    add = f"INSERT INTO {fts}(rowid, {instance}, {error}) VALUES (new.rowid, new.{instance}, new.{error});"
    remove = (
        f"INSERT INTO {fts}({fts}, rowid, {instance}, {error}) "
        f"VALUES ('delete', old.rowid, old.{instance}, old.{error});"
    )
    insert, delete, update = TRIGGERS
    return [
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {fts} USING fts5({instance}, {error}, content={run}, tokenize='trigram')",
        f"CREATE TRIGGER IF NOT EXISTS {insert} AFTER INSERT ON {run} BEGIN {add} END",
        f"CREATE TRIGGER IF NOT EXISTS {delete} AFTER DELETE ON {run} BEGIN {remove} END",
        # Only when the text changed: a pass commit that leaves the error empty
        # costs the index nothing.
        f"CREATE TRIGGER IF NOT EXISTS {update} AFTER UPDATE OF {instance}, {error} ON {run} "
        f"WHEN old.{instance} IS NOT new.{instance} OR old.{error} IS NOT new.{error} BEGIN {remove} {add} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",
    ]


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return
    table = apps.get_model("django_jobruns", "JobRun")._meta.db_table
    with connection.cursor() as cur:
        try:
            cur.execute("CREATE VIRTUAL TABLE temp.jobruns_probe USING fts5(x, tokenize='trigram')")
            cur.execute("DROP TABLE temp.jobruns_probe")
        except Exception as exc:  # noqa: BLE001 -- no FTS5 or no trigram tokenizer: the search scans
            logger.warning("django_jobruns: no search index for the admin (SQLite FTS5 trigram: %s)", exc)
            return
        for statement in statements(table, connection.ops.quote_name):
            cur.execute(statement)


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cur:
        for name in TRIGGERS:
            cur.execute(f"DROP TRIGGER IF EXISTS {name}")
        cur.execute(f"DROP TABLE IF EXISTS {connection.ops.quote_name(TABLE)}")


class Migration(migrations.Migration):
    dependencies = [("django_jobruns", "0006_due_order")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
