"""OpenTelemetry: spans and metric points of runs that retry, fail, are taken over and complete.

The SDK's in-memory exporter and reader stand in for a collector; the API's
global providers are set for each test and reset after it, as the OpenTelemetry
project's own test utilities do.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from django_jobruns import GiveUp, run_due_jobs, start_job_run
from django_jobruns.models import JobRun

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")
pytestmark = pytest.mark.django_db(transaction=True)


def _reset_globals() -> None:
    import opentelemetry.metrics._internal as metrics_internal
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()


@pytest.fixture
def otel() -> Iterator[SimpleNamespace]:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    _reset_globals()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    try:
        yield SimpleNamespace(spans=exporter, reader=reader, tracer=tracer_provider.get_tracer("tests"))
    finally:
        meter_provider.shutdown()
        tracer_provider.shutdown()
        _reset_globals()


def points(reader: Any) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Every metric point by instrument name: (attributes, sum or histogram count)."""
    found: dict[str, list[tuple[dict[str, Any], Any]]] = defaultdict(list)
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = point.count if hasattr(point, "bucket_counts") else point.value
                    found[metric.name].append((dict(point.attributes), value))
    return found


def total(found: dict[str, list[tuple[dict[str, Any], Any]]], name: str, **attributes: str) -> Any:
    return sum(value for attrs, value in found.get(name, []) if all(attrs.get(k) == v for k, v in attributes.items()))


def test_spans_and_metrics_of_a_run_that_retries_is_taken_over_and_completes_and_one_that_fails(otel, behaviour, clock):
    def flaky(p):
        fetched = p.step("fetch", lambda: 1)
        if p.attempt == 1:
            raise RuntimeError("upstream answered 503")
        saved = p.step("save", lambda: fetched + 1)
        return {"cursor": saved, "done": True}

    def hopeless(p):
        raise GiveUp("the supplier's feed is gone")

    behaviour["flaky"] = flaky
    behaviour["hopeless"] = hopeless
    with otel.tracer.start_as_current_span("POST /imports") as request:
        flaky_run, _ = start_job_run("tests.scripted", instance="flaky")
        hopeless_run, _ = start_job_run("tests.scripted", instance="hopeless")
        joined, created = start_job_run("tests.scripted", instance="flaky")
    assert not created and joined.pk == flaky_run.pk

    first = run_due_jobs(now=clock)
    assert first.retrying == 1 and first.failed == 1
    # The retry's worker dies holding the lease; another drive takes the run over and completes it.
    clock.advance(hours=2)
    JobRun.objects.filter(pk=flaky_run.pk).update(
        lease_holder="dead-host:1:ab", lease_expires_at=clock.now - timedelta(seconds=1)
    )
    second = run_due_jobs(now=clock)
    assert second.taken_over == 1 and second.completed == 1

    spans = otel.spans.get_finished_spans()
    by_name: dict[str, list[Any]] = defaultdict(list)
    for span in spans:
        by_name[span.name].append(span)
    from opentelemetry.trace import SpanKind, StatusCode

    # The starts: children of the request, their contexts kept with the runs.
    sends = by_name["send tests.scripted"]
    assert len(sends) == 3 and all(s.kind is SpanKind.PRODUCER for s in sends)
    request_id = request.get_span_context().span_id
    assert all(s.parent.span_id == request_id for s in sends)
    send_of = {s.attributes["jobruns.run.id"]: s for s in sends if not s.attributes["jobruns.joined"]}
    assert set(send_of) == {flaky_run.pk, hopeless_run.pk}
    assert JobRun.objects.get(pk=flaky_run.pk).trace_context

    # Each pass: a child of its drive, linked to its run's start.
    drives = by_name["jobruns.drive"]
    assert len(drives) == 2
    passes = by_name["process tests.scripted"]
    assert len(passes) == 3 and all(s.kind is SpanKind.CONSUMER for s in passes)
    drive_ids = {d.context.span_id for d in drives}
    for span in passes:
        assert span.parent.span_id in drive_ids
        run_id = span.attributes["jobruns.run.id"]
        (link,) = span.links
        assert link.context.span_id == send_of[run_id].context.span_id
        assert link.context.trace_id == request.get_span_context().trace_id
        assert span.attributes["messaging.destination.name"] == "tests.scripted"
        assert span.attributes["jobruns.fence"] >= 1
    outcome = {(s.attributes["jobruns.instance"], s.attributes["jobruns.attempt"]): s for s in passes}
    retried = outcome[("flaky", 1)]
    assert retried.attributes["jobruns.outcome"] == "retrying" and retried.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in retried.events if e.name == "exception"] == ["RuntimeError"]
    failed = outcome[("hopeless", 1)]
    assert failed.attributes["jobruns.outcome"] == "failed" and failed.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in failed.events if e.name == "exception"] == [
        "django_jobruns.exceptions.GiveUp"
    ]
    # The takeover charged the dead worker's pass: this is the third attempt.
    completed = outcome[("flaky", 3)]
    assert completed.attributes["jobruns.outcome"] == "completed"
    assert completed.status.status_code is not StatusCode.ERROR

    # Steps: children of their pass, memo hit or miss.
    steps = [(s.name, s.attributes["jobruns.step.memo"], s.parent.span_id) for s in spans if s.name.startswith("step ")]
    assert steps == [
        ("step fetch", "miss", retried.context.span_id),
        ("step fetch", "hit", completed.context.span_id),
        ("step save", "miss", completed.context.span_id),
    ]

    found = points(otel.reader)
    assert total(found, "jobruns.runs.started", **{"jobruns.job": "tests.scripted"}) == 2
    assert total(found, "jobruns.passes", **{"jobruns.outcome": "retrying"}) == 1
    assert total(found, "jobruns.passes", **{"jobruns.outcome": "failed"}) == 1
    assert total(found, "jobruns.passes", **{"jobruns.outcome": "completed"}) == 1
    assert total(found, "jobruns.runs.finished", **{"jobruns.status": "done"}) == 1
    assert total(found, "jobruns.runs.finished", **{"jobruns.status": "failed"}) == 1
    assert total(found, "jobruns.steps", **{"jobruns.step.memo": "miss"}) == 2
    assert total(found, "jobruns.steps", **{"jobruns.step.memo": "hit"}) == 1
    assert total(found, "jobruns.takeovers") == 1
    assert total(found, "messaging.process.duration", **{"messaging.system": "django_jobruns"}) == 3
    assert total(found, "jobruns.step.duration") == 2
    assert total(found, "jobruns.run.first_step.latency") == 1


