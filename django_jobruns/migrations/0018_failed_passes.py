"""``JobRun.failed_passes``: every failed pass over a run's life, kept after it is done.

One ``ALTER TABLE ADD COLUMN`` with a constant default on every database, as
0012's ``priority``: no table rewrite (Django's own AddField rebuilds the whole
table on SQLite for a NOT NULL column, which would also drop the search
index's triggers). Runs that exist already start from 0.
"""

from django.db import migrations, models


def add(apps, schema_editor):
    q = schema_editor.quote_name
    table, column = q("django_jobruns_jobrun"), q("failed_passes")
    schema_editor.execute(f"ALTER TABLE {table} ADD COLUMN {column} integer NOT NULL DEFAULT 0")


def drop(apps, schema_editor):
    q = schema_editor.quote_name
    schema_editor.execute(f"ALTER TABLE {q('django_jobruns_jobrun')} DROP COLUMN {q('failed_passes')}")


class Migration(migrations.Migration):
    dependencies = [("django_jobruns", "0017_due_at")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="jobrun",
                    name="failed_passes",
                    field=models.IntegerField(db_default=0, default=0),
                ),
            ],
            database_operations=[migrations.RunPython(add, drop)],
        ),
    ]
