"""The operator's queries and retention use their indexes (the plans, not their text, are pinned)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobruns import job_runs
from django_jobruns.models import JobRun, Status
from django_jobruns.pruning import prune_job_runs
from tests.support.factories import finished_runs

pytestmark = pytest.mark.django_db


def plan(sql: str, *, bitmap: bool = False) -> str:
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            # A small table: ask which index the plan can use, as it would on a big one.
            cur.execute("SET LOCAL enable_seqscan = off")
            if bitmap:  # and not the id order's backward scan, which suits a common term only
                cur.execute("SET LOCAL enable_indexscan = off")
            cur.execute(f"EXPLAIN {sql}")
        elif connection.vendor == "sqlite":
            cur.execute(f"EXPLAIN QUERY PLAN {sql}")
        else:
            cur.execute(f"EXPLAIN {sql}")
        return "\n".join(" ".join(str(c) for c in row) for row in cur.fetchall())


def captured(fn):
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return [q["sql"] for q in ctx.captured_queries]


def seed(count: int = 50, error: Callable[[int], str | None] = lambda i: f"UpstreamUnavailable {i}") -> None:
    """``count`` ended runs of instances ``supplier-0`` … (keys sharing a prefix, digits after it)."""
    now = timezone.now()
    JobRun.objects.bulk_create(
        [
            JobRun(
                module="tests",
                job="walk",
                instance=f"supplier-{i}",
                status=Status.DONE,
                live=None,
                started_at=now,
                updated_at=now,
                ended_at=now,
                last_error=error(i),
            )
            for i in range(count)
        ]
    )


def test_job_runs_by_instance_uses_the_instance_index():
    seed()
    (sql,) = captured(lambda: job_runs(instance="supplier-7"))
    assert "jobruns_instance" in plan(sql)


def test_prune_reads_its_batches_through_the_ended_index():
    seed()
    queries = captured(lambda: prune_job_runs(older_than=timedelta(days=1), dry_run=True))
    (count,) = [sql for sql in queries if "COUNT(*)" in sql]  # after the database's clock, when not yet read
    assert "jobruns_prune" in plan(count)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the one-statement batch is PostgreSQL's")
def test_a_prune_batch_is_one_statement_through_the_prune_index():
    seed()
    # Ended a minute ago: the seed dates by this host's clock, the prune's cutoff by the database's
    # (a reading carried forward), which may trail it by a round trip.
    JobRun.objects.update(ended_at=timezone.now() - timedelta(minutes=1))
    queries = captured(lambda: prune_job_runs(older_than=timedelta(0), batch_size=20))
    assert len(queries) == 3 and all(q.startswith("WITH batch") for q in queries), queries  # 20 + 20 + 10
    assert "jobruns_prune" in plan(queries[0])
    assert not JobRun.objects.exists()


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="trigram indexes are PostgreSQL's")
def test_the_admin_search_uses_the_trigram_indexes(admin_client):
    seed()
    queries = captured(lambda: admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), {"q": "lier-4"}))
    search = next(q for q in queries if "LIKE" in q and q.startswith('SELECT "django_jobruns_jobrun"."id"'))
    text = plan(search, bitmap=True)
    assert "jobruns_search_instance_sig" in text and "jobruns_search_error" in text, text


def test_the_due_read_is_a_range_of_the_due_order_index():
    """On every database, MariaDB included: the due order is a plain column with an index in that order (D9)."""
    from django_jobruns.store import store

    now = timezone.now()
    finished_runs(2000, "h", at=now)
    JobRun.objects.bulk_create(
        [
            JobRun(module="tests", job="walk", instance=f"r{i}", started_at=now, updated_at=now, due_at=now)
            for i in range(1000)
        ]
    )
    if connection.vendor != "mysql":  # MySQL's ANALYZE TABLE commits the test's transaction
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    queries = captured(lambda: store().due(timezone.now(), None, 50))
    text = plan(queries[0])
    assert "jobruns_due_at" in text, text
    assert "TEMP B-TREE" not in text and "filesort" not in text and "Sort" not in text.split("Index")[0], text


@pytest.mark.parametrize("field, index", [("started_at", "jobruns_started"), ("ended_at", "jobruns_ended")])
def test_a_date_range_page_is_read_newest_first_along_its_date_index(admin_client, field, index):
    # Ordered by id, a range in the past is found only after every newer run
    # was read and skipped (half a second at ten million runs); ordered by its
    # own date, the page is the range's first rows in the date's index.
    now = timezone.now()
    JobRun.objects.bulk_create(
        [
            JobRun(
                id=f"{i:026d}",
                module="tests",
                job="walk",
                instance=f"d{i}",
                status=Status.DONE,
                live=None,
                # ids in start order, as ULIDs are; but runs started earlier ended later here
                started_at=now - timedelta(minutes=15 * (300 - i)),
                updated_at=now,
                ended_at=now - timedelta(minutes=15 * i),
            )
            for i in range(300)
        ]
    )
    if connection.vendor != "mysql":  # MySQL's ANALYZE TABLE commits the test's transaction
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    day = (now - timedelta(days=1)).date().isoformat()  # 96 runs: more than a page
    params = {f"{field}__range__gte": day, f"{field}__range__lte": day}
    queries = captured(lambda: admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), params))
    page = next(
        q for q in queries if q.replace("`", '"').startswith('SELECT "django_jobruns_jobrun"."id"') and "LIMIT" in q
    )
    assert index in plan(page), plan(page)
    response = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), params)
    shown = [run.instance for run in response.context["cl"].result_list]
    expected = sorted(
        JobRun.objects.filter(**{f"{field}__date": now.date() - timedelta(days=1)}),
        key=lambda run: getattr(run, field),
        reverse=True,
    )
    assert shown == [run.instance for run in expected][: len(shown)] and shown


def test_the_change_view_finds_a_runs_restarts_through_an_index():
    # Nearly every run has no predecessor: the lookup must not become a scan of
    # the table (SQLite's statistics see one value shared by every run).
    finished_runs(2000, "r", status=Status.FAILED)
    old = JobRun.objects.order_by("id").first()
    JobRun.objects.filter(pk=JobRun.objects.order_by("-id").first().pk).update(restarted_from=old)
    if connection.vendor != "mysql":  # MySQL's ANALYZE TABLE commits the test's transaction
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    (sql,) = captured(lambda: list(old.restarts.order_by("id").values_list("id", flat=True)))
    text = plan(sql)
    assert "restarted_from" in text or "jobruns_restarts" in text, text


@pytest.mark.skipif("connection.vendor == 'mysql'", reason="MariaDB has no partial indexes: it reads the running runs")
def test_the_admins_overview_reads_indexes_not_the_table():
    from django_jobruns.admin.overview import overview

    now = timezone.now()
    finished_runs(2000, "h", at=now)
    JobRun.objects.bulk_create(
        [
            JobRun(module="tests", job="walk", instance=f"r{i}", started_at=now, updated_at=now, due_at=now)
            for i in range(500)
        ]
    )
    JobRun.objects.filter(instance__in=["r1", "r2"]).update(lease_holder="host:1:a", lease_expires_at=now)
    JobRun.objects.filter(instance="r3").update(paused_at=now)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    queries = captured(lambda: overview(JobRun.objects.all(), now))
    assert len(queries) == 2, queries  # the counts and the queue's head in one, the chart's hours
    plans = {sql: plan(sql) for sql in queries}
    counts = plans[queries[0]]
    assert "jobruns_prune" in counts, counts
    if connection.vendor == "postgresql":
        assert "jobruns_paused" in counts and "jobruns_held" in counts and "jobruns_backoff" in counts, counts
    else:
        # SQLite has no index of the held runs (every claim and release would write it): it reads
        # the running runs, once for all their counts, along an index of them.
        assert "USING INDEX jobruns_prune (status=?)" in counts, counts  # the running runs, once for all counts
        assert "USING INDEX jobruns_due_at" in counts, counts  # the head of the queue
    for sql, text in plans.items():
        # Every statement is led by an index: none reads the whole table.
        assert "jobruns_" in text and "SCAN django_jobruns_jobrun\n" not in text + "\n", (sql, text)
        assert "Seq Scan" not in text, (sql, text)


def test_the_job_filters_stray_jobs_are_found_through_an_index(admin_client):
    # Every list page offers the jobs of running runs a drive marked "job not
    # registered": at a million runs, reading the running runs for the mark was
    # most of each page's time. The few marked runs are in an index of their own.
    from django_jobruns.models import UNREGISTERED_WARNING

    now = timezone.now()
    JobRun.objects.bulk_create(
        [JobRun(module="tests", job="walk", instance=f"r{i}", started_at=now, updated_at=now) for i in range(2000)]
        + [
            JobRun(
                module="gone",
                job="feed",
                instance=f"s{i}",
                started_at=now,
                updated_at=now,
                last_warning=f"{UNREGISTERED_WARNING} in the process that drove it",
            )
            for i in range(3)
        ]
    )
    if connection.vendor != "mysql":  # MySQL's ANALYZE TABLE commits the test's transaction
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
    queries = captured(
        lambda: admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), {"status__exact": "failed"})
    )
    (strays,) = [q for q in queries if "last_warning" in q and "DISTINCT" in q]
    text = plan(strays)
    assert "jobruns_warned" in text, text
    page = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist")).content.decode()
    assert "gone.feed (not registered)" in page


def suppliers(count: int) -> None:
    """:func:`seed`, a quarter of them with an error text, the table analysed."""
    seed(count, lambda i: f"UpstreamUnavailable: supplier {i} reset after page {i % 97}" if i % 4 == 2 else None)
    with connection.cursor() as cur:
        cur.execute("ANALYZE django_jobruns_jobrun")
        # New entries of a GIN index wait in a list every scan reads through, until a vacuum (or 4 MB
        # of them) moves them into the index: as they would be after a while in a database in use.
        cur.execute("SELECT gin_clean_pending_list('jobruns_search_error'::regclass)")


def analysed(sql: str) -> dict[str, Any]:
    """The plan of ``sql`` as run (EXPLAIN ANALYZE, with the pages each node read)."""
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        (document,) = cur.fetchone()
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def blocks(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


def index_pages(name: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_relation_size(%s::regclass) / 8192", [name])
        (pages,) = cur.fetchone()
    return int(pages)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="trigram indexes are PostgreSQL's")
def test_a_search_for_a_word_no_instance_holds_reads_next_to_nothing_of_the_instance_index(admin_client):
    """A word absent from every instance is found absent near the index's root, not by reading the index through.

    Instances are keys sharing a prefix, with digits after it: a thousand trigrams of digits alone. A
    GiST signature of 12 bytes (pg_trgm's default) is full of them above the leaves, so every page
    there could hold any trigram, and a search for ``peer`` read the whole index (40 000 pages, 200 ms,
    at ten million runs).
    """
    suppliers(20_000)
    queries = captured(lambda: admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), {"q": "peer"}))
    # The page's rows, read first: when they are fewer than a page, they are its count too.
    search = next(q for q in queries if "LIKE UPPER(" in q)
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
    (scan,) = [n for n in nodes(analysed(search)) if n.get("Index Name", "").startswith("jobruns_search_instance")]
    pages = index_pages(scan["Index Name"])
    assert pages > 50, pages  # enough of an index for reading it through to show
    # The root and a few pages under it (more of them once earlier tests have grown the index); with
    # 12-byte signatures this read 84 of 188 pages.
    assert blocks(scan) <= 10, f"read {blocks(scan)} of the index's {pages} pages to find no instance holds 'PEER'"


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="trigram indexes are PostgreSQL's")
@pytest.mark.parametrize("term", ["123 peer", "peer 123", "connection reset by peer 123"])
def test_a_search_with_a_word_no_run_holds_ends_at_that_word_whatever_else_it_names(admin_client, term):
    """The words' index scans are ANDed and stop at the first that finds nothing: the absent word goes first.

    ``123`` is in one instance in twenty here (half a percent at ten million runs, where its scan read
    21 000 pages); with statistics of 100 entries the plan could not tell it from a word no run holds.
    """
    suppliers(20_000)
    queries = captured(lambda: admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), {"q": term}))
    # The page's rows, read first: when they are fewer than a page, they are its count too.
    search = next(q for q in queries if "LIKE UPPER(" in q)
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")  # a small table: the plan a big one gets
    plan = analysed(search)
    read = blocks(plan)
    digits = index_pages("jobruns_search_instance_sig")
    assert read <= 20, f"{term!r}: read {read} pages (the instance index has {digits}) to find no run matches"


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="dead rows leading the table are PostgreSQL's")
def test_a_searchs_bounded_count_reads_the_newest_runs_first(admin_client, monkeypatch):
    """A prune deletes the oldest runs; until a vacuum their dead rows lead the table.

    Counted in no order, a word many runs hold was counted by a scan through them first: 1.5 s on
    the first view after a prune at ten million runs. Newest first, along the primary key, it reads
    the runs the prune left.
    """
    from django_jobruns.admin.pages import EstimatedCountPaginator

    monkeypatch.setattr(EstimatedCountPaginator, "COUNT_SEARCH_UP_TO", 20)
    suppliers(400)
    queries = captured(lambda: admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"), {"q": "reset"}))
    (count,) = [q for q in queries if "LIKE UPPER(" in q and q.startswith("SELECT COUNT(*)")]
    # (At a million runs the plan reads the primary key backwards; a small table is sorted instead.)
    assert count.endswith('ORDER BY "django_jobruns_jobrun"."id" DESC LIMIT 21) subquery'), count


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="trigram indexes are PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_migration_0021_builds_the_wide_signature_index_and_its_statistics_and_back():
    from django.core.management import call_command

    suppliers(200)

    def state() -> tuple[dict[str, str], dict[str, int]]:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'django_jobruns_jobrun' "
                "AND indexname LIKE 'jobruns_search_%%'"
            )
            indexes = dict(cur.fetchall())
            cur.execute(
                "SELECT c.relname, a.attstattarget FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                "WHERE c.relname IN ('jobruns_search_instance_sig', 'jobruns_search_error') AND a.attnum = 1"
            )
            targets = {name: int(target) for name, target in cur.fetchall()}
        return indexes, targets

    try:
        call_command("migrate", "django_jobruns", "0020", verbosity=0)
        indexes, targets = state()
        assert set(indexes) == {"jobruns_search_instance_gist", "jobruns_search_error"}, indexes
        assert "siglen" not in indexes["jobruns_search_instance_gist"]
        assert targets["jobruns_search_error"] in (-1, 0), targets  # the default (its spelling varies by version)
        with connection.cursor() as cur:  # analysed once the narrow index was back
            cur.execute("SELECT COUNT(*) FROM pg_stats WHERE tablename = 'jobruns_search_instance_gist'")
            assert cur.fetchone()[0] == 1
    finally:
        call_command("migrate", "django_jobruns", verbosity=0)
    indexes, targets = state()
    assert set(indexes) == {"jobruns_search_instance_sig", "jobruns_search_error"}, indexes
    assert "siglen='256'" in indexes["jobruns_search_instance_sig"], indexes
    assert targets == {"jobruns_search_instance_sig": 1000, "jobruns_search_error": 1000}, targets
    with connection.cursor() as cur:  # the new index's expression has statistics: the table was analysed
        cur.execute("SELECT COUNT(*) FROM pg_stats WHERE tablename = 'jobruns_search_instance_sig'")
        assert cur.fetchone()[0] == 1
