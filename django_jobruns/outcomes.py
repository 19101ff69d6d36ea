"""What a pass can end as, which errors are whose, and how an error is written down.

- :class:`Outcome` / :class:`PassOutcome`: what one pass did.
- :data:`TRANSIENT`: database errors of the engine's own writes -- never charged
  to a job's retry policy. :data:`PERMANENT`: failures retrying cannot fix (P10).
- :func:`storable`, :func:`summary`, :func:`with_traceback`: every failure is
  recordable (P9), whatever its text holds.
- The texts the engine writes about a pass that stopped reporting (D10).
"""

from __future__ import annotations

import enum
import traceback
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError

from .exceptions import GiveUp, InvalidPassResult, Permanent, QueueUnsafe, StepReused, TaskValueUnstorable

#: Database errors of the engine's own writes that say nothing about the job
#: (a lock wait that timed out, a deadlock, a dropped connection): the pass is
#: reported unrecorded and the run taken again, never charged an attempt.
#: Other database errors (a value refused, a constraint) are deterministic, and
#: charged, so a run that hits one still ends.
TRANSIENT: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)

#: Failures that retrying cannot fix: the run fails at once (P10).
PERMANENT: tuple[type[BaseException], ...] = (
    GiveUp,
    Permanent,
    InvalidPassResult,
    StepReused,
    QueueUnsafe,
    TaskValueUnstorable,
)

#: The longest error text a run records; longer ones are cut, saying so.
MAX_ERROR_CHARS = 10_000
#: The longest first line (the summary an operator reads) a run records.
MAX_SUMMARY_CHARS = 2_000


class Outcome(enum.StrEnum):
    """What one pass did (each is also the drive report's count of it)."""

    ADVANCED = "advanced"
    """Committed, the run still running."""
    COMPLETED = "completed"
    """Committed, the run done."""
    RETRYING = "retrying"
    """Failed, a retry scheduled."""
    FAILED = "failed"
    """Failed, the run failed."""
    LOST = "lost"
    """Fenced out: another claim took the run; nothing written."""
    STEPPED_OVER = "unregistered"
    """Given back untouched: this process cannot work it (a task it cannot import), named on the run."""


@dataclass(frozen=True)
class PassOutcome:
    """What one pass did, with the error or warning to report."""

    status: Outcome
    error: str | None = None
    warning: str | None = None


LOST = PassOutcome(Outcome.LOST)


def storable(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` as every supported database can store it: no NUL, valid UTF-8, at most ``limit`` characters."""
    text = holdable(text)
    if len(text) > limit:
        note = f"\n[... {len(text) - limit} more characters cut]"
        text = text[: limit - len(note)] + note
    return text


def storable_traceback(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """A traceback as every database stores it: past ``limit`` characters its middle is cut, saying so, so
    its first frames and its last, with the exception's own line, are kept (an error carrying a whole
    response body must not make the write that records it too large for the server: MariaDB's packet)."""
    text = holdable(text)
    if len(text) <= limit:
        return text
    kept = limit - 60  # room for the note
    note = f"\n[... {len(text) - kept} characters cut ...]\n"
    return text[: kept // 2] + note + text[len(text) - (kept - kept // 2) :]


def holdable(text: str) -> str:
    """``text`` with what a database's text may not hold escaped: NUL as ``\\x00``, a lone surrogate as ``\\udXXX``."""
    text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def summary(exc: BaseException) -> str:
    """``Type: message``, or the type alone when the message is empty or cannot be printed."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:
        return f"{name} (its message could not be printed)"
    return f"{name}: {text}" if text else name


def with_traceback(first_line: str, exc: BaseException) -> str:
    """The error text a failed pass records: its summary, then the traceback, storable."""
    try:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        tb = ""
    return storable(f"{first_line}\n\n{tb}")


def stopped_reporting(holder: str) -> str:
    """The error a takeover charges to the silent pass of ``holder`` (D10)."""
    return storable(
        f"the pass under holder {holder!r} stopped reporting and its lease expired (counted as a failed attempt)",
        MAX_SUMMARY_CHARS,
    )


def abandoned(holder: str, attempts: int) -> str:
    """The error of a run whose silent passes spent its retry policy (D10)."""
    return storable(
        f"the pass under holder {holder!r} stopped reporting and its lease expired, "
        f"{attempts} time(s) in a row: the retry policy is exhausted (a pass that kills its worker, "
        "or a step that outlasts the lease?)",
        MAX_SUMMARY_CHARS,
    )
