"""Exact keys on MariaDB/MySQL: the key and step columns compare byte for byte.

Their default collations ignore case, accents and trailing spaces, so a start
for ``'Supplier-7'`` would join the run of ``'supplier-7'`` (and ``'x '`` that of
``'x'``). SQLite and PostgreSQL compare exactly already; nothing changes there.
"""

from django.db import migrations

COLUMNS = {
    "django_jobruns_jobrun": [("module", 100), ("job", 100), ("instance", 200)],
    "django_jobruns_jobstep": [("step", 255)],
}


def _binary_collation(connection):
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"  # NO PAD: 'x ' and 'x' differ
    return "utf8mb4_0900_bin" if connection.mysql_version >= (8, 0) else "utf8mb4_bin"


def _alter(schema_editor, collation):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    q = connection.ops.quote_name
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f"MODIFY {q(name)} varchar({length}) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
            for name, length in columns
        )
        schema_editor.execute(f"ALTER TABLE {q(table)} {changes}")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        _alter(schema_editor, _binary_collation(schema_editor.connection))


def backwards(apps, schema_editor):
    # Keys stay exact. Back to a collation that ignores case, two live runs
    # whose keys differ only in case would break the one-live-run constraint,
    # and the migration would fail half-way (``migrate django_jobruns zero``
    # included); the code of 0002 works as well, or better, on exact keys.
    pass


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there
    dependencies = [("django_jobruns", "0002_steering")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
