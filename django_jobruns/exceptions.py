"""Errors raised by django-jobruns.

Every error the app raises on purpose derives from :class:`JobRunsError`, so a
caller can catch "anything this app refused" in one clause. Where a builtin or a
Django exception already names the kind of failure, the error derives from it
too (``UnknownJob`` is a ``LookupError``, ``QueueUnsafe`` a ``ValidationError``),
so code written against those keeps working.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError


class JobRunsError(Exception):
    """Base class of every error django-jobruns raises on purpose."""


class UnknownJob(JobRunsError, LookupError):
    """A job was named that no app registers (or the name is malformed)."""


class AlreadyRegistered(JobRunsError):
    """A second handler was registered under a ``(module, job)`` key already taken."""


class QueueUnsafe(JobRunsError, ValidationError):
    """A payload or cursor holds a value JSON would drop or reshape.

    ``path`` is the dotted location of the first offending value
    (``payload.items.3``); the message names it and says why.
    """

    def __init__(self, message: str, *, path: str) -> None:
        ValidationError.__init__(self, message, code="queue_unsafe", params={"path": path})
        self.path = path

    def __str__(self) -> str:
        return self.messages[0]


class InvalidDriveOptions(JobRunsError, ValueError):
    """An option of ``run_due_jobs`` cannot mean what it says; nothing was claimed."""


class DriveInTransaction(JobRunsError, RuntimeError):
    """``run_due_jobs`` was called inside a transaction the caller opened; nothing was claimed.

    Its commits would roll back with the caller's transaction, and the passes
    it reported would be lost.
    """


class Cancelled(JobRunsError):
    """A run was cancelled by an operator: what a cancelled task's result names as its error."""


class DatabaseReadOnly(JobRunsError):
    """The database refuses writes (a read-only file, a standby, ``default_transaction_read_only``): nothing can be
    claimed, so the drive stops at its first claim instead of trying every due run on every look."""


class InvalidPassResult(JobRunsError, ValueError):
    """A handler returned something other than ``None`` or ``{"cursor": …, "done": …}``."""


class StepReused(JobRunsError):
    """A pass called ``step()`` twice under one name.

    The second call would read the first one's memo and silently skip its own
    work, so it is refused. ``reason`` is ``"job_step_reused"``.
    """

    reason = "job_step_reused"

    def __init__(self, step: str) -> None:
        super().__init__(
            f"step {step!r} was already run in this pass: a step name identifies one unit of "
            "work, so a second call under it would return the first one's result instead of "
            "doing anything (job_step_reused)"
        )
        self.step = step


class StepExhausted(JobRunsError):
    """A step whose recorded attempts already reached its retry policy was asked for again."""

    def __init__(self, step: str, attempts: int, last_error: str | None) -> None:
        super().__init__(f"step {step!r} is exhausted after {attempts} attempt(s): {last_error or 'no error recorded'}")
        self.step = step
        self.attempts = attempts


class NotRestartable(JobRunsError, ValueError):
    """Only a failed run can be restarted as a new run, and only once.

    ``successor`` is the id of the run it was already restarted as, if that is why.
    """

    successor: str | None = None


class LeaseLost(JobRunsError):
    """This worker's claim on a run was taken over; its writes were refused by the fence."""


class PassTimedOut(JobRunsError):
    """A pass ran past its timeout (``@job(timeout=...)``): recorded as a failed attempt, retried by the policy."""


class StepOver(JobRunsError):
    """Raised by a handler: this process cannot work the run; give it back untouched and name it (D1)."""


class TaskNotImportable(StepOver):
    """A task run's function cannot be imported here (a worker still on older code in a rolling deploy).

    The run is stepped over and named, as a run of an unregistered job is, never failed: a worker that
    can import it runs it.
    """


class StoppedReporting(JobRunsError):
    """A pass stopped reporting (its worker was killed, stopped or cut off) and its lease lapsed (D10).

    What a task result's errors name for such an attempt.
    """


class TaskValueUnstorable(JobRunsError, TypeError):
    """A task's return value has no JSON form (Django's ``normalize_json`` refuses it): the task fails at once."""


class UndecodableRun(JobRunsError):
    """A run's stored payload, cursor or counters cannot be decoded; its pass fails."""


class GiveUp(JobRunsError):
    """Raised by a step or a handler: fail the run now, whatever the retry policy.

    For errors that retrying cannot fix (a record the upstream says does not
    exist, a credential revoked for good). The message becomes the run's error.
    """


class Permanent(JobRunsError):
    """A contract violation by the job's code: the run fails at once, without a retry curve.

    Retrying runs the same code on the same input, which fails the same way.
    """


class InvalidStepName(Permanent, ValueError):
    """A step name the database cannot store (empty, too long, NUL, lone surrogates); refused before its body runs."""


class StepResultUnstorable(Permanent, TypeError):
    """A step returned a value with no JSON form, so its result cannot be recorded."""


class StepInTransaction(Permanent):
    """A step was called inside a transaction the handler opened: its memo would roll back with it."""


class TaskExited(JobRunsError):
    """A task's body raised ``SystemExit``, ``CancelledError`` or another exception that is not an
    ``Exception``, save ``KeyboardInterrupt``: a failed attempt, as Django's own backends count it, and
    the worker goes on. Its cause is what the body raised, which the attempt's error names."""


class TransactionLeftOpen(Permanent):
    """A step body, a handler or a task left a database transaction open (autocommit off, a ``BEGIN``
    not ended): what it wrote in it is rolled back, not committed for it, and the run fails."""


class StepOutsidePass(JobRunsError):
    """A step was called, or a counter counted, on a pass that has already ended."""


class NotLive(JobRunsError, ValueError):
    """The operation needs a live run (running or paused), and this one has finished."""
