"""Queue safety: Q1 (payload and cursor hold only JSON's own values) and Q2 (step results)."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections import OrderedDict
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from hypothesis import given
from hypothesis import strategies as st

from django_jobruns import run_due_jobs, start_job_run
from django_jobruns.exceptions import JobRunsError, QueueUnsafe
from django_jobruns.models import JobRun, JobStep
from django_jobruns.queue_safety import check_queue_safe, dump_queue_safe


class Thing:
    pass


class MyDict(dict):
    pass


class MyList(list):
    pass


class MyStr(str):
    pass


def _cycle_list():
    items: list = [1]
    items.append(items)
    return {"items": items}


def _cycle_dict():
    node: dict = {}
    node["self"] = node
    return node


UNSAFE = [
    ({"items": [0, 1, 2, b"raw"]}, "payload.items.3", "bytes"),
    ({"blob": bytearray(b"x")}, "payload.blob", "bytearray"),
    ({"tags": {"a", "b"}}, "payload.tags", "set"),
    ({"tags": frozenset({"a"})}, "payload.tags", "frozenset"),
    ({"pair": (1, 2)}, "payload.pair", "tuple"),
    ({"ids": {1: "one"}}, "payload.ids.1", "key of type int"),
    ({"ratio": math.nan}, "payload.ratio", "nan"),
    ({"ratio": math.inf}, "payload.ratio", "inf"),
    ({"ratio": -math.inf}, "payload.ratio", "-inf"),
    ({"at": dt.datetime(2026, 1, 1)}, "payload.at", "datetime"),
    ({"on": dt.date(2026, 1, 1)}, "payload.on", "date"),
    ({"price": Decimal("1.10")}, "payload.price", "Decimal"),
    ({"id": uuid.UUID(int=1)}, "payload.id", "UUID"),
    ({"obj": Thing()}, "payload.obj", "Thing"),
    ({"d": MyDict(a=1)}, "payload.d", "subclass of dict"),
    ({"d": OrderedDict(a=1)}, "payload.d", "subclass of dict"),
    ({"l": MyList([1])}, "payload.l", "subclass of list"),
    ({"s": MyStr("x")}, "payload.s", "subclass of str"),
    ({"f": len}, "payload.f", "builtin_function_or_method"),
    (_cycle_list(), "payload.items.1", "cycle"),
    (_cycle_dict(), "payload.self", "cycle"),
]


@pytest.mark.django_db
@pytest.mark.parametrize("payload, path, what", UNSAFE, ids=[u[1] + ":" + u[2] for u in UNSAFE])
def test_q1_unsafe_payload_is_refused_naming_the_path_and_creates_nothing(payload, path, what):
    with pytest.raises(QueueUnsafe) as caught:
        start_job_run("tests.walk", instance="q1", payload=payload)
    message = str(caught.value)
    assert path in message and what in message, message
    assert caught.value.path == path
    assert isinstance(caught.value, ValidationError) and isinstance(caught.value, JobRunsError)
    assert not JobRun.objects.exists()


def test_q1_accepts_json_values_and_keeps_their_types():
    value = {"a": [1, 2.5, "x", None, True, False, {"b": []}], "big": 2**62, "": -0.0, "uni": "é\u0000"}
    text = dump_queue_safe(value, "payload")
    assert json.loads(text) == value
    shared = [1]
    check_queue_safe({"x": shared, "y": shared}, "payload")  # shared, not cyclic


@pytest.mark.django_db
def test_q1_unsafe_cursor_is_refused_at_commit(behaviour):
    behaviour["cur"] = lambda p: {"cursor": {"when": dt.datetime(2026, 1, 1)}}
    run, _ = start_job_run("tests.scripted", instance="cur")
    report = run_due_jobs()
    run.refresh_from_db()
    assert report.failed == 1 and "cursor.when" in report.errors[0][1]
    assert run.cursor is None and run.status == "failed"


@pytest.mark.django_db
def test_q2_step_result_comes_back_through_its_stored_form_first_time_and_on_replay(behaviour, clock):
    seen = []
    when = dt.datetime(2026, 3, 1, 9, 30, tzinfo=dt.UTC)

    def handler(p):
        got = p.step("fetch", lambda: {"pair": (1, 2), "at": when, "price": Decimal("9.99"), 3: "three"})
        seen.append(got)
        if len(seen) == 1:
            raise ConnectionError("fail after the step, so the next pass replays its memo")
        return {"done": True}

    behaviour["q2"] = handler
    run, _ = start_job_run("tests.scripted", instance="q2")
    run_due_jobs(now=clock)
    assert JobStep.objects.get(run=run, step="fetch").result is not None
    clock.advance(hours=1)
    run_due_jobs(now=clock)
    assert seen[0] == seen[1] == {"pair": [1, 2], "at": "2026-03-01T09:30:00Z", "price": "9.99", "3": "three"}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_q1_every_accepted_value_round_trips_unchanged(value):
    restored = json.loads(dump_queue_safe(value, "payload"))
    assert restored == value
    assert json.dumps(restored, sort_keys=True) == json.dumps(value, sort_keys=True)


@pytest.mark.django_db
def test_a_payload_over_the_size_cap_is_refused_and_creates_nothing(settings):
    settings.JOBRUNS = {"PAYLOAD_MAX_BYTES": 100}
    start_job_run("tests.walk", instance="small", payload={"ids": list(range(10))})
    with pytest.raises(QueueUnsafe, match=r"payload is \d+ bytes as JSON, over the cap of 100") as caught:
        start_job_run("tests.walk", instance="big", payload={"ids": list(range(100))})
    assert caught.value.path == "payload"
    assert not JobRun.objects.filter(instance="big").exists()


@pytest.mark.django_db
def test_a_cursor_over_the_size_cap_fails_the_pass(settings, behaviour):
    settings.JOBRUNS = {"PAYLOAD_MAX_BYTES": 100}
    behaviour["bigcursor"] = lambda p: {"cursor": "x" * 200}
    run, _ = start_job_run("tests.scripted", instance="bigcursor")
    report = run_due_jobs()
    run.refresh_from_db()
    assert report.failed == 1 and "cursor is 202 bytes as JSON" in report.errors[0][1] and run.cursor is None


def nested(depth):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value, path, why",
    [
        (nested(10_000), "payload" + ".0" * 64, "nested deeper than 64 levels"),
        ({"a": nested(65)}, "payload.a" + ".0" * 63, "nested deeper than 64 levels"),
        ({"n": 10**5000}, "payload.n", "outside the signed 64-bit range"),
        ({"n": [2**63]}, "payload.n.0", "outside the signed 64-bit range"),
    ],
)
def test_q3_bounds_are_refused_naming_the_path(value, path, why):
    with pytest.raises(QueueUnsafe, match=why) as caught:
        check_queue_safe(value, "payload")
    assert caught.value.path == path


def test_q3_values_inside_the_bounds_pass():
    check_queue_safe({"a": nested(63)}, "payload")
    check_queue_safe([2**63 - 1, -(2**63)], "payload")


@pytest.mark.django_db
def test_q3_a_start_past_the_bounds_writes_nothing():
    with pytest.raises(QueueUnsafe, match="nested deeper than 64"):
        start_job_run("tests.walk", instance="deep", payload=nested(900))
    assert not JobRun.objects.filter(instance="deep").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name, why",
    [
        ("bad\x00name", "contains NUL"),
        ("lone \udc80", "lone surrogate"),
        ("", "non-empty text"),
        ("x" * 256, "at most 255"),
    ],
)
def test_a_step_name_the_database_cannot_store_is_refused_before_the_body_runs(behaviour, name, why):
    ran = []

    def handler(p):
        p.step(name, lambda: ran.append(1))
        return {"done": True}

    behaviour["badname"] = handler
    run, _ = start_job_run("tests.scripted", instance="badname")
    report = run_due_jobs()
    run.refresh_from_db()
    assert ran == [] and report.failed == 1 and run.status == "failed" and run.attempts == 1
    assert why in run.last_error and "not retried" in run.last_error
    assert not JobStep.objects.filter(run=run).exists()
