"""The admin: changelist, change view, restart and resume (A1-A3, O1)."""

from __future__ import annotations

import importlib
import re
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobruns import start_job_run
from django_jobruns.models import JobRun, JobStep, Status
from django_jobruns.store import estimates
from tests.support.factories import finished_runs

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_jobruns_jobrun_changelist"


def change_url(run):
    return reverse("admin:django_jobruns_jobrun_change", args=[run.pk])


def restart_url(run):
    return reverse("admin:django_jobruns_jobrun_restart", args=[run.pk])


def make_run(instance, *, status=Status.RUNNING, job="walk", **fields):
    run, _ = start_job_run(f"tests.{job}", instance=instance, payload={"supplier": instance})
    if status != Status.RUNNING:
        fields.update(status=status, live=None, ended_at=timezone.now())
    if fields:
        JobRun.objects.filter(pk=run.pk).update(**fields)
        run.refresh_from_db()
    return run


def failed_run(instance="f", **fields):
    fields.setdefault("cursor", '{"after": 7500}')
    fields.setdefault("counters", '{"imported": 7500, "total": 10000}')
    fields.setdefault("last_error", "step 'fetch:7500' failed: provider down")
    return make_run(instance, status=Status.FAILED, **fields)


def user_with(*codenames, username="operator"):
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def changelist_queries(client, **params):
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(reverse(CHANGELIST), params)
    assert response.status_code == 200
    return len(ctx.captured_queries), response


def test_a1_changelist_query_count_does_not_grow_with_rows(admin_client):
    for i in range(10):
        failed_run(f"a{i}")
    small, _ = changelist_queries(admin_client)
    finished_runs(190, "b", counters='{"n": 1}')
    large, response = changelist_queries(admin_client)
    assert small == large, f"{small} queries at 10 runs, {large} at 200"
    print(f"changelist queries: {small} at 10 runs, {large} at 200 runs")


def test_a1_changelist_shows_progress_status_and_key(admin_client):
    failed_run("sup-7")
    make_run("plain", counters='{"pages": 3, "skipped": 1}')
    _, response = changelist_queries(admin_client)
    html = response.content.decode().replace("<wbr>", "")  # the break opportunities in long keys
    assert '<progress class="jobruns-progress" value="7500" max="10000"' in html and "75%" in html
    assert "pages=3, skipped=1" in html
    assert "tests.walk [sup-7]" in html
    assert "jobruns-status-failed" in html


def test_a1_filters_and_search(admin_client):
    f = failed_run("alpha", last_error="ConnectionError: supplier gateway timeout")
    r = make_run("beta", job="scripted")
    _, response = changelist_queries(admin_client, status="failed")
    assert f.pk in response.content.decode() and r.pk not in response.content.decode()
    _, response = changelist_queries(admin_client, job="tests.scripted")
    assert r.pk in response.content.decode() and f.pk not in response.content.decode()
    _, response = changelist_queries(admin_client, q="gateway timeout")
    assert f.pk in response.content.decode() and r.pk not in response.content.decode()
    _, response = changelist_queries(admin_client, q=r.pk)
    assert r.pk in response.content.decode() and f.pk not in response.content.decode()
    _, response = changelist_queries(admin_client, q="beta")
    assert r.pk in response.content.decode()
    today = timezone.now().date().isoformat()
    _, response = changelist_queries(admin_client, started_at__range__gte=today, started_at__range__lte=today)
    assert f.pk in response.content.decode()
    _, response = changelist_queries(admin_client, ended_at__range__gte="2000-01-01", ended_at__range__lte="2000-01-02")
    assert f.pk not in response.content.decode()


def test_a_search_that_fits_one_page_reads_the_runs_once(admin_client):
    # A rare term costs a scan of the table or its index: done once, not once
    # for the count and again for the page.
    wanted = [failed_run(f"rare-{i}", last_error="UpstreamUnavailable") for i in range(3)]
    for i in range(60):
        make_run(f"common-{i}")

    def run_reads(ctx):
        return [
            q["sql"]
            for q in ctx.captured_queries
            if "FROM" in q["sql"]
            and "django_jobruns_jobrun" in q["sql"].split("FROM", 1)[1][:40]
            # not the job filter's list of jobs found unregistered (a read of the marked runs in flight)
            and not q["sql"].startswith("SELECT DISTINCT")
        ]

    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"q": "rare-"})
    page = response.content.decode()
    assert all(run.pk in page for run in wanted) and "3 job runs" in page
    assert len(run_reads(ctx)) == 1, run_reads(ctx)
    # A term matching more than a page is counted exactly and paged as before.
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"q": "common-"})
    assert "60 job runs" in response.content.decode() and len(response.context["cl"].result_list) == 50
    response = admin_client.get(reverse(CHANGELIST), {"q": "common-", "p": "2"})
    assert len(response.context["cl"].result_list) == 10


def test_a2_change_view_pretty_prints_and_escapes(admin_client):
    run = failed_run("esc", cursor='{"after": "<script>alert(1)</script>"}')
    JobStep.objects.create(
        run=run, step="fetch:<b>7500</b>", result='{"items": [1, 2]}', attempts=1, recorded_at=timezone.now()
    )
    JobStep.objects.create(
        run=run, step="save", result=None, attempts=2, last_error="<i>boom</i>", recorded_at=timezone.now()
    )
    html = admin_client.get(change_url(run)).content.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&quot;after&quot;: &quot;&lt;script&gt;" in html  # indented JSON, escaped
    assert "fetch:&lt;b&gt;7500&lt;/b&gt;" in html and "<b>7500</b>" not in html
    assert "&lt;i&gt;boom&lt;/i&gt;" in html and "(not completed)" in html
    assert re.search(r'"items": \[\s+1,\s+2\s+\]', html.replace("&quot;", '"'))
    assert 'name="_save"' not in html, "nothing is editable by hand"


