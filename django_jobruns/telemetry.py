"""OpenTelemetry traces and metrics of starts, drives, passes and steps (the ``otel`` extra).

Spans and instruments go through ``opentelemetry-api`` to whatever SDK the
project configures. Without the API installed, or with no tracer or meter
provider set (the API's defaults), :func:`current` says so with ``None`` and
the engine does nothing more: it asks once per drive and once per start.

- ``send {job}`` (PRODUCER) around a start; its context is stored with the
  run (``JobRun.trace_context``, W3C trace context), so every pass of the run
  links to the trace that started it, however much later it runs.
- ``jobruns.drive`` (INTERNAL) around ``run_due_jobs``; every pass of the
  drive is its child, in whichever of the drive's threads it ran.
- ``process {job}`` (CONSUMER) around each pass: the run's id, job, instance,
  attempt and fence, the outcome; an error status and the exception for a
  failed pass; a link to the start's span.
- ``step {name}`` (INTERNAL) around each ``p.step``: memo hit or miss; the
  exception of a step that raised.

The metric instruments are listed in ``docs/observability.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import propagate as otel_propagate
    from opentelemetry import trace as otel_trace
except ImportError:  # the otel extra is not installed: nothing is traced or measured
    otel_trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .models import JobRun
    from .outcomes import PassOutcome

logger = logging.getLogger("django_jobruns")

SYSTEM = "django_jobruns"
SCOPE = "django_jobruns"


class Instruments:
    """The metric instruments, made once per meter provider."""

    def __init__(self, meter: Any) -> None:
        self.runs_started = meter.create_counter(
            "jobruns.runs.started", unit="{run}", description="Runs started (a start that joined a live run is not one)"
        )
        self.runs_finished = meter.create_counter(
            "jobruns.runs.finished", unit="{run}", description="Runs that reached done or failed, by status"
        )
        self.passes = meter.create_counter("jobruns.passes", unit="{pass}", description="Passes, by outcome")
        self.pass_duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="How long a pass took, by outcome"
        )
        self.steps = meter.create_counter(
            "jobruns.steps", unit="{step}", description="Steps asked for, by memo hit (not run again) or miss (run)"
        )
        self.step_duration = meter.create_histogram(
            "jobruns.step.duration", unit="s", description="How long a step's body took (memo misses)"
        )
        self.first_step_latency = meter.create_histogram(
            "jobruns.run.first_step.latency", unit="s", description="From a run's start to its first step's body"
        )
        self.takeovers = meter.create_counter(
            "jobruns.takeovers", unit="{run}", description="Runs claimed from a holder whose lease lapsed unreleased"
        )


class Telemetry:
    """What the configured providers ask for: a tracer, instruments, or both."""

    def __init__(self, tracer: Any | None, instruments: Instruments | None) -> None:
        self.tracer = tracer
        self.instruments = instruments

    # -- starts ----------------------------------------------------------------

    @contextlib.contextmanager
    def starting(self, label: str) -> Iterator[StartSpan]:
        """A start of a run of ``label``: a PRODUCER span whose context the new row keeps."""
        if self.tracer is None:
            yield StartSpan(None, None)
            return
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": label,
        }
        with _span(self.tracer, f"send {label}", kind=otel_trace.SpanKind.PRODUCER, attributes=attributes) as span:
            carrier: dict[str, str] = {}
            otel_propagate.inject(carrier)
            yield StartSpan(span, json.dumps(carrier, separators=(",", ":")) if carrier else None)

    def started(self, start: StartSpan, run: JobRun, created: bool) -> None:
        if start.span is not None:
            start.span.set_attribute("messaging.message.id", run.id)
            start.span.set_attribute("jobruns.run.id", run.id)
            start.span.set_attribute("jobruns.instance", run.instance)
            start.span.set_attribute("jobruns.joined", not created)
        if created and self.instruments is not None:
            self.instruments.runs_started.add(1, {"jobruns.job": run.label})

    # -- drives ----------------------------------------------------------------

    @contextlib.contextmanager
    def driving(self, holder: str) -> Iterator[Any]:
        """The drive's span; yields the context its threads' passes are children of."""
        if self.tracer is None:
            yield None
            return
        with _span(self.tracer, "jobruns.drive", attributes={"messaging.system": SYSTEM, "jobruns.holder": holder}):
            yield otel_context.get_current()

    def takeover(self, label: str) -> None:
        if self.instruments is not None:
            self.instruments.takeovers.add(1, {"jobruns.job": label})

    # -- passes ----------------------------------------------------------------

    def run_pass(self, run: JobRun, fence: int, body: Callable[[], PassOutcome]) -> PassOutcome:
        """Run one pass under its span; count it and time it."""
        from .outcomes import Outcome

        label = run.label
        began = time.perf_counter()
        outcome: PassOutcome | None = None
        try:
            if self.tracer is None:
                outcome = body()
            else:
                attributes = {
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "process",
                    "messaging.operation.name": "process",
                    "messaging.destination.name": label,
                    "messaging.message.id": run.id,
                    "jobruns.run.id": run.id,
                    "jobruns.job": label,
                    "jobruns.instance": run.instance,
                    "jobruns.attempt": max(run.attempts, 0) + 1,
                    "jobruns.fence": fence,
                }
                with _span(
                    self.tracer,
                    f"process {label}",
                    kind=otel_trace.SpanKind.CONSUMER,
                    attributes=attributes,
                    links=_start_link(run.trace_context),
                ) as span:
                    outcome = body()
                    span.set_attribute("jobruns.outcome", outcome.status.value)
                    if outcome.status in (Outcome.FAILED, Outcome.RETRYING):
                        span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, outcome.error))
            return outcome
        finally:
            if self.instruments is not None:
                status = outcome.status.value if outcome is not None else "abandoned"
                seconds = time.perf_counter() - began
                self.instruments.passes.add(1, {"jobruns.job": label, "jobruns.outcome": status})
                self.instruments.pass_duration.record(
                    seconds,
                    {"messaging.system": SYSTEM, "messaging.destination.name": label, "jobruns.outcome": status},
                )
                if outcome is not None and outcome.status in (Outcome.COMPLETED, Outcome.FAILED):
                    finished = "done" if outcome.status is Outcome.COMPLETED else "failed"
                    self.instruments.runs_finished.add(1, {"jobruns.job": label, "jobruns.status": finished})

    def failed(self, exc: BaseException) -> None:
        """A pass failed with ``exc``: recorded on the pass's span (the current one)."""
        if self.tracer is not None:
            otel_trace.get_current_span().record_exception(exc)

    # -- steps -----------------------------------------------------------------

    def step(self, run: JobRun, name: str, call: Callable[[], tuple[Any, bool]]) -> Any:
        """Run one ``p.step`` under its span; ``call`` returns the step's value and whether its memo answered."""
        label = run.label
        began = time.perf_counter()
        hit: bool | None = None
        try:
            if self.tracer is None:
                value, hit = call()
            else:
                with _span(
                    self.tracer, f"step {name}", attributes={"jobruns.step.name": name, "jobruns.run.id": run.id}
                ) as span:
                    value, hit = call()
                    span.set_attribute("jobruns.step.memo", "hit" if hit else "miss")
            return value
        finally:
            if self.instruments is not None:
                memo = "hit" if hit else "miss"
                self.instruments.steps.add(1, {"jobruns.job": label, "jobruns.step.memo": memo})
                if not hit:
                    self.instruments.step_duration.record(time.perf_counter() - began, {"jobruns.job": label})

    def first_step(self, run: JobRun, now: datetime) -> None:
        if self.instruments is not None and run.started_at is not None:
            latency = max((now - run.started_at).total_seconds(), 0.0)
            self.instruments.first_step_latency.record(latency, {"jobruns.job": run.label})


