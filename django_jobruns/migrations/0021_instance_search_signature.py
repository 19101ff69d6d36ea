"""The instance search's GiST trigram index with a signature of 256 bytes (pg_trgm's default is 12), and
both search indexes' statistics taken from a larger sample.

Instances are keys sharing a prefix with digits after it ("supplier-5000002"):
their digits alone are a thousand distinct trigrams. A GiST trigram index keeps,
above its leaves, a signature of each subtree's trigrams: with 12 bytes (95 bits)
those signatures are full, every page there may hold any trigram, and a search
for a word no instance holds read the index through (``peer``: 40 000 pages,
200 ms, at ten million runs; and every admin search names each of its words in
both columns). With 256 bytes the signatures keep room: at a million runs the
same word is found absent at the root (one page), a rare instance is read in 147
pages rather than 2 659, and ``123`` in 2 014 rather than 11 828. The index is no
larger (84 MB against 92 MB at a million runs); it takes twice as long to build.

A search names each word in both columns, and PostgreSQL's plan ANDs the
words' index scans, stopping at the first that finds nothing: so the words it
thinks rarest should go first. With the default statistics (100 entries), every
word not in the sample was thought as rare as any other, and a word in half a
percent of the instances (``123``, 50 000 of ten million) could go first: its
scan read 21 000 pages. With 1 000 entries such a word is known for what it is,
and the absent word, scanned first, ends the search at once. ANALYZE then
samples 300 000 rows of the table rather than 30 000 (4.5 s at ten million).

Built CONCURRENTLY (writes go on meanwhile; at ten million runs, six minutes),
then 0008's index is dropped and the table analysed (the new index's expression
has no statistics until then).
"""

from django.db import migrations

WIDE = "jobruns_search_instance_sig"
NARROW = "jobruns_search_instance_gist"
TABLE = "django_jobruns_jobrun"
SIGNATURE = 256
ERROR = "jobruns_search_error"
#: Entries of each search index's statistics (PostgreSQL's default is 100).
STATISTICS = 1000


def _trigram_available(connection):
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        return cur.fetchone() is not None


def _build(schema_editor, name, options):
    q = schema_editor.connection.ops.quote_name
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {q(name)} ON {q(TABLE)} USING gist "
        f"((UPPER({q('instance')}::text)) gist_trgm_ops{options})"
    )


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not _trigram_available(connection):
        return  # 0004 said why there is no trigram index
    _build(schema_editor, WIDE, f"(siglen = {SIGNATURE})")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(NARROW)}")
    _statistics(schema_editor, STATISTICS)


def _statistics(schema_editor, entries):
    q = schema_editor.connection.ops.quote_name
    for index in (WIDE, ERROR):
        schema_editor.execute(f"ALTER INDEX IF EXISTS {q(index)} ALTER COLUMN 1 SET STATISTICS {entries}")
    with schema_editor.connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {q(TABLE)})")
        (rows,) = cur.fetchone()
    if rows:  # an empty table's statistics would say it stays empty
        schema_editor.execute(f"ANALYZE {q(TABLE)}")


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or not _trigram_available(connection):
        return
    _build(schema_editor, NARROW, "")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {connection.ops.quote_name(WIDE)}")
    _statistics(schema_editor, -1)  # the default again; analysed once the narrow index is back


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("django_jobruns", "0020_backoff_index")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
