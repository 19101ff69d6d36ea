"""The one seam around a pass and its steps: who sees each pass and step a drive runs.

Two kinds of onlooker use it: a testing tool's :class:`PassObserver`
(``django_jobruns.testing``), installed for a ``with`` block, and the
drive's OpenTelemetry recorder (``django_jobruns.telemetry``), when a
provider is configured. :func:`hooks` joins whichever are present into one
:class:`PassHooks`, which the pass calls at each point; with neither it is
``None`` and a pass pays nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

    from .models import JobRun
    from .outcomes import PassOutcome
    from .passes import Pass
    from .telemetry import Telemetry


class PassObserver:
    """The drive's hook for testing tools: sees each pass and each step a drive runs.

    Installed with :func:`observing` for the code inside a ``with`` block, in
    that thread (a drive with ``concurrency`` > 1 runs its passes in threads of
    its own, which it does not see). Override what you need:

    - ``pass_started(run)`` before the handler is called;
    - ``step(p, name, body, perform)`` in place of each ``p.step(name, body)``:
      ``perform(fn)`` runs the step -- memo, retry policy, fence and all --
      with ``fn`` as its body, and returns what ``p.step`` returns. Wrap
      ``body`` to see whether it ran; raise :class:`AbandonPass` after
      ``perform`` to simulate a crash right after the step's memo committed;
    - ``pass_ended(run, outcome)`` after the pass's outcome was written (not
      when the pass was abandoned).

    ``django_jobruns.testing.assert_resumable`` is built on it.
    """

    def pass_started(self, run: JobRun) -> None:
        pass

    def step(self, p: Pass, name: str, body: Callable[[], Any], perform: Callable[[Callable[[], Any]], Any]) -> Any:
        return perform(body)

    def pass_ended(self, run: JobRun, outcome: PassOutcome) -> None:
        pass


_observer: contextvars.ContextVar[PassObserver | None] = contextvars.ContextVar("jobruns_observer", default=None)


@contextlib.contextmanager
def observing(observer: PassObserver) -> Iterator[None]:
    """Let ``observer`` see the passes and steps driven in this thread inside the ``with`` block."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


class AbandonPass(BaseException):  # noqa: N818 -- it is not an error: it is a simulated death
    """Raised inside a pass to abandon it as if its process died there.

    Nothing is recorded and the lease is not given back: the run is taken over
    when the lease lapses, and that silent pass charged, as for a killed worker.
    The testing helpers raise it to simulate crashes.
    """


class PassHooks:
    """The onlookers of one pass -- a testing tool's observer, the drive's telemetry -- called at each point.

    Telemetry is outermost: the pass's span and the step's span enclose what
    the observer does, so a simulated crash is recorded where it happened.
    """

    def __init__(self, observer: PassObserver | None, telemetry: Telemetry | None) -> None:
        self.observer = observer
        self.telemetry = telemetry

    def around_pass(self, run: JobRun, fence: int, call: Callable[[], PassOutcome]) -> PassOutcome:
        """Run the pass (``call``) between the observer's start and end, under the pass's span."""
        observer = self.observer

        def observed() -> PassOutcome:
            if observer is not None:
                observer.pass_started(run)
            outcome = call()
            if observer is not None:
                observer.pass_ended(run, outcome)
            return outcome

        return self.telemetry.run_pass(run, fence, observed) if self.telemetry is not None else observed()

    def around_step(
        self,
        p: Pass,
        run: JobRun,
        name: str,
        body: Callable[[], Any],
        perform: Callable[[Callable[[], Any]], tuple[Any, bool]],
    ) -> Any:
        """Run one ``p.step``: ``perform(fn)`` runs it with ``fn`` as its body and says whether its memo answered."""
        observer = self.observer
        hit = False

        def observed() -> tuple[Any, bool]:
            nonlocal hit

            def performed(fn: Callable[[], Any]) -> Any:
                nonlocal hit
                value, hit = perform(fn)
                return value

            value = observer.step(p, name, body, performed) if observer is not None else performed(body)
            return value, hit

        if self.telemetry is not None:
            return self.telemetry.step(run, name, observed)
        return observed()[0]

    def first_step(self, run: JobRun, now: datetime) -> None:
        """The run's first step is about to run its body (its latency from the start is measured)."""
        if self.telemetry is not None:
            self.telemetry.first_step(run, now)

    def failed(self, exc: BaseException) -> None:
        """The pass's handler raised ``exc``."""
        if self.telemetry is not None:
            self.telemetry.failed(exc)


def hooks(telemetry: Telemetry | None) -> PassHooks | None:
    """The onlookers of a pass driven now in this thread, or ``None`` when nothing looks (no cost)."""
    observer = _observer.get()
    if observer is None and telemetry is None:
        return None
    return PassHooks(observer, telemetry)