class StartSpan:
    """A start's span (``None`` when not tracing) and the context the new row keeps."""

    def __init__(self, span: Any | None, carrier: str | None) -> None:
        self.span = span
        self.carrier = carrier


_cache: dict[tuple[int, int], Telemetry | None] = {}


def current() -> Telemetry | None:
    """The telemetry the configured providers ask for, or ``None`` (nothing to do) -- asked once per drive or start."""
    if otel_trace is None:
        return None
    tracer_provider = otel_trace.get_tracer_provider()
    meter_provider = otel_metrics.get_meter_provider()
    key = (id(tracer_provider), id(meter_provider))
    if key in _cache:
        return _cache[key]
    tracing = not isinstance(tracer_provider, (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider))
    measuring = (
        not isinstance(meter_provider, otel_metrics.NoOpMeterProvider)
        and type(meter_provider).__name__ != "_ProxyMeterProvider"
    )
    found = None
    if tracing or measuring:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("django-jobruns")
        except PackageNotFoundError:  # pragma: no cover -- run from a checkout without an install
            ours = None
        found = Telemetry(
            tracer_provider.get_tracer(SCOPE, ours) if tracing else None,
            Instruments(meter_provider.get_meter(SCOPE, ours)) if measuring else None,
        )
    _cache.clear()  # the providers changed (a test's, or the SDK set late): one entry
    _cache[key] = found
    return found


