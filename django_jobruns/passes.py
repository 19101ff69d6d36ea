"""One pass of one run, under a claim: the handler, its steps, and what gets written.

- A committed pass writes the new cursor and counters, clears the retry state,
  releases or extends the lease and drops the step ledger, in one transaction.
- A failed pass writes nothing the handler produced: the cursor and counters
  stay as the last commit left them and the ledger survives, so the next pass
  skips the steps that did complete.
- Every write carries the claim's fence. A worker whose lease was taken over
  cannot write at all: its pass is reported ``lost``.
- Step bodies run outside any transaction, so a slow upstream holds no lock.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from . import db, signals
from .claims import Claim
from .exceptions import (
    LeaseLost,
    StepExhausted,
    StepInTransaction,
    StepOutsidePass,
    StepOver,
    StepResultUnstorable,
    StepReused,
)
from .models import UNREGISTERED_WARNING, JobRun
from .observers import AbandonPass as AbandonPass  # re-exported: the testing helpers' simulated death
from .observers import PassHooks, hooks
from .observers import PassObserver as PassObserver
from .observers import observing as observing
from .outcomes import (
    LOST,
    MAX_SUMMARY_CHARS,
    PERMANENT,
    Outcome,
    PassOutcome,
    storable,
    summary,
    with_traceback,
)
from .queue_safety import (
    check_result_size,
    check_step_name,
    decode,
    decode_counters,
    dump_counters,
    dump_result,
    interpret_result,
)
from .registry import Job
from .retry import RetryPolicy
from .store import store
from .store.base import Ledger
from .telemetry import Telemetry

logger = logging.getLogger("django_jobruns")

T = TypeVar("T")


@dataclass(frozen=True)
class RunRef:
    """What a handler may know about the run it is working for."""

    id: str
    module: str
    job: str
    instance: str


@dataclass
class _LedgerRow:
    result: str | None
    attempts: int
    last_error: str | None


@dataclass
class _StepFailure:
    step: str
    attempts: int
    policy: RetryPolicy
    exc: BaseException


def load_ledger(run_id: str, rows: Ledger | None = None) -> dict[str, _LedgerRow]:
    """The step ledger of the pass in flight: ``rows`` if the claim read them, else read in one query."""
    entries = store().ledger(run_id) if rows is None else rows
    return {step: _LedgerRow(result, attempts, error) for step, result, attempts, error in entries}


class Pass:
    """The handler's view of one pass: payload, cursor, counters and steps."""

    def __init__(self, run: JobRun, job: Job, claim: Claim, ledger: dict[str, _LedgerRow]) -> None:
        # Decoding the row is part of the pass: a malformed value is a failed
        # pass recorded on this run, not an error that escapes the drive.
        self._payload = decode(run.payload, "payload")
        self._cursor = decode(run.cursor, "cursor")
        self._counters = decode_counters(run.counters)
        self._run = RunRef(run.id, run.module, run.job, run.instance)
        # The row as the claim read it (the tasks backend builds a task's result from it).
        self._row = run
        self._job = job
        self._claim = claim
        self._ledger = ledger
        self._used: set[str] = set()
        self._failed_step: _StepFailure | None = None
        self._ended = False
        # Who looks at this pass: a testing tool's observer, the drive's telemetry (django_jobruns.observers).
        self._hooks: PassHooks | None = None
        self._stepped = False  # whether a step of this pass has run its body (the run's first step is timed)
        claim.store_failure = None
        # Transactions open when the pass began (a caller's, a test case's):
        # a step inside one more than these is inside the handler's own.
        self._depth = len(db.connection().atomic_blocks)

    @property
    def payload(self) -> Any:
        """The payload the run was started with (decoded JSON)."""
        return self._payload

    @property
    def cursor(self) -> Any:
        """What the last committed pass handed forward; ``None`` before the first."""
        return self._cursor

    @property
    def counters(self) -> Mapping[str, int | float]:
        """A read-only view of the run's counters, including this pass's counts."""
        return MappingProxyType(self._counters)

    @property
    def run(self) -> RunRef:
        return self._run

    @property
    def attempt(self) -> int:
        """Which attempt this pass is: 1, then one more for each failed or abandoned attempt before it."""
        return self._row.attempts + 1

    @property
    def stopping(self) -> bool:
        """Whether this pass should end early (D18), and return what it has done.

        True once the run was cancelled or paused, its lease was lost or ran
        out, the pass ran past its timeout, or the drive is stopping (SIGTERM,
        its time budget spent). A long step body or a loop in the handler checks
        it: a handler that returns its cursor then commits the progress made so
        far (a lost or timed-out pass commits nothing; its completed steps stay
        memoized).
        """
        return self._claim.stopping

    @property
    def holder(self) -> str:
        """Who holds this pass's lease (the drive's holder name)."""
        return self._claim.holder

    def count(self, name: str, by: int | float = 1) -> None:
        """Add ``by`` to counter ``name``; kept only if the pass commits."""
        if self._ended:
            raise StepOutsidePass(f"count({name!r}) was called after its pass ended; a pass counts inside the handler")
        if not isinstance(name, str) or not name:
            raise TypeError(f"a counter name is non-empty text, got {name!r}")
        if type(by) not in (int, float) or not math.isfinite(by):
            raise TypeError(f"count({name!r}, by=...) takes a finite int or float, got {by!r}")
        self._counters[name] = self._counters.get(name, 0) + by

    def step(self, name: str, fn: Callable[[], T], *, retry: RetryPolicy | None = None) -> Any:
        """Run ``fn`` once for this pass and return its result through its stored form.

        A step already completed (in an earlier, failed attempt of this pass, or
        before the process was killed) is not run again: its recorded result is
        returned. Step names must be a pure function of the payload and prior
        results.
        """
        if self._hooks is None:
            return self._step(name, fn, retry)[0]
        return self._hooks.around_step(self, self._row, name, fn, lambda body: self._step(name, body, retry))

    def _step(self, name: str, fn: Callable[[], T], retry: RetryPolicy | None) -> tuple[Any, bool]:
        """The step's value, and whether its memo answered."""
        check_step_name(name)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"step {name!r}: retry must be a RetryPolicy, got {retry!r}")
        if self._ended:
            raise StepOutsidePass(f"step {name!r} was called after its pass ended; steps run inside the handler")
        if self._claim.lost:
            raise LeaseLost(f"run {self._run.id}: the lease was taken over; step {name!r} not run")
        if name in self._used:
            raise StepReused(name)
        wrapper = db.connection()
        if len(wrapper.atomic_blocks) > self._depth:
            raise StepInTransaction(
                f"step {name!r} was called inside a transaction the handler opened: its record would roll "
                "back with that transaction and the step would run again on every attempt; open the "
                "transaction inside the step's function instead"
            )
        self._used.add(name)
        prior = self._ledger.get(name)
        if prior is not None and prior.result is not None:
            return json.loads(prior.result), True
        attempts = max(prior.attempts, 0) + 1 if prior is not None else 1
        # The policy is read where a failure needs it (the setting's lookup is not on every step's way).
        if prior is not None and (policy := retry or self._job.policy).exhausted(prior.attempts):
            # Spent already (a stop came between the step's last failed attempt and
            # the run being marked failed): calling it again would be one more
            # request upstream for a run that fails anyway.
            exc = StepExhausted(name, prior.attempts, prior.last_error)
            self._failed_step = _StepFailure(name, prior.attempts, policy, exc)
            raise exc
        self._claim.hold(name)
        first = not self._stepped and not self._ledger and self._row.cursor is None and self._row.attempts == 0
        if first and self._hooks is not None:
            self._hooks.first_step(self._row, self._claim.clock())
        self._stepped = True
        try:
            value = db.ending_its_transactions(fn, f"step {name!r}", wrapper)
            try:
                stored = dump_result(value)
            except (TypeError, ValueError, RecursionError) as exc:
                raise StepResultUnstorable(
                    f"step {name!r} returned {type(value).__name__}, which has no JSON form; "
                    "a step's result is stored, so return JSON-able data"
                ) from exc
            check_result_size(name, stored)
        except BaseException as exc:
            db.mend_after_body(wrapper, exc)
            self._record_step(name, None, attempts, storable(summary(exc)))
            self._failed_step = _StepFailure(name, attempts, retry or self._job.policy, exc)
            raise
        db.mend_after_body(wrapper)
        self._record_step(name, stored, attempts, None)
        # Returned through the stored form, on the first run as on a replay, so
        # resumed code never sees a different type.
        return json.loads(stored), False

    def _record_step(self, name: str, result: str | None, attempts: int, error: str | None) -> None:
        """Record the step under the claim (fenced, renewing the lease), then in this pass's ledger."""
        self._claim.record_step(name, result, attempts, error, exists=name in self._ledger)
        self._ledger[name] = _LedgerRow(result, attempts, error)

    def _unused_memos(self) -> list[str]:
        return sorted(name for name, row in self._ledger.items() if row.result is not None and name not in self._used)