def test_o1_a2_malformed_row_renders_with_the_decode_error_beside_the_raw_text(admin_client):
    run = make_run("broken", payload="{oops", cursor="[1,", counters="7 apples")
    response = admin_client.get(change_url(run))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("Cannot decode") == 3
    assert "{oops" in html and "7 apples" in html
    _, listing = changelist_queries(admin_client)
    assert "unreadable counters" in listing.content.decode()


def test_a2_lineage_links_both_ways(admin_client):
    old = failed_run("lin")
    new = make_run("lin", restarted_from=old)
    assert f'href="{change_url(old)}"' in admin_client.get(change_url(new)).content.decode()
    assert f'href="{change_url(new)}"' in admin_client.get(change_url(old)).content.decode()


def test_a2_runs_cannot_be_changed_added_or_deleted(admin_client):
    run = failed_run("ro")
    assert admin_client.post(change_url(run), {"status": "running"}).status_code == 403
    assert admin_client.get(reverse("admin:django_jobruns_jobrun_add")).status_code == 403
    delete = reverse("admin:django_jobruns_jobrun_delete", args=[run.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    run.refresh_from_db()
    assert run.status == Status.FAILED


def test_a3_buttons_only_on_failed_runs(admin_client):
    assert 'id="jobruns-restart"' in admin_client.get(change_url(failed_run("btn"))).content.decode()
    assert 'id="jobruns-restart"' not in admin_client.get(change_url(make_run("live"))).content.decode()
    done = make_run("ok", status=Status.DONE)
    assert 'id="jobruns-resume"' not in admin_client.get(change_url(done)).content.decode()


def test_a3_restart_creates_a_new_run_logs_it_and_lands_on_it(admin_client):
    old = failed_run("r")
    response = admin_client.post(restart_url(old), {"resume": "0"}, follow=True)
    new = JobRun.objects.exclude(pk=old.pk).get(instance="r")
    assert response.redirect_chain[-1][0] == change_url(new)
    assert new.restarted_from_id == old.pk and new.cursor is None and new.counters == "{}"
    assert new.payload == old.payload
    messages = [str(m) for m in response.context["messages"]]
    assert any(f"Restarted failed run {old.pk} as new run" in m for m in messages)
    entry = LogEntry.objects.get(object_id=new.pk)
    assert entry.action_flag == ADDITION and old.pk in entry.get_change_message()


def test_a3_resume_carries_the_cursor_and_counters(admin_client):
    old = failed_run("res")
    admin_client.post(restart_url(old), {"resume": "1"})
    new = JobRun.objects.exclude(pk=old.pk).get(instance="res")
    assert (new.cursor, new.counters) == (old.cursor, old.counters)


def test_a3_a_live_run_for_the_key_is_joined_and_the_message_says_so(admin_client):
    old = failed_run("join")
    live = make_run("join")
    response = admin_client.post(restart_url(old), {"resume": "0"}, follow=True)
    assert response.redirect_chain[-1][0] == change_url(live)
    assert JobRun.objects.filter(instance="join").count() == 2
    assert any("already running: joined run" in str(m) for m in response.context["messages"])


def test_a3_restart_of_a_run_that_is_not_failed_is_refused(admin_client):
    run = make_run("running")
    response = admin_client.post(restart_url(run), {"resume": "0"}, follow=True)
    assert response.redirect_chain[-1][0] == change_url(run)
    assert any("only a failed run can be restarted" in str(m) for m in response.context["messages"])
    assert JobRun.objects.count() == 1


def test_a3_get_on_the_restart_url_changes_nothing(admin_client):
    run = failed_run("get")
    assert admin_client.get(restart_url(run)).status_code == 405
    assert JobRun.objects.count() == 1


def test_a3_restart_needs_the_permission(client):
    run = failed_run("perm")
    viewer = user_with("view_jobrun")
    assert viewer.get(change_url(run)).status_code == 200
    assert 'id="jobruns-restart"' not in viewer.get(change_url(run)).content.decode()
    assert viewer.post(restart_url(run), {"resume": "0"}).status_code == 403
    assert JobRun.objects.count() == 1
    operator = user_with("view_jobrun", "restart_jobrun", username="oncall")
    assert operator.post(restart_url(run), {"resume": "1"}).status_code == 302
    assert JobRun.objects.count() == 2


def test_a3_restart_is_csrf_protected(admin_user):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    run = failed_run("csrf")
    assert strict.post(restart_url(run), {"resume": "0"}).status_code == 403
    assert JobRun.objects.count() == 1


def test_a3_bulk_actions_restart_failed_runs_and_skip_the_others(admin_client):
    failed = [failed_run(f"bulk{i}") for i in range(3)]
    running = make_run("bulk-live")
    response = admin_client.post(
        reverse(CHANGELIST),
        {
            "action": "resume_selected",
            "_selected_action": [r.pk for r in failed] + [running.pk],
        },
        follow=True,
    )
    assert response.status_code == 200
    new = JobRun.objects.filter(restarted_from__in=failed)
    assert new.count() == 3 and all(n.cursor == '{"after": 7500}' for n in new)
    messages = " ".join(str(m) for m in response.context["messages"])
    assert "Skipped 1 run(s) that are not failed" in messages and messages.count("Resumed failed run") == 3


def test_a3_bulk_actions_need_the_permission():
    failed = failed_run("bulk-perm")
    viewer = user_with("view_jobrun")
    listing = viewer.get(reverse(CHANGELIST)).content.decode()
    assert "resume_selected" not in listing
    response = viewer.post(reverse(CHANGELIST), {"action": "resume_selected", "_selected_action": [failed.pk]})
    assert response.status_code in (200, 302, 403)
    assert JobRun.objects.count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the estimate is PostgreSQL's")
def test_a1_large_unfiltered_changelist_pages_by_estimate_not_count(admin_client, monkeypatch):
    from django_jobruns.admin import EstimatedCountPaginator

    monkeypatch.setattr(EstimatedCountPaginator, "ESTIMATE_ABOVE", 20)
    finished_runs(120, "e")
    with connection.cursor() as cur:
        cur.execute("ANALYZE django_jobruns_jobrun")
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200 and "120 job runs" in response.content.decode()
    assert "jobruns-estimated" in response.content.decode(), "the page says the count is an estimate"
    assert not any(q["sql"].upper().startswith("SELECT COUNT(") for q in ctx.captured_queries)
    with connection.cursor() as cur:  # the estimate query counts nothing past the threshold
        cur.execute("EXPLAIN ANALYZE " + next(q["sql"] for q in ctx.captured_queries if "reltuples" in q["sql"]))
        assert "never executed" in "\n".join(row[0] for row in cur.fetchall())
    # Searched: counted exactly (here by the page's own read: 31 runs fit one page), never estimated.
    response = admin_client.get(reverse(CHANGELIST), {"q": "e1"})
    assert "jobruns-estimated" not in response.content.decode() and "31 job runs" in response.content.decode()
    # A filter the planner expects to match many runs is numbered by its plan's estimate, and says so.
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"status__exact": "done"})
    assert "jobruns-estimated" in response.content.decode()
    assert not any(q["sql"].upper().startswith("SELECT COUNT(") for q in ctx.captured_queries)
    assert "120 job runs" in response.content.decode() or "120 results" in response.content.decode()
    # A filter it expects to match few is counted exactly.
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"status__exact": "failed"})
    assert "jobruns-estimated" not in response.content.decode()
    assert any(q["sql"].upper().startswith("SELECT COUNT(") for q in ctx.captured_queries)