def test_a_step_that_raises_records_the_exception_on_its_own_span(otel, behaviour, clock):
    def broken(p):
        p.step("parse", lambda: int("not a number"))

    behaviour["broken"] = broken
    start_job_run("tests.scripted", instance="broken")
    run_due_jobs(now=clock)
    (step,) = [s for s in otel.spans.get_finished_spans() if s.name == "step parse"]
    from opentelemetry.trace import StatusCode

    assert step.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in step.events if e.name == "exception"] == ["ValueError"]


def test_passes_in_the_drives_threads_are_children_of_the_drive(otel, behaviour, clock):
    for n in range(4):
        behaviour[f"threaded-{n}"] = lambda p: {"done": True}
        start_job_run("tests.scripted", instance=f"threaded-{n}")
    assert run_due_jobs(now=clock, concurrency=2).completed == 4
    spans = otel.spans.get_finished_spans()
    (drive,) = [s for s in spans if s.name == "jobruns.drive"]
    passes = [s for s in spans if s.name == "process tests.scripted"]
    assert len(passes) == 4 and {s.parent.span_id for s in passes} == {drive.context.span_id}


def test_without_a_configured_sdk_nothing_is_recorded_or_stored(behaviour, clock):
    from django_jobruns import telemetry

    _reset_globals()
    assert telemetry.current() is None
    behaviour["quiet"] = lambda p: {"done": True}
    run, _ = start_job_run("tests.scripted", instance="quiet")
    assert run.trace_context is None
    assert run_due_jobs(now=clock).completed == 1


def test_a_task_enqueued_in_a_request_is_linked_from_the_pass_that_runs_it(otel):
    from tests.support import task_functions as t

    with otel.tracer.start_as_current_span("POST /checkout") as request:
        result = t.add.enqueue(2, 3)
    assert run_due_jobs().completed == 1
    spans = otel.spans.get_finished_spans()
    (send,) = [s for s in spans if s.name.startswith("send ")]
    (process,) = [s for s in spans if s.name.startswith("process ")]
    assert send.parent.span_id == request.get_span_context().span_id
    assert send.attributes["messaging.message.id"] == result.id
    (link,) = process.links
    assert link.context.span_id == send.context.span_id
    assert process.attributes["jobruns.outcome"] == "completed"


@pytest.mark.parametrize("stored", ['{"traceparent": 123}', "[1, 2]", "not json", '{"traceparent": {"a": 1}}'])
def test_a_malformed_stored_trace_context_is_ignored_and_the_run_is_worked(otel, behaviour, clock, stored, caplog):
    behaviour["garbled"] = lambda p: {"done": p.step("s", lambda: True)}
    run, _ = start_job_run("tests.scripted", instance="garbled")
    JobRun.objects.filter(pk=run.pk).update(trace_context=stored)
    with caplog.at_level("WARNING", logger="django_jobruns"):
        report = run_due_jobs(now=clock)
    assert report.completed == 1 and report.errors == [], report
    assert JobRun.objects.get(pk=run.pk).status == "done"
    assert "process tests.scripted" in {span.name for span in otel.spans.get_finished_spans()}


def test_a_span_processor_that_raises_costs_its_spans_only(otel, behaviour, clock, caplog):
    from opentelemetry.sdk.trace import SpanProcessor

    class Broken(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            raise RuntimeError("a broken processor")

        def on_end(self, span: Any) -> None:
            raise RuntimeError("a broken processor")

    from opentelemetry import trace

    trace.get_tracer_provider().add_span_processor(Broken())  # type: ignore[attr-defined]
    effects = []
    behaviour["processed"] = lambda p: {"done": p.step("s", lambda: effects.append(1) or True)}
    with caplog.at_level("WARNING", logger="django_jobruns"):
        run, _ = start_job_run("tests.scripted", instance="processed")
        report = run_due_jobs(now=clock)
    assert report.completed == 1 and report.errors == [], report
    assert effects == [1] and JobRun.objects.get(pk=run.pk).status == "done"
    assert "a span could not be started" in caplog.text