def run_pass(
    run: JobRun,
    job: Job,
    claim: Claim,
    *,
    release: bool,
    ledger: dict[str, _LedgerRow] | None = None,
    telemetry: Telemetry | None = None,
) -> PassOutcome:
    """Run one pass of ``run`` under ``claim`` and write what happened.

    ``release`` says whether the pass's final write also gives the lease back
    (the last pass of this drive for the run); otherwise it extends it. A
    committed pass updates ``run`` to what it committed, and to whether an
    operator paused it meanwhile, for the drive's next pass. Never raises for
    the handler's own failures; a database error writing the outcome
    propagates to the drive, which reports it.
    """
    onlookers = hooks(telemetry)
    if onlookers is None:
        return _run_pass(run, job, claim, release, ledger, None)
    return onlookers.around_pass(run, claim.fence, lambda: _run_pass(run, job, claim, release, ledger, onlookers))


def _run_pass(
    run: JobRun,
    job: Job,
    claim: Claim,
    release: bool,
    ledger: dict[str, _LedgerRow] | None,
    onlookers: PassHooks | None,
) -> PassOutcome:
    p: Pass | None = None
    if ledger is None:
        ledger = load_ledger(run.id)  # bookkeeping: a failure here is the drive's, not the job's
    claim.begin_pass(job)
    try:
        p = Pass(run, job, claim, ledger)
        p._hooks = onlookers
        returned = db.ending_its_transactions(lambda: job.handler(p), "the handler")
        db.mend_after_body(db.connection())
        claim.check_timeout()  # a pass that ran past its timeout commits nothing (D19)
        cursor, done = interpret_result(returned, run.cursor)
        counters_text = dump_counters(p._counters)
    except LeaseLost:
        return LOST
    except StepOver as exc:
        # Not this process's to work (a task it cannot import): given back untouched, uncharged, named.
        note = storable(f"{UNREGISTERED_WARNING}: {summary(exc)} (in the process that drove it, {claim.holder})")
        if claim.lost or not claim.step_over(note):
            return LOST
        return PassOutcome(Outcome.STEPPED_OVER, error=summary(exc))
    except BaseException as exc:
        escaping = not isinstance(exc, Exception)
        if isinstance(exc, AbandonPass):
            raise  # as if the process died here: nothing recorded, the lease left to lapse
        if claim.lost:
            if escaping:
                raise
            return LOST
        if claim.store_failure is not None:
            # The engine's own write failed (a lock, a dropped connection):
            # nothing of this pass is charged to the job; the drive reports it.
            if claim.store_failure is exc:
                raise
            raise claim.store_failure from exc
        # The server dropped the connection under the pass (or it never opened):
        # record the failure on a new one rather than losing it with the old.
        db.mend_after_body(db.connection(), exc)
        if onlookers is not None:
            onlookers.failed(exc)
        outcome = _fail(run, job, claim, p, exc)
        if escaping:
            # SystemExit, KeyboardInterrupt: recorded, the lease given back,
            # and then let go, so the process can do what was asked of it.
            raise
        return outcome
    finally:
        claim.end_pass()
        if p is not None:
            p._ended = True

    warning = None
    unused = p._unused_memos()
    if unused:
        warning = (
            f"pass committed with completed steps it never asked for: {', '.join(unused)}; "
            "step names must be a pure function of the payload and prior results, or resume repeats work"
        )
        logger.warning("run %s (%s): %s", run.id, run.title, warning)
    committed = claim.commit(
        cursor, counters_text, done=done, release=release, warning=warning, drop_ledger=bool(ledger)
    )
    if committed is None:
        return LOST
    # The run as this commit left it: a further pass under the same claim starts
    # from it, with no read of the row in between.
    run.cursor, run.counters, run.attempts, run.next_attempt_at = cursor, counters_text, 0, None
    run.paused_at = committed.paused_at
    if signals.pass_committed.has_listeners() or (done and signals.run_completed.has_listeners()):
        identity = {"run_id": run.id, "module": run.module, "job": run.job, "instance": run.instance}
        decoded_cursor = json.loads(cursor) if cursor is not None else None
        counters = dict(p._counters)
        signals.send_after_commit(
            signals.pass_committed, **identity, cursor=decoded_cursor, counters=counters, done=done
        )
        if done:
            signals.send_after_commit(signals.run_completed, **identity, cursor=decoded_cursor, counters=counters)
    return PassOutcome(Outcome.COMPLETED if done else Outcome.ADVANCED, warning=warning)