def test_a_search_that_matches_more_runs_than_are_counted_says_more_than_and_reads_no_further(
    admin_client, monkeypatch
):
    # At ten million runs, a word every failed run holds ("reset") was counted exactly:
    # a scan of the whole table, 1.8 s, on each view. A search is counted up to
    # COUNT_SEARCH_UP_TO runs; past it the page says "more than" and its pages stop there.
    from django_jobruns.admin import EstimatedCountPaginator, JobRunAdmin

    monkeypatch.setattr(EstimatedCountPaginator, "COUNT_SEARCH_UP_TO", 5)
    monkeypatch.setattr(JobRunAdmin, "list_per_page", 2)
    finished_runs(8, "common")
    finished_runs(4, "rarer")
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"q": "common"})
    page = response.content.decode()
    assert response.context["cl"].result_count == 5 and response.context["count_capped"] == 5
    assert "More than 5 runs match this search" in page
    (count,) = [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].upper().startswith("SELECT COUNT(") and not q["sql"].endswith(") candidates")
    ]  # (MariaDB's search first asks whether its words are common: a count of its own)
    assert "LIMIT 6" in count, count
    response = admin_client.get(reverse(CHANGELIST), {"q": "rarer"})
    assert response.context["cl"].result_count == 4 and not response.context["count_capped"]
    assert "More than" not in response.content.decode()
    # Its last page is there; the runs past the bound are reached by narrowing the search.
    assert admin_client.get(reverse(CHANGELIST), {"q": "common", "p": "3"}).status_code == 200


@pytest.mark.skipif(connection.vendor != "mysql", reason="InnoDB's estimate is MariaDB's and MySQL's")
@pytest.mark.django_db(transaction=True)  # ANALYZE TABLE commits
def test_a1_large_lists_on_mariadb_page_by_innodbs_estimate_not_count(admin_client, monkeypatch):
    from django_jobruns.admin import EstimatedCountPaginator

    monkeypatch.setattr(EstimatedCountPaginator, "ESTIMATE_ABOVE", 20)
    finished_runs(120, "e")
    with connection.cursor() as cur:
        cur.execute("ANALYZE TABLE django_jobruns_jobrun")
        cur.fetchall()

    def counted(ctx):
        return any(q["sql"].upper().startswith("SELECT COUNT(") for q in ctx.captured_queries)

    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST))
    page = response.content.decode()
    assert response.status_code == 200 and "jobruns-estimated" in page and not counted(ctx)
    assert re.search(r"\b1\d\d job runs", page), "InnoDB's estimate of 120 rows, near enough to number pages"
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"status__exact": "done"})
    assert "jobruns-estimated" in response.content.decode() and not counted(ctx)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST), {"status__exact": "failed"})
    assert "jobruns-estimated" not in response.content.decode() and counted(ctx), "expected few: counted"
    # Searched: counted exactly (here by the page's own read: 31 runs fit one page), never estimated.
    response = admin_client.get(reverse(CHANGELIST), {"q": "e1"})
    assert "jobruns-estimated" not in response.content.decode() and "31 job runs" in response.content.decode()


