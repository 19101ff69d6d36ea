"""A task run's attempt records: begun with its claim, ended with its pass's ending write, both fenced.

Each statement rides on a fenced write of the claim (:meth:`~django_jobruns.claims.Claim.ride`), so
a worker whose run was taken over writes nothing to the record of the one that took it. Imports no
model at import time (the backend that uses it is loaded while Django reads ``TASKS``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple

from . import db
from .outcomes import holdable, storable_traceback
from .registry import Statements

#: What an attempt's end is reported to once its record is written: the error's class path and
#: traceback (``None`` for a success) and when it ended (``task_finished``).
Finished = Callable[[str | None, str | None, datetime], None]


class Attempt:
    """A task run's attempt record: begun in the claim's transaction, ended in the pass's ending write's.

    So a task costs two commits (the claim, the pass's commit), and a worker whose run was taken over
    adds nothing to the record of the one that took it: both ride on fenced writes
    (:meth:`~django_jobruns.claims.Claim.ride`), which write them only while the fence is the claim's.
    """

    def __init__(self, p: Any) -> None:
        self.claim = p._claim
        self.run_id, self.number = p.run.id, p.attempt
        self.began = self.claim.taken_at or db.now()
        self.ended = False

    def end(self, exc: BaseException | None, finished: Finished | None = None) -> None:
        """Record how the attempt ended, with the pass's ending write; ``finished`` once that held, given
        what the record holds: the error's class and traceback (``None`` for a success) and the end."""
        if self.ended:
            return
        self.ended = True
        error = traceback_text = None
        from .store.rows import Rider  # the models' module: not imported with the backend (jobruns.E010)

        if exc is not None:
            from .models import JobAttempt

            # What every database holds (P9): the class's path within its column, the traceback's ends.
            longest = JobAttempt._meta.get_field("error_class").max_length
            error = holdable(f"{type(exc).__module__}.{type(exc).__qualname__}")[:longest]
            traceback_text = storable_traceback("".join(traceback.format_exception(exc)))

        wrapper = db.connection()
        ended_at = db.now()
        now = wrapper.ops.adapt_datetimefield_value(ended_at)
        end = AttemptTexts.of(wrapper).end
        self.claim.ride(Rider.if_held(end, [now, error, traceback_text, self.run_id, self.number]))
        if finished is not None:
            self.claim.after_written.append(partial(finished, error, traceback_text, ended_at))

    def never_started(self) -> None:
        """The task was not run here (it cannot be imported): the record begun with the claim is removed."""
        self.ended = True
        self.claim.never_started()


class AttemptTexts(NamedTuple):
    """The statements that keep a task's attempt records, in one database's quoting (written once for each)."""

    #: The record begun, from the run's row as its claim left it (its number is the run's attempts then).
    begin: str
    #: The same, from a claim's ``{run}`` rows, where the claim's statement joins it.
    begin_joined: str
    #: A begun record removed: the claim it rode on did not hold.
    undo: str
    #: The record ended, with the pass's ending write.
    end: str

    @staticmethod
    def of(wrapper: Any) -> AttemptTexts:
        quoting = type(wrapper.ops)  # one class for each database's quoting
        texts = _texts.get(quoting)
        if texts is None:
            texts = _texts[quoting] = AttemptTexts.quoted(wrapper.ops.quote_name)
        return texts

    @staticmethod
    def quoted(q: Callable[[str], str]) -> AttemptTexts:
        from .models import JobAttempt, JobRun

        table, runs = q(JobAttempt._meta.db_table), q(JobRun._meta.db_table)
        insert = (
            f"INSERT INTO {table} ({q('run_id')}, {q('number')}, {q('holder')}, {q('started_at')}) "
            f"SELECT {q('id')}, {q('attempts')} + 1, %s, %s FROM "
        )
        return AttemptTexts(
            begin=f"{insert}{runs} WHERE {q('id')} = %s AND {q('lease_fence')} = %s",
            begin_joined=f"{insert}{{run}}",
            undo=(
                f"DELETE FROM {table} WHERE {q('run_id')} = %s AND {q('holder')} = %s AND {q('started_at')} = %s "
                f"AND {q('ended_at')} IS NULL"
            ),
            end=(
                f"UPDATE {table} SET {q('ended_at')} = %s, {q('error_class')} = %s, {q('traceback')} = %s "
                f"WHERE {q('run_id')} = %s AND {q('number')} = %s AND {q('ended_at')} IS NULL"
            ),
        )


_texts: dict[type, AttemptTexts] = {}


def begin_attempt(run_id: str, fence: int, holder: str, now: datetime) -> tuple[Statements, Statements]:
    """What a task job writes with each claim (its ``on_claim``): the attempt record begun, and its undoing.

    The attempt's number is the run's attempts after the claim plus one (a takeover's charge counted),
    as the pass's ``attempt`` is.
    """
    from .store.rows import Rider

    wrapper = db.connection()
    at = wrapper.ops.adapt_datetimefield_value(now)
    texts = AttemptTexts.of(wrapper)
    begin = Rider(texts.begin, [holder, at, run_id, fence], joined=(texts.begin_joined, [holder, at]))
    return [begin], [Rider.if_held(texts.undo, [run_id, holder, at])]
