"""The admin's text search at scale on MariaDB/MySQL: a trigram table kept by triggers.

MariaDB has no substring index (no trigram operator class; its full-text
parsers split words, and MySQL's ``ngram`` parser is MySQL's only), so a
``LIKE '%term%'`` search scans every run. This migration adds a table of the
three-character sequences of each run's ``instance`` and ``last_error``, one
row per distinct sequence and run, kept in step by triggers on the runs table;
the admin's search narrows to the runs holding every sequence it looks for
(``django_jobruns.search``), and Django's own conditions still decide.

The sequences are compared in the collation of ``last_error`` when it is one
that matches character by character (``*_general_ci``, ``*_bin`` and the like):
two texts equal under it have equal sequences under it, so the narrowing never
drops a run Django's ``LIKE`` would find (``instance`` is binary, stricter
still). Under a collation that expands or ignores characters (the
``unicode``/``uca`` families) nothing is created and the search scans, as
before; so too when the database refuses triggers (binary logging without
the privilege), with a warning.

Existing runs are indexed in batches of 2 000, each its own transaction.
"""

import logging

from django.db import migrations

logger = logging.getLogger("django_jobruns")

TABLE = "jobruns_search_gram"
TRIGGERS = ("jobruns_search_gram_insert", "jobruns_search_gram_update", "jobruns_search_gram_delete")
BATCH = 2000
#: A table of the numbers 1..POSITIONS, from which a trigger selects a text's sequences in one statement.
POSITIONS_TABLE = "jobruns_search_position"
POSITIONS = 4096


def _add(column, run):
    """A trigger's statements inserting the sequences of ``column`` of row ``run`` (NEW).

    One ``INSERT ... SELECT`` over the positions table covers the first
    ``POSITIONS`` characters; a loop covers the rest of a longer text.
    """
    text, key = f"{run}.{column}", f"{run}.id"
    insert = f"INSERT IGNORE INTO {TABLE} (gram, run_id)"
    return (
        f"{insert} SELECT SUBSTRING({text}, n, 3), {key} FROM {POSITIONS_TABLE} WHERE n <= CHAR_LENGTH({text}) - 2; "
        f"SET i = {POSITIONS + 1}; "
        f"WHILE i <= CHAR_LENGTH({text}) - 2 DO {insert} VALUES (SUBSTRING({text}, i, 3), {key}); SET i = i + 1; "
        f"END WHILE;"
    )


def statements(table, quote, collation, id_type):
    run = quote(table)
    instance, error = quote("instance"), quote("last_error")
    add = f"{_add(instance, 'NEW')} {_add(error, 'NEW')}"
    insert, update, delete = TRIGGERS
    return [
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        f"gram VARCHAR(3) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        f"run_id {id_type} NOT NULL, "
        f"PRIMARY KEY (gram, run_id), KEY {TABLE}_run (run_id)"
        f") ENGINE=InnoDB",
        f"CREATE TRIGGER {insert} AFTER INSERT ON {run} FOR EACH ROW BEGIN DECLARE i INT; {add} END",
        # Only when the text changed: a pass commit that leaves it alone costs nothing.
        f"CREATE TRIGGER {update} AFTER UPDATE ON {run} FOR EACH ROW BEGIN DECLARE i INT; "
        f"IF NOT (OLD.{instance} <=> NEW.{instance}) OR NOT (OLD.{error} <=> NEW.{error}) "
        f"OR NOT (OLD.id <=> NEW.id) THEN "
        f"DELETE FROM {TABLE} WHERE run_id = OLD.id; {add} "
        f"END IF; END",
        f"CREATE TRIGGER {delete} AFTER DELETE ON {run} FOR EACH ROW DELETE FROM {TABLE} WHERE run_id = OLD.id",
    ]


def _matches_by_character(collation):
    """Whether ``collation`` compares character by character (no expansions, no ignorable characters)."""
    return collation.endswith("_bin") or not any(family in collation for family in ("unicode", "uca", "0900"))


def _column(cur, table, column):
    cur.execute(
        "SELECT collation_name, column_type FROM information_schema.columns "
        "WHERE table_schema = DATABASE() AND table_name = %s AND column_name = %s",
        [table, column],
    )
    return cur.fetchone()


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    model = apps.get_model("django_jobruns", "JobRun")
    table = model._meta.db_table
    with connection.cursor() as cur:
        collation = _column(cur, table, "last_error")[0]
        if not _matches_by_character(collation):
            logger.warning(
                "django_jobruns: no search index for the admin (last_error's collation %s expands or ignores "
                "characters; a search scans)",
                collation,
            )
            return
        id_column = _column(cur, table, "id")
        id_type = f"{id_column[1]} CHARACTER SET utf8mb4 COLLATE {id_column[0]}"
        cur.execute(f"CREATE TABLE IF NOT EXISTS {POSITIONS_TABLE} (n SMALLINT UNSIGNED NOT NULL PRIMARY KEY)")
        cur.executemany(f"INSERT IGNORE INTO {POSITIONS_TABLE} (n) VALUES (%s)", [(n,) for n in range(1, POSITIONS + 1)])
        try:
            # A migration that died half-way is run again: the triggers are made afresh.
            for name in TRIGGERS:
                cur.execute(f"DROP TRIGGER IF EXISTS {name}")
            for statement in statements(table, connection.ops.quote_name, collation, id_type):
                cur.execute(statement)
        except Exception as exc:  # noqa: BLE001 -- triggers refused (binary logging without the privilege)
            logger.warning("django_jobruns: no search index for the admin (MariaDB/MySQL triggers: %s)", exc)
            for name in TRIGGERS:
                cur.execute(f"DROP TRIGGER IF EXISTS {name}")
            cur.execute(f"DROP TABLE IF EXISTS {TABLE}, {POSITIONS_TABLE}")
            return
        # The runs already there, a batch at a time (the triggers keep the rest).
        after = ""
        q = connection.ops.quote_name
        while True:
            cur.execute(
                f"SELECT id, instance, last_error FROM {q(table)} WHERE id > %s ORDER BY id LIMIT {BATCH}", [after]
            )
            batch = cur.fetchall()
            if not batch:
                break
            after = batch[-1][0]
            rows = []
            for run_id, *texts in batch:
                grams = {text[i : i + 3] for text in texts if text for i in range(len(text) - 2)}
                rows.extend((gram, run_id) for gram in grams)
            if rows:
                cur.executemany(f"INSERT IGNORE INTO {TABLE} (gram, run_id) VALUES (%s, %s)", rows)


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    with connection.cursor() as cur:
        for name in TRIGGERS:
            cur.execute(f"DROP TRIGGER IF EXISTS {name}")
        cur.execute(f"DROP TABLE IF EXISTS {TABLE}, {POSITIONS_TABLE}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("django_jobruns", "0009_sqlite_restarts_index")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