def steer_url(run):
    return reverse("admin:django_jobruns_jobrun_steer", args=[run.pk])


def test_steering_buttons_appear_where_they_apply(admin_client):
    live = make_run("live-btn")
    page = admin_client.get(change_url(live)).content.decode()
    assert 'id="jobruns-pause"' in page and 'id="jobruns-cancel"' in page
    assert 'id="jobruns-unpause"' not in page and 'id="jobruns-retry_now"' not in page
    waiting = make_run("waiting-btn", next_attempt_at=timezone.now() + timedelta(minutes=5))
    assert 'id="jobruns-retry_now"' in admin_client.get(change_url(waiting)).content.decode()
    paused = make_run("paused-btn", paused_at=timezone.now())
    page = admin_client.get(change_url(paused)).content.decode()
    assert 'id="jobruns-unpause"' in page and 'id="jobruns-pause"' not in page and "running (paused)" in page
    page = admin_client.get(change_url(failed_run("failed-btn"))).content.decode()
    assert 'id="jobruns-cancel"' not in page and 'id="jobruns-pause"' not in page


@pytest.mark.parametrize(
    "verb, check",
    [
        (
            "cancel",
            lambda run: run.status == Status.CANCELLED and run.live is None and "in the admin" in run.last_error,
        ),
        ("pause", lambda run: run.paused_at is not None),
        ("retry_now", lambda run: run.next_attempt_at is None),
    ],
)
def test_a_steering_button_acts_logs_and_says_so(admin_client, verb, check):
    run = make_run(f"steer-{verb}", next_attempt_at=timezone.now() + timedelta(minutes=5))
    response = admin_client.post(steer_url(run), {"verb": verb}, follow=True)
    run.refresh_from_db()
    assert check(run)
    assert any(f"run {run.pk}" in str(m) for m in response.context["messages"])
    assert LogEntry.objects.filter(object_id=run.pk).exists()


def test_steering_is_post_only_permission_checked_and_refuses_finished_runs(client, admin_client):
    run = make_run("perm")
    assert admin_client.get(steer_url(run)).status_code == 405
    viewer = user_with("view_jobrun", username="viewer")
    assert 'id="jobruns-cancel"' not in viewer.get(change_url(run)).content.decode()
    assert viewer.post(steer_url(run), {"verb": "cancel"}).status_code == 403
    run.refresh_from_db()
    assert run.status == Status.RUNNING
    operator = user_with("view_jobrun", "steer_jobrun", username="oncall")
    assert operator.post(steer_url(run), {"verb": "pause"}).status_code == 302
    done = make_run("finished", status=Status.DONE)
    response = admin_client.post(steer_url(done), {"verb": "cancel"}, follow=True)
    assert any("only a live run can be cancelled" in str(m) for m in response.context["messages"])


def test_bulk_steering_acts_on_the_runs_it_applies_to_and_skips_the_others(admin_client):
    live = [make_run(f"bulk-{n}") for n in range(2)]
    done = make_run("bulk-done", status=Status.DONE)
    response = admin_client.post(
        reverse(CHANGELIST),
        {
            "action": "pause_selected",
            "_selected_action": [r.pk for r in [*live, done]],
        },
        follow=True,
    )
    assert all(JobRun.objects.get(pk=r.pk).paused_at is not None for r in live)
    assert any("Skipped 1 run(s)" in str(m) and done.pk in str(m) for m in response.context["messages"])
    admin_client.post(reverse(CHANGELIST), {"action": "cancel_selected", "_selected_action": [r.pk for r in live]})
    assert all(JobRun.objects.get(pk=r.pk).status == Status.CANCELLED for r in live)


def test_a_lapsed_lease_is_shown_as_such(admin_client):
    run = make_run("lapsed", lease_holder="dead-host:1:ab", lease_expires_at=timezone.now() - timedelta(1))
    held = make_run("held", lease_holder="live-host:2:cd", lease_expires_at=timezone.now() + timedelta(1))
    listing = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert listing.count('class="jobruns-lease-lapsed"') == 1 and listing.count('class="jobruns-lease-held"') == 1
    assert "ago — its holder dead-host:1:ab stopped reporting" in admin_client.get(change_url(run)).content.decode()
    assert "held by live-host:2:cd, expires in" in admin_client.get(change_url(held)).content.decode()
    lapsed_only = admin_client.get(reverse(CHANGELIST), {"state": "lapsed"}).content.decode()
    assert run.pk in lapsed_only and held.pk not in lapsed_only
    leased_only = admin_client.get(reverse(CHANGELIST), {"state": "leased"}).content.decode()
    assert held.pk in leased_only and run.pk not in leased_only


@pytest.mark.parametrize(
    "state, matches",
    [
        ("backoff", "backoff"),
        ("paused", "paused"),
        ("unregistered", "orphan"),
    ],
)
def test_the_state_filter_finds_what_an_operator_looks_for(admin_client, state, matches):
    now = timezone.now()
    runs = {
        "backoff": make_run("backoff", next_attempt_at=now + timedelta(minutes=5)),
        "paused": make_run("paused", paused_at=now),
        "orphan": make_run("orphan", module="gone"),
        "plain": make_run("plain"),
    }
    page = admin_client.get(reverse(CHANGELIST), {"state": state}).content.decode()
    assert [name for name, run in runs.items() if run.pk in page] == [matches]


