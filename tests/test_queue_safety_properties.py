"""Queue safety, by property: what is accepted round-trips through storage; what is not is refused by path."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from django_jobruns import job_runs, start_job_run
from django_jobruns.exceptions import QueueUnsafe
from django_jobruns.models import JobRun

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 is not 1.0 is not True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


_instances = itertools.count()


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_every_accepted_payload_round_trips_through_storage_unchanged(value):
    instance = f"prop-{next(_instances)}"
    run, created = start_job_run("tests.walk", instance=instance, payload=value)
    assert created
    (record,) = job_runs(instance=instance)
    assert record.decode_error is None
    assert same(record.payload, value), (record.payload, value)
    JobRun.objects.filter(pk=run.pk).delete()


UNSAFE_LEAVES = st.sampled_from(
    [
        b"bytes",
        bytearray(b"x"),
        {1, 2},
        frozenset(),
        (1, 2),
        math.nan,
        math.inf,
        -math.inf,
        dt.datetime(2026, 1, 1),
        dt.date(2026, 1, 1),
        Decimal("1.5"),
        uuid.uuid4(),
        object(),
        {3: "int key"},
    ]
)
path_segments = st.lists(st.one_of(st.text(alphabet="abcxyz", min_size=1, max_size=4), st.integers(0, 3)), max_size=4)


@given(segments=path_segments, leaf=UNSAFE_LEAVES, siblings=st.lists(json_leaves, max_size=3))
def test_every_reshaped_value_is_refused_naming_its_path(segments, leaf, siblings):
    from django_jobruns.queue_safety import check_queue_safe

    value: Any = leaf
    path: list[Any] = []
    for segment in reversed(segments):
        if isinstance(segment, int):
            # Safe siblings before the bad one: it sits at index len(siblings).
            value = [*siblings, value]
            path.insert(0, str(len(siblings)))
        else:
            value = {segment: value}
            path.insert(0, segment)
    expected = ".".join(["payload", *path])
    if isinstance(leaf, dict):
        expected += ".3"  # the offending key itself
    with pytest.raises(QueueUnsafe) as caught:
        check_queue_safe(value, "payload")
    assert caught.value.path == expected
    assert expected in str(caught.value)


@given(depth=st.integers(min_value=0, max_value=200))
def test_q3_nesting_is_accepted_exactly_up_to_the_bound(depth):
    from django_jobruns.queue_safety import MAX_DEPTH, check_queue_safe

    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    if depth <= MAX_DEPTH:
        check_queue_safe(value, "payload")
    else:
        with pytest.raises(QueueUnsafe, match=f"nested deeper than {MAX_DEPTH}"):
            check_queue_safe(value, "payload")


@given(st.integers())
def test_q3_integers_are_accepted_exactly_within_64_bits(number):
    from django_jobruns.queue_safety import check_queue_safe

    if -(2**63) <= number < 2**63:
        check_queue_safe({"n": number}, "payload")
    else:
        with pytest.raises(QueueUnsafe, match="outside the signed 64-bit range"):
            check_queue_safe({"n": number}, "payload")


@given(st.text(max_size=300) | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)))
@example("bad\x00name")
@example("lone \udc80 surrogate")
def test_step_names_the_databases_cannot_store_are_refused_and_the_rest_accepted(name):
    from django_jobruns.exceptions import InvalidStepName
    from django_jobruns.queue_safety import check_step_name

    storable = bool(name) and len(name) <= 255 and "\x00" not in name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        storable = False
    if storable:
        check_step_name(name)
    else:
        with pytest.raises(InvalidStepName):
            check_step_name(name)


@given(st.text(max_size=50_000) | st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0xDFFF)))
@example("x" * 5_000_000 + "\x00")
def test_every_error_text_is_made_storable(text):
    from django_jobruns.outcomes import storable

    stored = storable(text)
    assert "\x00" not in stored and len(stored) <= 10_000
    stored.encode("utf-8")
