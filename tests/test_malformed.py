"""Malformed rows: each is a failed pass on that run or is stepped over, never an error out of the drive."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from django_jobruns import job_runs, run_due_jobs, start_job_run
from django_jobruns.models import JobRun, Status

pytestmark = pytest.mark.django_db

FAR = timezone.now() + timedelta(days=3650)

# (what is wrong, the corruption, what the drive does with it, text the run's last_error holds)
CORRUPTIONS = [
    ("payload is not JSON", {"payload": "{oops"}, "failed pass", "payload"),
    ("payload is empty text", {"payload": ""}, "failed pass", "payload"),
    ("payload has the wrong shape", {"payload": "[1, 2]"}, "failed pass", "AttributeError"),
    ("cursor is not JSON", {"cursor": "[1,"}, "failed pass", "cursor"),
    ("cursor has the wrong shape for its job", {"cursor": '"page-two"'}, "failed pass", "TypeError"),
    ("counters are not JSON", {"counters": "nope"}, "failed pass", "counters"),
    ("counters are not an object", {"counters": "[1, 2]"}, "failed pass", "not a JSON object"),
    ("a counter is not a number", {"counters": '{"steps": "three"}'}, "failed pass", "not a finite number"),
    ("a counter is NaN", {"counters": '{"steps": NaN}'}, "failed pass", "not a finite number"),
    ("status the app does not know", {"status": "archived", "live": None}, "stepped over", None),
    ("negative attempts", {"attempts": -4}, "advances", None),
    ("negative fence", {"lease_fence": -9}, "advances", None),
    ("lease held far into the future", {"lease_holder": "ghost", "lease_expires_at": FAR}, "stepped over", None),
]


@pytest.mark.parametrize("what, corruption, outcome, error", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_malformed_row_is_contained_and_still_shown(admin_client, effects, what, corruption, outcome, error):
    payload = {"log": str(effects), "passes": 3}
    before, _ = start_job_run("tests.walk", instance="before", payload=payload)
    bad, _ = start_job_run("tests.walk", instance="bad", payload=payload)
    after, _ = start_job_run("tests.walk", instance="after", payload=payload)
    JobRun.objects.filter(pk=bad.pk).update(**corruption)

    report = run_due_jobs()

    neighbours = JobRun.objects.filter(pk__in=[before.pk, after.pk])
    assert all(n.cursor == "1" for n in neighbours), "the runs beside it advanced"
    bad.refresh_from_db()
    if outcome == "failed pass":
        assert report.retrying == 1 and report.advanced == 2
        assert bad.attempts == 1 and error in bad.last_error and bad.status == Status.RUNNING
        assert bad.next_attempt_at is not None and bad.lease_holder is None
        for column, value in corruption.items():
            assert getattr(bad, column) == value, "the evidence is left as it was"
    elif outcome == "stepped over":
        assert report.attempted == 2 and bad.attempts == 0 and bad.last_error is None
    else:
        assert report.advanced == 3 and bad.cursor == "1" and bad.attempts == 0

    (record,) = job_runs(instance="bad")
    assert record.id == bad.pk
    assert admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[bad.pk])).status_code == 200
    listing = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"))
    assert listing.status_code == 200 and bad.pk in listing.content.decode()


def test_a_corrupt_row_exhausts_its_retries_and_fails_with_the_reason(clock, effects):
    bad, _ = start_job_run("tests.walk", instance="bad", payload={"log": str(effects)})
    JobRun.objects.filter(pk=bad.pk).update(counters="{broken")
    for _ in range(3):  # the walk job's policy allows three attempts
        report = run_due_jobs(now=clock)
        clock.advance(hours=2)
    bad.refresh_from_db()
    assert report.failed == 1 and bad.status == Status.FAILED and "counters" in bad.last_error
    (record,) = job_runs(instance="bad")
    assert record.decode_error.startswith("counters:") and record.counters == {}


@pytest.mark.parametrize(
    "column, text",
    [
        ("payload", "[" * 100_000 + "]" * 100_000),
        ("cursor", "[" * 900 + "]" * 900),
        ("payload", '"' + "x" * 3_000_000 + '"'),
    ],
)
def test_any_stored_row_is_shown_however_deep_or_large(admin_client, column, text):
    run, _ = start_job_run("tests.walk", instance="huge")
    JobRun.objects.filter(pk=run.pk).update(**{column: text})
    (record,) = job_runs(instance="huge")
    page = admin_client.get(reverse("admin:django_jobruns_jobrun_change", args=[run.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert len(body) < 500_000, "the rendering is bounded"
    if len(text) > 20_000:
        assert "more characters not shown" in body
    if text.startswith("[" * 1000):
        assert record.decode_error is not None and "nested too deeply" in record.decode_error
        assert "nested too deeply" in body
    listing = admin_client.get(reverse("admin:django_jobruns_jobrun_changelist"))
    assert listing.status_code == 200 and run.pk in listing.content.decode()