def test_the_changelist_shows_the_error_and_a_done_runs_cursor_is_not_called_uncommitted(admin_client):
    failed = failed_run("err", last_error="UpstreamUnavailable: supplier 4 reset\n\nTraceback ...")
    listing = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "UpstreamUnavailable: supplier 4 reset" in listing and "Traceback" not in listing
    done = make_run("finished-no-cursor", status=Status.DONE)
    assert "no pass committed yet" not in admin_client.get(change_url(done)).content.decode()
    assert failed.pk in listing


def test_a_restarted_run_offers_no_second_restart(admin_client):
    old = failed_run("once")
    admin_client.post(restart_url(old), {"resume": "1"})
    assert 'id="jobruns-restart"' not in admin_client.get(change_url(old)).content.decode()
    response = admin_client.post(restart_url(old), {"resume": "0"}, follow=True)
    (successor,) = JobRun.objects.filter(restarted_from=old)
    message = f"was already restarted as run {successor.pk}"
    joined = [str(m) for m in response.context["messages"] if "still running: joined it" in str(m)]
    assert joined and successor.pk in joined[0] and "was already restarted as run" in joined[0]
    JobRun.objects.filter(pk=successor.pk).update(status=Status.DONE, live=None)
    response = admin_client.post(restart_url(old), {"resume": "0"}, follow=True)
    assert any(f"{message}; restart that one if it failed" in str(m) for m in response.context["messages"])
    assert JobRun.objects.filter(restarted_from=old).count() == 1


def test_search_finds_a_run_by_its_exact_id_instance_or_error(admin_client):
    wanted = failed_run("supplier-42", last_error="UpstreamUnavailable: supplier 42 reset")
    other = make_run("supplier-7")
    for term in (wanted.pk, wanted.pk.lower(), "lier-42", "upstreamunavailable"):
        page = admin_client.get(reverse(CHANGELIST), {"q": term}).content.decode()
        assert wanted.pk in page and other.pk not in page, term


def test_steering_and_restarting_need_the_view_permission_too():
    run = make_run("blind")
    blind = user_with("steer_jobrun", "restart_jobrun", username="blind")
    assert blind.post(steer_url(run), {"verb": "cancel"}).status_code == 403
    failed = failed_run("blind-failed")
    assert blind.post(restart_url(failed), {"resume": "0"}).status_code == 403
    run.refresh_from_db()
    assert run.status == Status.RUNNING and not JobRun.objects.filter(restarted_from=failed).exists()


def test_a_run_whose_job_is_not_registered_is_marked_in_the_list_and_its_job_can_be_filtered(admin_client):
    from django_jobruns import run_due_jobs

    now = timezone.now()
    stray = JobRun.objects.create(module="catalog", job="import_feed", instance="x", started_at=now, updated_at=now)
    run_due_jobs()
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "running (job not registered)" in page
    assert "catalog.import_feed (not registered)" in page, "listed in the job filter"
    filtered = admin_client.get(reverse(CHANGELIST), {"job": "catalog.import_feed"}).content.decode()
    assert stray.id in filtered


def test_cancel_asks_on_a_page_of_its_own_set_apart_from_pause(client, admin_client):
    run = make_run("to-cancel")
    page = admin_client.get(change_url(run)).content.decode()
    assert 'class="jobruns-apart"' in page and 'id="jobruns-cancel"' in page
    confirm = reverse("admin:django_jobruns_jobrun_cancel", args=[run.pk])
    asked = admin_client.get(confirm).content.decode()
    assert f"Cancel run {run.pk}?" in asked and 'id="jobruns-confirm-cancel"' in asked
    run.refresh_from_db()
    assert run.status == Status.RUNNING, "asking changes nothing"
    response = admin_client.post(confirm, {"reason": "duplicate import"}, follow=True)
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and "duplicate import" in run.last_error
    assert any(f"Cancelled run {run.pk}" in str(m) for m in response.context["messages"])
    again = admin_client.get(confirm, follow=True)
    assert any("only a live run can be cancelled" in str(m) for m in again.context["messages"])
    viewer = user_with("view_jobrun", username="looker")
    other = make_run("not-yours-to-cancel")
    assert viewer.get(reverse("admin:django_jobruns_jobrun_cancel", args=[other.pk])).status_code == 403


def test_the_admins_small_things_an_operator_reads(admin_client):
    from django_jobruns.admin.display import without_carets

    run = make_run("supplier-7")
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "tests.<wbr>walk [supplier-<wbr>7]" in page, "job names wrap between their words"
    lapsed = make_run(
        "lapsed-now", lease_holder="w:1:x", lease_fence=1, lease_expires_at=timezone.now() - timedelta(seconds=5)
    )
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "lapsed just now" in page and "0 minutes" not in page
    detail = admin_client.get(change_url(run)).content.decode()
    assert '<div class="readonly">-</div>' not in detail and "—" in detail, "one dash for every empty value"
    JobRun.objects.filter(pk=run.pk).update(paused_at=timezone.now())
    detail = admin_client.get(change_url(run)).content.decode()
    assert f"{run.pk} (paused)" in detail and "Paused at" in detail
    assert ".inline-group .tabular td.original p { display: none; }" in detail
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1\n    f(a)\n    ^^^^\n        ~~~^^^\nValueError: x'
    )
    assert (
        without_carets(traceback)
        == 'Traceback (most recent call last):\n  File "x.py", line 1\n    f(a)\nValueError: x'
    )
    assert lapsed.pk in page


