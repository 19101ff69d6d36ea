"""The admin's text search: an index finds the candidates, Django's own conditions decide."""

from __future__ import annotations

from datetime import timedelta
from importlib import import_module

import pytest
from django.contrib.admin.sites import site
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, Status
from django_jobruns.pruning import prune_job_runs

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_jobruns_jobrun_changelist"
sqlite_only = pytest.mark.skipif("connection.vendor != 'sqlite'", reason="the FTS5 index is SQLite's")


def run_with(instance, error=None, *, ended_days_ago=None):
    run, _ = start_job_run("tests.walk", instance=instance)
    fields = {}
    if error is not None:
        fields["last_error"] = error
    if ended_days_ago is not None:
        fields.update(status=Status.FAILED, live=None, ended_at=timezone.now() - timedelta(days=ended_days_ago))
    if fields:
        JobRun.objects.filter(pk=run.pk).update(**fields)
    return run


def found(term):
    """The runs the admin's search finds for ``term``, as Django's changelist gets them."""
    admin = site._registry[JobRun]
    request = RequestFactory().get("/")
    queryset, _ = admin.get_search_results(request, JobRun.objects.all(), term)
    return set(queryset.values_list("instance", flat=True))


def plain(term):
    """What Django's own search (``LIKE`` on every word, no index) finds for ``term``."""
    from django.contrib.admin import ModelAdmin

    queryset, _ = ModelAdmin.get_search_results(site._registry[JobRun], None, JobRun.objects.all(), term)
    return set(queryset.values_list("instance", flat=True))


def test_search_finds_exactly_what_djangos_search_finds():
    run_with("supplier-7", "UpstreamUnavailable: supplier 7 reset after page 12")
    run_with("supplier-77", "ConnectionError: gateway timeout")
    run_with("Zürich-Depot", 'ValueError: "quoted" text, 100% sure')
    run_with("ab")
    run_with("plain")
    terms = [
        "supplier",
        "SUPPLIER-7",
        "lier-7",
        "supplier 7 reset",
        "gateway timeout",
        "7",
        "ab",
        '"page 12"',
        "zürich",
        "100%",
        '"quoted"',
        "nothing-like-it",
        "reset gateway",
    ]
    for term in terms:
        assert found(term) == plain(term), term
    assert found("supplier 7 reset") == {"supplier-7"}
    assert found("lier-7") == {"supplier-7", "supplier-77"}


@sqlite_only
def test_sqlite_search_uses_the_trigram_index(admin_client):
    run_with("supplier-42", "UpstreamUnavailable: supplier 42 reset")
    with CaptureQueriesContext(connection) as ctx:
        page = admin_client.get(reverse(CHANGELIST), {"q": "supplier 42 reset"}).content.decode()
    assert "supplier-42" in page
    searches = [q["sql"] for q in ctx.captured_queries if "jobruns_search" in q["sql"]]
    assert searches and all("MATCH" in sql for sql in searches), searches
    with connection.cursor() as cur:
        cur.execute("EXPLAIN QUERY PLAN " + searches[-1].replace("%", "%%"))
        plan = " ".join(str(row) for row in cur.fetchall())
    assert "VIRTUAL TABLE INDEX" in plan, plan


@sqlite_only
def test_sqlite_search_index_follows_starts_errors_and_prunes():
    run = run_with("keeper-1")
    gone = run_with("pruned-1", "Boom: will be pruned", ended_days_ago=10)
    assert found("keeper") == {"keeper-1"} and found("pruned") == {"pruned-1"}
    JobRun.objects.filter(pk=run.pk).update(last_error="TimeoutError: slow upstream")
    assert found("slow upstream") == {"keeper-1"}
    JobRun.objects.filter(pk=run.pk).update(last_error=None)
    assert found("slow upstream") == set()
    assert prune_job_runs(older_than=timedelta(days=1)) == 1 and not JobRun.objects.filter(pk=gone.pk).exists()
    # The index agrees with the table, row for row ('integrity-check' raises if not).
    with connection.cursor() as cur:
        cur.execute("INSERT INTO jobruns_search(jobruns_search, rank) VALUES ('integrity-check', 1)")
        cur.execute("SELECT rowid FROM jobruns_search WHERE jobruns_search MATCH %s", ['"pruned"'])
        assert cur.fetchall() == []


@sqlite_only
def test_sqlite_search_index_is_kept_by_triggers_after_every_migration():
    # A later migration that rebuilds the runs table on SQLite drops its
    # triggers with the old table: this fails until that migration adds them back.
    with connection.cursor() as cur:
        cur.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
        triggers = cur.fetchall()
    table = JobRun._meta.db_table
    assert triggers == [
        ("jobruns_search_delete", table),
        ("jobruns_search_insert", table),
        ("jobruns_search_update", table),
    ]


mysql_only = pytest.mark.skipif("connection.vendor != 'mysql'", reason="the sequences table is MariaDB's/MySQL's")


def stored_grams(*runs):
    """The sequences table's rows of ``runs``, as {run id: {sequence, …}} (lower-cased: its collation ignores case)."""
    ids = [run.pk for run in runs]
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT run_id, gram FROM jobruns_search_gram WHERE run_id IN ({', '.join(['%s'] * len(ids))})", ids
        )
        rows = cur.fetchall()
    grams: dict[str, set[str]] = {}
    for run_id, gram in rows:
        grams.setdefault(run_id, set()).add(gram.lower())
    return grams


def expected_grams(*runs):
    wanted = {}
    for run in runs:
        run.refresh_from_db()
        texts = [text.lower() for text in (run.instance, run.last_error) if text]
        wanted[run.pk] = {text[i : i + 3] for text in texts for i in range(len(text) - 2)}
    return wanted


