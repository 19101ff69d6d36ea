"""The drive's hook for testing tools: who sees each pass and step a drive runs (``django_jobruns.testing``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import JobRun
    from .outcomes import PassOutcome
    from .passes import Pass


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