def test_the_overview_counts_each_state_and_charts_the_last_days_finished_runs(admin_client):
    now = timezone.now()
    make_run("plain")
    make_run("leased", lease_holder="host:1:a", lease_expires_at=now + timedelta(minutes=5))
    make_run("lapsed", lease_holder="host:2:b", lease_expires_at=now - timedelta(minutes=5))
    make_run("backoff", next_attempt_at=now + timedelta(minutes=10))
    make_run("paused", paused_at=now)
    make_run("done-now", status=Status.DONE)
    make_run("failed-now", status=Status.FAILED, last_error="boom")
    make_run("failed-2h", status=Status.FAILED, last_error="boom")
    JobRun.objects.filter(instance="failed-2h").update(ended_at=now - timedelta(hours=2))
    make_run("failed-long-ago", status=Status.FAILED, last_error="boom")
    JobRun.objects.filter(instance="failed-long-ago").update(ended_at=now - timedelta(days=3))

    response = admin_client.get(reverse(CHANGELIST))
    overview = response.context["overview"]
    counts = {tile.label: tile.count for tile in overview.tiles}
    assert counts == {
        "running": 5,
        "leased": 1,
        "in backoff": 1,
        "lease lapsed": 1,
        "paused": 1,
        "failed in 24 h": 2,
    }
    assert len(overview.hours) == 24
    assert (overview.hours[-1].done, overview.hours[-1].failed) == (1, 1)
    assert overview.hours[-3].failed == 1 and sum(h.failed for h in overview.hours) == 2
    html = response.content.decode()
    assert "<svg" in html and "2 done" not in html and "1 done, 2 failed" in html
    assert html.count('class="jobruns-bar-done"') == 24
    # Each tile lists its runs.
    lapsed = admin_client.get(reverse(CHANGELIST) + "?state=lapsed").content.decode()
    assert (
        "lapsed" in lapsed
        and reverse("admin:django_jobruns_jobrun_change", args=[JobRun.objects.get(instance="lapsed").pk]) in lapsed
    )
    assert overview.next_due_wait is not None and overview.next_due_wait >= 0
    # A filtered or searched list is about its rows: no overview, none of its reads.
    filtered = admin_client.get(reverse(CHANGELIST), {"status__exact": "done"})
    assert filtered.context.get("overview") is None and 'class="jobruns-tiles"' not in filtered.content.decode()
    with CaptureQueriesContext(connection) as plain:
        admin_client.get(reverse(CHANGELIST), {"q": "plain"})
    with CaptureQueriesContext(connection) as landing:
        admin_client.get(reverse(CHANGELIST))
    overview_reads = [q["sql"] for q in landing.captured_queries if "COUNT(*) FROM (SELECT" in q["sql"]]
    # (SQLite's and MariaDB's searches first ask of their index whether the words are common.)
    searched = [q["sql"] for q in plain.captured_queries if "jobruns_search" not in q["sql"]]
    assert len(overview_reads) == 1 and not any("COUNT(*) FROM (SELECT" in sql for sql in searched)


def test_the_overviews_large_counts_are_the_databases_estimate_and_its_reads_are_bounded(admin_client, monkeypatch):
    # At a million runs, counting the runs in flight exactly read a quarter of a
    # million index entries on every view. Each count reads at most EXACT_UP_TO + 1
    # entries; one that reaches it is the planner's estimate, as the list's total is.
    overview_module = importlib.import_module("django_jobruns.admin.overview")

    monkeypatch.setattr(overview_module, "EXACT_UP_TO", 3)
    now = timezone.now()
    for i in range(6):
        make_run(f"r{i}", next_attempt_at=now + timedelta(minutes=10) if i < 2 else None)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST))
    tiles = {tile.label: tile for tile in response.context["overview"].tiles}
    (counts,) = [q["sql"] for q in ctx.captured_queries if "COUNT(*) FROM (SELECT" in q["sql"]]
    if connection.vendor == "sqlite":  # no estimates: counted exactly, as the list's total is
        assert tiles["running"].count == 6 and not tiles["running"].estimated
        assert "LIMIT 4" not in counts, counts
    else:
        assert counts.count("LIMIT 4") == 7, counts  # six tiles, and whether the chart's day is counted
        assert tiles["running"].estimated and tiles["running"].count >= 4, tiles["running"]
        assert "≈" in response.content.decode()
    assert (tiles["in backoff"].count, tiles["in backoff"].estimated) == (2, False)
    assert (tiles["paused"].count, tiles["paused"].estimated) == (0, False)
    # Four runs are due: the head of the queue is read along the due order's index on every database.
    assert "due runs started first" not in response.content.decode()
    assert response.context["overview"].next_due_wait is not None


