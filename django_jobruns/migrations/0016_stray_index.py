"""An index of the runs that carry a warning, for the job filter's jobs that are not registered.

Every list page of the admin offers, beside the registered jobs, the jobs of
running runs a drive marked "job not registered". Found by reading the running
runs for the mark, that was most of each page's time at a million runs; the
marked runs are few, and a warning is written rarely (never by a claim, a pass
or a release that has none), so an index of the warned runs costs the hot path
nothing:

- PostgreSQL and SQLite: ``(status, module, job)`` of the runs whose
  ``last_warning`` is set (a partial index; built CONCURRENTLY on PostgreSQL);
- MariaDB/MySQL, which have no partial indexes: the warning's first characters,
  which the mark's ``LIKE 'job not registered%'`` reads as a range.
"""

from django.db import migrations

NAME = "jobruns_warned"
TABLE = "django_jobruns_jobrun"
#: The characters of the warning MariaDB indexes: the mark's prefix (drive.UNREGISTERED_WARNING) fits.
PREFIX = 24


def create(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    if connection.vendor == "mysql":
        schema_editor.execute(f"CREATE INDEX {q(NAME)} ON {q(TABLE)} ({q('last_warning')}({PREFIX}))")
    elif connection.vendor in ("postgresql", "sqlite"):
        concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
        schema_editor.execute(
            f"CREATE INDEX {concurrently}IF NOT EXISTS {q(NAME)} ON {q(TABLE)} "
            f"({q('status')}, {q('module')}, {q('job')}) WHERE {q('last_warning')} IS NOT NULL"
        )


def drop(apps, schema_editor):
    connection = schema_editor.connection
    q = connection.ops.quote_name
    if connection.vendor == "mysql":
        schema_editor.execute(f"DROP INDEX {q(NAME)} ON {q(TABLE)}")
    elif connection.vendor in ("postgresql", "sqlite"):
        concurrently = "CONCURRENTLY " if connection.vendor == "postgresql" else ""
        schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {q(NAME)}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("django_jobruns", "0015_overview_indexes"),
    ]

    # Database only, as 0015's: a conditional index in the model's state draws models.W037 on MariaDB.
    operations = [migrations.RunPython(create, drop)]
