"""The operator read: job_runs() and its tolerant decoding (O1)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobruns import job_runs, start_job_run
from django_jobruns.models import JobRun, Status
from django_jobruns.records import JobRunRecord

pytestmark = pytest.mark.django_db


def test_o1_malformed_row_is_shown_with_a_decode_error_not_a_null_cursor():
    run, _ = start_job_run("tests.walk", instance="o1", payload={"a": 1})
    JobRun.objects.filter(pk=run.pk).update(cursor="{broken", counters='{"n": 1}')
    (record,) = job_runs(instance="o1")
    assert record.cursor is None and record.decode_error.startswith("cursor: ")
    assert record.payload == {"a": 1} and record.counters == {"n": 1}, "what parses is still shown"
    JobRun.objects.filter(pk=run.pk).update(payload="nope", cursor="{broken")
    (record,) = job_runs(instance="o1")
    assert record.decode_error.startswith("payload: "), "the first failure, in column order"
    JobRun.objects.filter(pk=run.pk).update(payload="1", cursor="2", counters="[3]")
    (record,) = job_runs(instance="o1")
    assert "counters: not a JSON object" in record.decode_error


def test_job_runs_decodes_every_column_and_filters():
    a, _ = start_job_run("tests.walk", instance="a", payload={"supplier": 7})
    JobRun.objects.filter(pk=a.pk).update(cursor='{"after": 10}', counters='{"imported": 10}')
    b, _ = start_job_run("tests.scripted", instance="b")
    JobRun.objects.filter(pk=b.pk).update(status=Status.FAILED, live=None, last_error="boom")
    records = job_runs()
    assert [r.id for r in records] == [b.id, a.id], "newest first"
    (ra,) = job_runs(module="tests", job="walk")
    assert (ra.payload, ra.cursor, ra.counters) == ({"supplier": 7}, {"after": 10}, {"imported": 10})
    assert ra.decode_error is None
    assert [r.id for r in job_runs(status="failed")] == [b.id]
    assert [r.id for r in job_runs(job="tests.scripted")] == [b.id]
    assert job_runs(instance="nothing") == []
    with pytest.raises(ValueError, match="status must be one of"):
        job_runs(status="stuck")
    with pytest.raises(AttributeError):
        ra.status = "done"  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(
    "limit, expected",
    [
        (None, 50),
        (-1, 1),
        (0, 1),
        (2.7, 2),
        (10**9, 500),
        (math.inf, 500),
        (-math.inf, 1),
        (math.nan, 50),
        (3, 3),
        (10**400, 500),
        (-(10**400), 1),
        (Fraction(10**400, 3), 500),
    ],
)
def test_job_runs_limit_is_clamped_before_it_reaches_sql(limit, expected):
    with CaptureQueriesContext(connection) as ctx:
        job_runs(limit=limit)
    assert f"LIMIT {expected}" in ctx.captured_queries[0]["sql"]


def test_job_runs_limit_must_be_a_number():
    with pytest.raises(TypeError, match="limit must be a number"):
        job_runs(limit="10")  # type: ignore[arg-type]


def test_a_run_decodes_itself_as_the_operator_read_does():
    run, _ = start_job_run("tests.walk", instance="self", payload={"a": [1]})
    JobRun.objects.filter(pk=run.pk).update(counters="{broken")
    run.refresh_from_db()
    record = JobRunRecord.from_row(run)
    assert record.payload == {"a": [1]} and record.counters == {} and record.decode_error.startswith("counters:")
