"""The instance search on PostgreSQL through a GiST trigram index instead of a GIN one.

Instances are short keys that share a prefix ("supplier-1", "supplier-2", ...).
A GIN trigram index answers ``LIKE '%supplier-5000002%'`` by reading the whole
posting list of every trigram of the term, and the prefix's trigrams are in
every row: 0.5 s at ten million runs. A GiST trigram index descends to the
rows whose signatures hold all of them: tens of milliseconds. Error texts are
long, which saturates GiST signatures, so they keep their GIN index (0004).
Built CONCURRENTLY (writes go on meanwhile), then the GIN index is dropped.
"""

from django.db import migrations

GIST = "jobruns_search_instance_gist"
GIN = "jobruns_search_instance"


def _trigram_available(connection):
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        return cur.fetchone() is not None


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not _trigram_available(connection):
        return  # 0004 said why there is no trigram index
    q = connection.ops.quote_name
    table = q(apps.get_model("django_jobruns", "JobRun")._meta.db_table)
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(GIST)} ON {table} USING gist ((UPPER({q('instance')}::text)) "
        "gist_trgm_ops)"
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(GIN)}")


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not _trigram_available(connection):
        return
    q = connection.ops.quote_name
    table = q(apps.get_model("django_jobruns", "JobRun")._meta.db_table)
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(GIN)} ON {table} USING gin ((UPPER({q('instance')}::text)) "
        "gin_trgm_ops)"
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {q(GIST)}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("django_jobruns", "0007_sqlite_search")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