@contextlib.contextmanager
def starting(label: str) -> Iterator[tuple[Telemetry | None, StartSpan | None]]:
    """A start's telemetry: ``(None, None)`` when nothing is configured."""
    telemetry = current()
    if telemetry is None:
        yield None, None
        return
    with telemetry.starting(label) as start:
        yield telemetry, start


@contextlib.contextmanager
def attached(parent: Any) -> Iterator[None]:
    """Make ``parent`` (a drive's context) current in this thread, for the passes it runs."""
    if parent is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


def _start_link(stored: str | None) -> list[Any]:
    """The link to the start's span from a run's stored trace context; none from one that does not decode."""
    if not stored:
        return []
    try:
        carrier = json.loads(stored)
    except ValueError:
        carrier = None
    if not isinstance(carrier, dict) or not all(isinstance(v, str) for v in carrier.values()):
        _warn_once("a run's stored trace context is not a map of texts: its passes are not linked to its start")
        return []
    try:
        span_context = otel_trace.get_current_span(otel_propagate.extract(carrier)).get_span_context()
    except Exception:
        _warn_once("a run's stored trace context could not be read: its passes are not linked to its start")
        return []
    if not span_context.is_valid:
        return []
    return [otel_trace.Link(span_context, {"jobruns.link": "start"})]


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """Telemetry's own trouble, said once per process: it never changes what the engine does."""
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message, exc_info=True)


@contextlib.contextmanager
def _span(tracer: Any, name: str, **kwargs: Any) -> Iterator[Any]:
    """``tracer.start_as_current_span``, inert when the SDK's parts raise (a processor's ``on_start``, ``on_end``).

    The block runs all the same, under a span that records nothing, and the
    trouble is said once. What the block itself raises goes through untouched.
    """
    try:
        manager = tracer.start_as_current_span(name, **kwargs)
        span = manager.__enter__()
    except Exception:
        _warn_once(f"a span could not be started ({name}): telemetry goes on without it")
        yield otel_trace.INVALID_SPAN
        return
    try:
        yield span
    except BaseException as exc:
        try:
            manager.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException as ending:
            if ending is not exc:
                _warn_once(f"a span could not be ended ({name})")
        raise
    try:
        manager.__exit__(None, None, None)
    except Exception:
        _warn_once(f"a span could not be ended ({name})")


class Traced(NamedTuple):
    """A drive's telemetry: what to record with, and the context its passes are children of."""

    recorder: Telemetry
    parent: Any


@contextlib.contextmanager
def traced_drive(holder: str) -> Iterator[Traced | None]:
    """A drive's telemetry, under the drive's span; ``None`` when nothing is configured to record (no cost)."""
    recorder = current()
    if recorder is None:
        yield None
        return
    with recorder.driving(holder) as parent:
        yield Traced(recorder, parent)


@contextlib.contextmanager
def ticking(schedule: str, target: str, tick: datetime) -> Iterator[None]:
    """A schedule's tick being started: a span around the start (the run's own start span is its child)."""
    recorder = current()
    if recorder is None or recorder.tracer is None:
        yield
        return
    attributes = {
        "messaging.system": SYSTEM,
        "jobruns.schedule": schedule,
        "jobruns.schedule.target": target,
        "jobruns.schedule.tick": tick.isoformat(),
    }
    with _span(recorder.tracer, f"tick {schedule}", attributes=attributes):
        yield