def test_the_overviews_chart_is_estimated_when_its_day_ended_more_runs_than_are_counted(admin_client, monkeypatch):
    # At ten million retained runs a day ends a third of a million: counting them for the
    # chart read every one on each view of the page. Past EXACT_UP_TO they are the planner's
    # estimates, one EXPLAIN per hour and status; no statement reads the day's runs.
    overview_module = importlib.import_module("django_jobruns.admin.overview")

    monkeypatch.setattr(overview_module, "EXACT_UP_TO", 3)
    for i in range(6):
        make_run(f"d{i}", status=Status.DONE if i % 2 else Status.FAILED, last_error="x")
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(CHANGELIST))
    hours = response.context["overview"].hours
    page = response.content.decode()
    grouped = [q["sql"] for q in ctx.captured_queries if "GROUP BY" in q["sql"] and "ended_at" in q["sql"]]
    if connection.vendor == "sqlite":  # no estimates: counted exactly
        assert not any(h.estimated for h in hours) and sum(h.done + h.failed for h in hours) == 6
        assert len(grouped) == 1 and "as the database estimates them" not in page
    else:
        assert all(h.estimated for h in hours) and not grouped, grouped
        explains = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("EXPLAIN") and "ended_at" in q["sql"]]
        if connection.vendor == "postgresql":  # in one round trip: 48 of them cost 40 ms on each view at 10 M runs
            assert len(explains) == 1 and explains[0].count("EXPLAIN") == 48, explains
        else:
            assert len(explains) == 48, len(explains)
        assert "as the database estimates them" in page and "about " in page
        # Each bar is what the planner says of its own hour and status, asked alone.
        rows = JobRun.objects.all()
        for hour in hours:
            within = rows.filter(ended_at__gte=hour.start, ended_at__lt=hour.start + timedelta(hours=1)).order_by()
            alone = [estimates.planned_rows(within.filter(status=s)) for s in (Status.DONE, Status.FAILED)]
            assert [hour.done, hour.failed] == alone, (hour, alone)


def test_the_overview_is_on_the_first_page_only(admin_client):
    finished_runs(120, "p")
    first = admin_client.get(reverse(CHANGELIST))
    assert first.context["overview"] is not None
    with CaptureQueriesContext(connection) as ctx:
        second = admin_client.get(reverse(CHANGELIST), {"p": "2"})
    assert second.status_code == 200 and second.context.get("overview") is None
    assert not any("COUNT(*) FROM (SELECT" in q["sql"] for q in ctx.captured_queries)


def _summary(admin_client, run):
    page = admin_client.get(change_url(run)).content.decode()
    found = re.search(r'<ul class="jobruns-summary" id="jobruns-summary">(.*?)</ul>', page, re.S)
    assert found, "the change view says the run's state at its top"
    assert page.index("jobruns-summary") < page.index("field-id"), "above the fields"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", found.group(1))).strip(), page


def test_the_change_view_says_first_that_a_lease_lapsed_and_whose_it_was(admin_client):
    expired = timezone.now() - timedelta(minutes=3)
    run = make_run("killed", lease_holder="web-3:4242:ab", lease_expires_at=expired, attempts=1)
    said, page = _summary(admin_client, run)
    assert said.startswith("Lapsed lease: its holder web-3:4242:ab stopped reporting"), said
    assert timezone.localtime(expired).isoformat(sep=" ", timespec="seconds") in said, "the exact time, to the second"


def test_the_change_view_says_first_a_pause_and_a_backoff_with_its_end(admin_client):
    until = timezone.now() + timedelta(minutes=7)
    run = make_run(
        "waiting", paused_at=timezone.now(), next_attempt_at=until, attempts=2, last_error="UpstreamDown: 503\nmore"
    )
    said, _ = _summary(admin_client, run)
    assert "Paused" in said and "no drive takes it until it is unpaused" in said, said
    exact = timezone.localtime(until).isoformat(sep=" ", timespec="seconds")
    assert f"Backing off until {exact}" in said and "after 2 failed attempt(s)" in said and "UpstreamDown: 503" in said


def test_the_change_view_says_who_cancelled_and_why(admin_client):
    run = make_run("to-cancel")
    admin_client.post(reverse("admin:django_jobruns_jobrun_cancel", args=[run.pk]), {"reason": "supplier left"})
    said, _ = _summary(admin_client, run)
    assert said.startswith("Cancelled") and "supplier left (by admin in the admin)" in said, said


def test_the_change_view_shows_times_to_the_second(admin_client):
    run = make_run("timed")
    page = admin_client.get(change_url(run)).content.decode()
    assert timezone.localtime(run.started_at).isoformat(sep=" ", timespec="seconds") in page


