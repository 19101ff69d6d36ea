"""SQLite: the runs restarted from a run, found through an index of the restarted runs only.

The foreign key's index holds every run, nearly all with no predecessor; SQLite's
ANALYZE records it as one value shared by the whole table, after which the
planner scans the table rather than use it (0.4 s for a change view at a million
runs). A partial index of the runs that have a predecessor is what the lookup
needs, and costs nothing to runs that were never restarted. PostgreSQL's
statistics see the NULLs for what they are; MariaDB's index dives likewise.
"""

from django.db import migrations

NAME = "jobruns_restarts"


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "sqlite":
        return
    q = connection.ops.quote_name
    model = apps.get_model("django_jobruns", "JobRun")
    column = q(model._meta.get_field("restarted_from").column)
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {q(NAME)} ON {q(model._meta.db_table)} ({column}) WHERE {column} IS NOT NULL"
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.connection.ops.quote_name(NAME)}")


class Migration(migrations.Migration):
    dependencies = [("django_jobruns", "0008_instance_search_gist")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