@mysql_only
def test_mariadb_search_looks_up_sequences_by_their_index(admin_client):
    run_with("supplier-42", "UpstreamUnavailable: supplier 42 reset")
    run_with("supplier-43", "UpstreamUnavailable: supplier 43 reset")
    with CaptureQueriesContext(connection) as ctx:
        page = admin_client.get(reverse(CHANGELIST), {"q": "supplier 42 reset"}).content.decode()
    assert "supplier-42" in page and "supplier-43" not in page
    searches = [q["sql"] for q in ctx.captured_queries if "jobruns_search_gram" in q["sql"]]
    assert searches, [q["sql"] for q in ctx.captured_queries]
    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + searches[-1].replace("%", "%%"))
        columns = [c[0] for c in cur.description]
        plan = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
    grams = [row for row in plan if str(row["table"]).startswith("g")]
    # Every sequence looked up through the table's primary key (gram, run_id), none scanned.
    assert grams and all(row["key"] == "PRIMARY" and row["type"] != "ALL" for row in grams), plan


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL's trigram indexes serve the LIKE itself")
def test_words_in_too_many_runs_are_searched_among_the_newest_that_hold_them(admin_client, monkeypatch):
    # A word every failed run holds ("reset") made every one of them a candidate, sorted
    # for each page: 0.9 s on SQLite, 3.6 s on MariaDB at a million runs. Past
    # MAX_CANDIDATES the search looks among the newest that many candidates, and says so.
    search = import_module("django_jobruns.admin.search")
    monkeypatch.setattr(search, "MAX_CANDIDATES", 4)
    runs = [run_with(f"supplier-{n}", f"UpstreamUnavailable: supplier {n} reset") for n in range(7)]
    run_with("other-1", "TimeoutError: slow")
    newest = {run.instance for run in sorted(runs, key=lambda r: r.pk)[-4:]}
    response = admin_client.get(reverse(CHANGELIST), {"q": "reset"})
    shown = {run.instance for run in response.context["cl"].result_list}
    assert shown == newest, (shown, newest)
    assert "the search looked among the newest 4 of them" in response.content.decode()
    # Words few runs hold are searched in full, and the page says nothing of a bound.
    response = admin_client.get(reverse(CHANGELIST), {"q": "slow"})
    assert {run.instance for run in response.context["cl"].result_list} == {"other-1"}
    assert "the search looked among" not in response.content.decode()


@mysql_only
def test_mariadb_sequences_follow_starts_errors_and_prunes():
    run = run_with("keeper-1")
    gone = run_with("pruned-1", "Boom: will be pruned", ended_days_ago=10)
    assert stored_grams(run, gone) == expected_grams(run, gone)
    assert found("keeper") == {"keeper-1"} and found("pruned") == {"pruned-1"}
    JobRun.objects.filter(pk=run.pk).update(last_error="TimeoutError: slow upstream")
    assert stored_grams(run, gone) == expected_grams(run, gone)
    assert found("slow upstream") == {"keeper-1"}
    JobRun.objects.filter(pk=run.pk).update(last_error=None)
    assert stored_grams(run, gone) == expected_grams(run, gone) and found("slow upstream") == set()
    assert prune_job_runs(older_than=timedelta(days=1)) == 1 and not JobRun.objects.filter(pk=gone.pk).exists()
    assert stored_grams(run, gone) == expected_grams(run)


@mysql_only
def test_mariadb_search_table_is_kept_by_triggers():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT trigger_name, event_object_table FROM information_schema.triggers "
            "WHERE trigger_schema = DATABASE() ORDER BY trigger_name"
        )
        triggers = [tuple(row) for row in cur.fetchall()]
    table = JobRun._meta.db_table
    assert triggers == [
        ("jobruns_search_gram_delete", table),
        ("jobruns_search_gram_insert", table),
        ("jobruns_search_gram_update", table),
    ]


@mysql_only
def test_mariadb_sequences_of_a_text_longer_than_the_positions_table():
    # The trigger selects the first sequences from a table of positions and loops over the rest.

    positions = import_module("django_jobruns.migrations.0010_mysql_search").POSITIONS
    tail = "needle-at-the-end"
    run = run_with("long-1", "x" * (positions + 50) + tail)
    assert stored_grams(run) == expected_grams(run)
    assert found(tail) == plain(tail) == {"long-1"}


@mysql_only
@pytest.mark.django_db(transaction=True)  # DDL commits on MariaDB: the test's rows are flushed after it
def test_mariadb_search_migration_run_again_keeps_its_index():
    # A migration that died after creating its triggers is run again: it must
    # make them afresh, not fail on them and leave the search without its index.

    from django.apps import apps

    migration = import_module("django_jobruns.migrations.0010_mysql_search")
    run = run_with("again-1", "Boom: run again")
    with connection.schema_editor(atomic=False) as editor:
        migration.forwards(apps, editor)
    test_mariadb_search_table_is_kept_by_triggers()
    assert stored_grams(run) == expected_grams(run) and found("run again") == {"again-1"}


@mysql_only
def test_mariadb_search_joins_from_the_rarest_sequences(admin_client):
    # A long instance shares its prefix's sequences with every run: the join starts
    # from the sequences fewest runs hold, counted first.
    for n in range(30):
        run_with(f"supplier-{n:04d}", "UpstreamUnavailable: supplier reset")
    run_with("supplier-7777", "UpstreamUnavailable: supplier reset")
    search = import_module("django_jobruns.admin.search")
    grams, rarest = search.rarest_grams(connection.alias, ["supplier-7777"])
    assert grams[0] == "777" and rarest == 1, (grams, rarest)
    assert found("supplier-7777") == {"supplier-7777"}