def _fail(run: JobRun, job: Job, claim: Claim, p: Pass | None, exc: BaseException) -> PassOutcome:
    """Record a failed pass and give the lease back: a failed run waits out its backoff."""
    step = p._failed_step if p is not None else None
    if step is not None and step.exc is not exc:
        step = None  # the handler caught the step's error and failed for another reason
    attempts = max(run.attempts, 0) + 1
    policy = step.policy if step is not None else job.policy
    against = step.attempts if step is not None else attempts
    permanent = isinstance(exc, PERMANENT)
    exhausted = permanent or policy.exhausted(against)
    if permanent:
        first_line = f"{summary(exc)} (not retried: retrying cannot fix this)"
        if step is not None:
            first_line = f"step {step.step!r} failed: {first_line}"
    elif step is not None and not isinstance(exc, StepExhausted):
        first_line = f"step {step.step!r} failed (attempt {step.attempts} of {policy.max_attempts}): {summary(exc)}"
    else:
        first_line = summary(exc)
    first_line = storable(first_line, MAX_SUMMARY_CHARS)
    now = claim.clock()
    next_attempt_at = None if exhausted else policy.next_attempt_at(against, now)
    if not claim.fail(attempts, with_traceback(first_line, exc), next_attempt_at=next_attempt_at):
        return LOST
    # A run that ends failed is an error an operator must see; a pass that will be retried a warning.
    logger.log(
        logging.ERROR if exhausted else logging.WARNING,
        "run %s (%s) pass failed%s: %s",
        run.id,
        run.title,
        " and the run is failed" if exhausted else ", will retry",
        first_line,
    )
    if exhausted:
        signals.send_run_failed(run, first_line)
    return PassOutcome(Outcome.FAILED if exhausted else Outcome.RETRYING, error=first_line)