def test_a_failed_task_offers_restart_but_not_resume(admin_client):
    from tests.support import task_functions as t

    result = t.add.using(backend="once").enqueue(1, 2)
    JobRun.objects.filter(pk=result.id).update(status=Status.FAILED, live=None, ended_at=timezone.now())
    page = admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[result.id])).content.decode()
    assert 'id="jobruns-restart"' in page and 'id="jobruns-resume"' not in page
    job_page = admin_client.get(change_url(failed_run("job-failed"))).content.decode()
    assert 'id="jobruns-restart"' in job_page and 'id="jobruns-resume"' in job_page


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the estimates asked together are PostgreSQL's")
@pytest.mark.parametrize("together", [True, False], ids=["client-side binding", "server-side binding"])
def test_estimates_asked_together_are_each_the_estimate_asked_alone(monkeypatch, together):
    """Where the driver binds on the server (no several statements in one call) they are asked one by one."""
    finished_runs(40, "e")
    monkeypatch.setattr(estimates, "_binds_on_the_client", lambda cursor: together)
    rows, now = JobRun.objects.all(), timezone.now()
    each = [[now - timedelta(hours=h), now, s] for h in (1, 2, 30) for s in (Status.DONE, Status.FAILED)]
    query = rows.filter(ended_at__gte=each[0][0], ended_at__lt=each[0][1], status=each[0][2]).order_by().values("pk")
    with CaptureQueriesContext(connection) as ctx:
        planned = estimates.planned_rows_each(query, each)
    alone = [estimates.planned_rows(rows.filter(ended_at__gte=a, ended_at__lt=b, status=s)) for a, b, s in each]
    assert planned == alone and len(ctx.captured_queries) == (1 if together else len(each))
    # Parameters that are not the query's own, in its order: not asked (the caller asks one by one).
    assert estimates.planned_rows_each(query, [list(reversed(p)) for p in each]) is None


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the estimates asked together are PostgreSQL's")
def test_estimates_are_asked_one_by_one_where_psycopg_3_is_not_installed(monkeypatch):
    """Django also runs on psycopg2, which reads only the last of several statements sent together."""
    finished_runs(10, "e")
    monkeypatch.setitem(sys.modules, "psycopg", None)  # ``import psycopg`` fails, as without it
    rows, now = JobRun.objects.all(), timezone.now()
    each = [[now - timedelta(hours=h), now, Status.DONE] for h in (1, 30)]
    query = rows.filter(ended_at__gte=each[0][0], ended_at__lt=each[0][1], status=each[0][2]).order_by().values("pk")
    with CaptureQueriesContext(connection) as ctx:
        planned = estimates.planned_rows_each(query, each)
    alone = [estimates.planned_rows(rows.filter(ended_at__gte=a, ended_at__lt=b, status=s)) for a, b, s in each]
    assert planned == alone and len(ctx.captured_queries) == 2


@pytest.mark.parametrize(
    "url, answer",
    [
        ("jobrun/?job=tests%00.walk", 302),
        ("jobrun/?queue=default%00", 302),
        ("jobrun/?status=running%00", 302),
        ("jobrun/?lease_holder=%00", 302),
        ("jobrun/%00/change/", 302),
        ("jobrun/%00/cancel/", 404),
        ("jobschedule/?timezone=UTC%00", 302),
        ("jobschedule/%00/change/", 302),
    ],
)
def test_a_nul_in_a_filter_or_an_id_is_an_unknown_lookup_or_object_not_a_server_error(admin_client, url, answer):
    """PostgreSQL refuses a NUL in any text: the lookup raised its DataError, a 500, on that database alone."""
    start_job_run("tests.walk", payload={"log": "/dev/null"})
    response = admin_client.get(f"/admin/django_jobruns/{url}")
    assert response.status_code == answer
    if answer == 302:
        assert response["Location"].endswith("?e=1") or response["Location"] == "/admin/", response["Location"]


def test_a_bulk_action_on_thousands_acts_on_a_bounded_batch_and_says_so_in_a_few_lines(admin_client, monkeypatch):
    """After an outage an operator selects every failed run and restarts them: one request stays short
    (a proxy's timeout) and its page small, and clicking again goes on where the last click stopped."""
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    from django_jobruns.admin import actions

    monkeypatch.setattr(actions, "BULK_MAX", 30)
    finished_runs(45, "outage", status=Status.FAILED, payload='{"log": "/dev/null"}', last_error="provider down")
    finished_runs(5, "fine", status=Status.DONE)
    every = {"action": "restart_selected", "select_across": "1", "index": "0", ACTION_CHECKBOX_NAME: ["x"]}

    def click(form: dict[str, Any]) -> list[str]:
        response = admin_client.post(reverse(CHANGELIST), form, follow=True)
        assert response.status_code == 200
        return [str(m) for m in response.context["messages"]]

    said = click(every)
    assert JobRun.objects.filter(status=Status.RUNNING).count() == 30
    assert len(said) <= 4, said
    assert any("Restarted 30 failed runs as new runs" in m for m in said), said
    assert any("15 more" in m and "again" in m for m in said), said
    assert any("Skipped 5 run(s)" in m for m in said), said
    said = click(every)
    assert JobRun.objects.filter(status=Status.RUNNING).count() == 45
    # Skipped: the 30 restarted by the first click, their 30 new runs, the 5 done.
    assert any("Restarted 15 failed runs" in m for m in said) and any("Skipped 65 run(s)" in m for m in said), said
    said = click({**every, "action": "pause_selected"})
    assert JobRun.objects.filter(paused_at__isnull=False).count() == 30 and len(said) <= 4, said
    assert any("Paused 30 runs" in m for m in said) and any("More selected runs" in m for m in said), said
    click({**every, "action": "pause_selected"})
    assert JobRun.objects.filter(paused_at__isnull=False).count() == 45


def test_a_pass_of_thousands_of_steps_shows_its_last_ones_and_says_how_many_there_are(admin_client):
    """A failed pass of 20 000 steps took a minute to show whole, past a proxy's timeout; the last steps
    (where it failed) are the ones an operator reads, and the command shows them all."""
    from django_jobruns.admin import JobStepInline

    run = failed_run("many-steps")
    now = timezone.now()
    total = JobStepInline.shown_max + 50
    JobStep.objects.bulk_create(
        [
            JobStep(
                run=run,
                step=f"item:{n}",
                result=None if n == total - 1 else "1",
                recorded_at=now + timedelta(microseconds=n),
                last_error="provider down" if n == total - 1 else None,
            )
            for n in range(total)
        ]
    )
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(change_url(run)).content.decode()
    assert f"item:{total - 1}" in page and f"item:{total - JobStepInline.shown_max}" in page
    assert "item:49<" not in page and f"the last {JobStepInline.shown_max} of {total}" in page
    assert len(queries) < 40, len(queries)
