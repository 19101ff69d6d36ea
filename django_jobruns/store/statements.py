"""The text of the engine's statements, built once per database from the models' names.

Each attribute (or method, for a statement whose SET list depends on the
transition written) is one whole statement: nothing is glued to another
statement's text where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import DateTimeField, F
from django.db.models.expressions import CombinedExpression, Value

from ..models import JobRun, JobStep, Status

#: The run's fields a claim returns (as the pass needs them).
RUN_FIELDS = (
    "id",
    "module",
    "job",
    "instance",
    "payload",
    "status",
    "cursor",
    "counters",
    "attempts",
    "lease_fence",
    "next_attempt_at",
    "paused_at",
    "started_at",
    "trace_context",
    "queue_name",
    "priority",
)

#: Of :data:`RUN_FIELDS`, the datetimes (as the model says), and their places in a claim's row.
DATETIME_FIELDS = tuple(name for name in RUN_FIELDS if isinstance(JobRun._meta.get_field(name), DateTimeField))
DATETIME_PLACES = tuple(RUN_FIELDS.index(name) for name in DATETIME_FIELDS)

#: The due read's columns, in :class:`~django_jobruns.store.DueRow`'s order.
DUE_FIELDS = ("id", "lease_fence", "module", "job", "lease_holder", "queue_name", "priority")


@dataclass(frozen=True)
class Expiry:
    """A lease's new expiry as a statement sets it: ``ttl`` after ``now`` (``None``: the database's clock)."""

    now: datetime | None
    ttl: timedelta


class ClockSQL:
    """Where a statement's "now" comes from: a parameter (the host's or an injected clock)."""

    #: The instant lease comparisons are made at.
    now = "%s"
    #: A lease's new expiry.
    expiry = "%s"

    def now_params(self, now: datetime | None, adapt: Any) -> list[Any]:
        if now is None:
            raise ValueError("this database has no clock of its own in SQL: a statement needs the time as a parameter")
        return [adapt(now)]

    def expiry_params(self, expiry: Expiry, adapt: Any) -> list[Any]:
        return [adapt(expiry.now + expiry.ttl)] if expiry.now is not None else self.now_params(None, adapt)


class PostgresClockSQL(ClockSQL):
    """PostgreSQL's own clock when no time is given: the statement's start, as the server received it."""

    now = "COALESCE(%s, statement_timestamp())"
    expiry = "COALESCE(%s, statement_timestamp()) + make_interval(secs => %s)"

    def now_params(self, now: datetime | None, adapt: Any) -> list[Any]:
        return [None if now is None else adapt(now)]

    def expiry_params(self, expiry: Expiry, adapt: Any) -> list[Any]:
        return [*self.now_params(expiry.now, adapt), expiry.ttl.total_seconds()]


class MySQLClockSQL(PostgresClockSQL):
    """MariaDB's and MySQL's own clock when no time is given: ``UTC_TIMESTAMP(6)``, the statement's start."""

    now = "COALESCE(CAST(%s AS DATETIME(6)), UTC_TIMESTAMP(6))"
    expiry = "COALESCE(CAST(%s AS DATETIME(6)), UTC_TIMESTAMP(6)) + INTERVAL %s MICROSECOND"

    def expiry_params(self, expiry: Expiry, adapt: Any) -> list[Any]:
        return [*self.now_params(expiry.now, adapt), expiry.ttl // timedelta(microseconds=1)]


def _epoch(column: str) -> str:
    """PostgreSQL: a timestamptz ``column`` as whole microseconds since the epoch (``NULL`` stays ``NULL``)."""
    return f"(EXTRACT(EPOCH FROM {column}) * 1000000)::bigint"


def _columns(model: Any, quote: Any) -> dict[str, str]:
    """Each field's column, quoted, by field name (``run`` → ``"run_id"``)."""
    return {f.name: quote(f.column) for f in model._meta.concrete_fields}


class Statements:
    """The statements' text for one database (built once per vendor)."""

    def __init__(self, wrapper: Any, clock: ClockSQL) -> None:
        self.clock = clock
        self.adapt = wrapper.ops.adapt_datetimefield_value
        now, expiry = clock.now, clock.expiry
        q = wrapper.ops.quote_name
        r, s = _columns(JobRun, q), _columns(JobStep, q)
        self.run_columns = r
        run, step = q(JobRun._meta.db_table), q(JobStep._meta.db_table)
        self.run_table, self.step_table = run, step
        self._cache: dict[tuple[Any, ...], str] = {}
        step_set = f"{s['result']} = %s, {s['attempts']} = %s, {s['last_error']} = %s, {s['recorded_at']} = %s"
        step_columns = f"{s['run']}, {s['step']}, {s['result']}, {s['attempts']}, {s['last_error']}, {s['recorded_at']}"
        self.columns = columns = ", ".join(r[name] for name in RUN_FIELDS)
        # What PostgreSQL's one-statement claims send back of the run they claimed: its datetimes as
        # microseconds since the epoch (exact: EXTRACT gives a numeric), read as integers. Django's
        # loader of a timestamptz is Python, set up again for each cursor; an integer's is psycopg's C.
        self.claimed_out = ", ".join(
            _epoch(f"claimed.{r[name]}") if name in DATETIME_FIELDS else f"claimed.{r[name]}" for name in RUN_FIELDS
        )
        # -- the claim: holder, expiry and the next fence, if the fence read with
        # the due row is still the run's and its lease is free.
        take = f"{r['lease_holder']} = %s, {r['lease_expires_at']} = {expiry}, {r['lease_fence']} = %s"
        free = (
            f"{r['id']} = %s AND {r['lease_fence']} = %s "
            f"AND ({r['lease_expires_at']} IS NULL OR {r['lease_expires_at']} <= {now})"
        )
        self.claim = f"UPDATE {run} SET {take} WHERE {free}"
        self.claim_returning = f"UPDATE {run} SET {take} WHERE {free} RETURNING {columns}"
        # The claim, the re-read and the ledger read in one round trip (PostgreSQL).
        # As text (JSON), as the datetimes are integers: psycopg's loader of the json type is Python,
        # set up again for each cursor, and a task has no ledger to read.
        self._ledger_of_claimed = (
            f"(SELECT json_agg(json_build_array({s['step']}, {s['result']}, {s['attempts']}, {s['last_error']}))::text "
            f"FROM {step} WHERE {step}.{s['run']} = claimed.{r['id']})"
        )
        self._free = free
        # The claim of a drive's next run, riding on another write (PostgreSQL; elsewhere the lock is
        # taken by a read first): a row another transaction holds locked is not waited for.
        self._skipping = f"{r['id']} = (SELECT {r['id']} FROM {run} WHERE {free} FOR UPDATE SKIP LOCKED)"
        self.lock_if_free = f"SELECT {r['id']} FROM {run} WHERE {free} FOR UPDATE SKIP LOCKED"
        # Several plain claims in one statement (PostgreSQL): each run's id, the fence read with it and
        # its lease in seconds as arrays; each taken only if its fence is unchanged and its lease free,
        # a row another transaction holds locked passed over; each run's new fence its own plus one.
        lapsed = f"{run}.{r['lease_expires_at']}"
        self.claim_together = (
            f"WITH wanted AS (SELECT * FROM unnest(%s::varchar[], %s::bigint[], %s::float8[]) "
            f"AS w(wanted_id, wanted_fence, wanted_secs)), "
            f"locked AS (SELECT {run}.{r['id']} AS locked_id, wanted.wanted_secs AS locked_secs "
            f"FROM {run} JOIN wanted ON {run}.{r['id']} = wanted.wanted_id "
            f"AND {run}.{r['lease_fence']} = wanted.wanted_fence "
            f"WHERE ({lapsed} IS NULL OR {lapsed} <= {now}) "
            f"ORDER BY {run}.{r['id']} FOR UPDATE OF {run} SKIP LOCKED), "
            f"claimed AS (UPDATE {run} SET {r['lease_holder']} = %s, "
            f"{r['lease_expires_at']} = {expiry.replace('secs => %s', 'secs => locked.locked_secs')}, "
            f"{r['lease_fence']} = {run}.{r['lease_fence']} + 1 "
            f"FROM locked WHERE {run}.{r['id']} = locked.locked_id RETURNING {columns}) "
            f"SELECT {self.claimed_out}, {self._ledger_of_claimed} FROM claimed"
        )
        # A takeover: the lease lapsed with a holder recorded. The charge of the
        # silent pass (``transitions.charged``) is written by the same statement,
        # first: MySQL evaluates SET left to right, with the values already assigned.
        self._take = take
        self._lapsed = (
            f"{r['id']} = %s AND {r['lease_fence']} = %s "
            f"AND {r['lease_holder']} IS NOT NULL AND {r['lease_expires_at']} <= {now}"
        )
        self.read_run = f"SELECT {columns} FROM {run} WHERE {r['id']} = %s"
        # The due read (JobRunQuerySet.due().in_due_order(), JobRun.is_due): runs
        # in the order they became due (``due_at``), then by id; on every
        # database one range of the jobruns_due_at index over the runs in flight
        # (partial on PostgreSQL and SQLite: the status is spelled out, not a
        # parameter, so the planner can match the index's predicate). Higher
        # priority first (tasks of Django's Tasks framework; job runs are 0).
        since = r["due_at"]
        priority = r["priority"]
        self._due = (
            f"SELECT {', '.join(r[name] for name in DUE_FIELDS)}, {since} "
            f"FROM {run} WHERE {r['status']} = '{Status.RUNNING.value}' AND {r['paused_at']} IS NULL "
            f"AND ({r['next_attempt_at']} IS NULL OR {r['next_attempt_at']} <= {now}) "
            f"AND ({r['lease_expires_at']} IS NULL OR {r['lease_expires_at']} <= {now})"
        )
        self._order = f"ORDER BY {priority} DESC, {since}, {r['id']}"
        self._after = f"({priority} < %s OR ({priority} = %s AND ({since} > %s OR ({since} = %s AND {r['id']} > %s))))"
        self.due_first = self.due_selected(None, None)
        self.due_after = self.due_selected(None, None, after=True)
        self.ledger = (
            f"SELECT {s['step']}, {s['result']}, {s['attempts']}, {s['last_error']} FROM {step} WHERE {s['run']} = %s"
        )
        # -- fenced writes: each changes the run only while the fence is the claim's.
        self._fenced = f"{r['id']} = %s AND {r['lease_fence']} = %s"
        self.fence_holds = f"SELECT 1 FROM {run} WHERE {self._fenced}"
        self.heartbeat = f"UPDATE {run} SET {r['lease_expires_at']} = {expiry} WHERE {self._fenced}"
        # The keep-alive's renewal (D17): never of a lease given back meanwhile (its holder cleared).
        self.keep_alive = (
            f"UPDATE {run} SET {r['lease_expires_at']} = {expiry} "
            f"WHERE {self._fenced} AND {r['lease_holder']} IS NOT NULL"
        )
        self.keep_alive_returning = f"{self.keep_alive} RETURNING {r['paused_at']}"
        self.update_step = f"UPDATE {step} SET {step_set} WHERE {s['run']} = %s AND {s['step']} = %s"
        self.insert_step = f"INSERT INTO {step} ({step_columns}) VALUES (%s, %s, %s, %s, %s, %s)"
        self.drop_ledger = f"DELETE FROM {step} WHERE {s['run']} = %s"
        self.paused_at = f"SELECT {r['paused_at']} FROM {run} WHERE {r['id']} = %s"
        # PostgreSQL: the fence check, the heartbeat and the step's row in ONE statement.
        fenced_cte = (
            f"WITH fenced AS (UPDATE {run} SET {r['lease_expires_at']} = {expiry} WHERE {self._fenced} "
            f"RETURNING {r['id']})"
        )
        self.insert_step_fenced = (
            f"{fenced_cte} INSERT INTO {step} ({step_columns}) "
            f"SELECT {r['id']}, %s, %s, %s, %s, %s FROM fenced RETURNING 1"
        )
        self.update_step_fenced = (
            f"{fenced_cte} UPDATE {step} SET {step_set} FROM fenced WHERE {step}.{s['run']} = fenced.{r['id']} "
            f"AND {step}.{s['step']} = %s RETURNING 1"
        )
        self._drop_fenced = f"DELETE FROM {step} WHERE {s['run']} IN (SELECT {r['id']} FROM fenced)"

    # -- statements whose SET list is the transition's fields (cached: passes write the same few sets)

    def takeover(self, charge: dict[str, Any], *, returning: bool) -> str:
        """The claim of a lapsed lease that also writes ``charge`` (the silent pass's failed attempt)."""
        return self._cached(
            ("takeover", tuple(charge), returning),
            lambda: (
                f"UPDATE {self.run_table} SET {self.assignments(charge)}, {self._take} WHERE {self._lapsed}"
                + (f" RETURNING {self.columns}" if returning else "")
            ),
        )

    def update_fenced(self, fields: dict[str, Any], *, returning_pause: bool = False) -> str:
        """The UPDATE that writes ``fields`` if the run's fence is still the one given (its last two parameters)."""
        return self._cached(
            ("fenced", tuple(fields), returning_pause),
            lambda: (
                f"UPDATE {self.run_table} SET {self.assignments(fields)} WHERE {self._fenced}"
                + (f" RETURNING {self.run_columns['paused_at']}" if returning_pause else "")
            ),
        )

    # -- PostgreSQL's one-statement writes; ``riders`` are the texts of what rides with each
    # (``Rider.joined``), written as further CTEs that read the run as written from ``{run}``.

    def claim_riding(self, *, skip_locked: bool, riders: tuple[str, ...] = ()) -> str:
        """A plain claim returning the run and its ledger, with what rides on it (a task's attempt record begun)."""

        def build() -> str:
            where = self._skipping if skip_locked else self._free
            return (
                f"WITH claimed AS (UPDATE {self.run_table} SET {self._take} WHERE {where} RETURNING {self.columns})"
                f"{self._rides(riders, 'claimed')} SELECT {self.claimed_out}, {self._ledger_of_claimed} FROM claimed"
            )

        return self._cached(("claim", skip_locked, riders), build)

    def fenced_riding(self, fields: dict[str, Any], riders: tuple[str, ...]) -> str:
        """A fenced write of ``fields`` (a failed pass, a release) with what rides on it; a row if the fence held."""
        return self._cached(
            ("fenced riding", tuple(fields), riders),
            lambda: (
                f"WITH fenced AS (UPDATE {self.run_table} SET {self.assignments(fields)} WHERE {self._fenced} "
                f"RETURNING {self.run_columns['id']}){self._rides(riders, 'fenced')} SELECT 1 FROM fenced"
            ),
        )

    def commit_fenced(self, fields: dict[str, Any], *, drop_ledger: bool, riders: tuple[str, ...] = ()) -> str:
        """PostgreSQL's pass commit in one statement: the fenced UPDATE, the ledger dropped, the pause returned
        (as :func:`_epoch` sends it)."""
        return self._cached(
            ("commit", tuple(fields), drop_ledger, riders),
            lambda: (
                f"{self._commit_ctes(fields, drop_ledger)}{self._rides(riders, 'fenced')} "
                f"SELECT {_epoch(self.run_columns['paused_at'])} FROM fenced"
            ),
        )

    @staticmethod
    def _rides(riders: tuple[str, ...], written: str, first: int = 0) -> str:
        """Each rider as a CTE reading the run as written from the CTE ``written``."""
        return "".join(
            f", ride{first + index} AS ({text.replace('{run}', written)})" for index, text in enumerate(riders)
        )

    def _commit_ctes(self, fields: dict[str, Any], drop_ledger: bool) -> str:
        r = self.run_columns
        return (
            f"WITH fenced AS (UPDATE {self.run_table} SET {self.assignments(fields)} WHERE {self._fenced} "
            f"RETURNING {r['id']}, {r['paused_at']})" + (f", dropped AS ({self._drop_fenced})" if drop_ledger else "")
        )

    def commit_fenced_and_claim(
        self,
        fields: dict[str, Any],
        *,
        drop_ledger: bool,
        ending: tuple[str, ...] = (),
        beginning: tuple[str, ...] = (),
    ) -> str:
        """PostgreSQL's pass commit and the claim of the drive's next run, in one statement.

        The claim is made only if the commit's fence held, and passes over a
        row another transaction holds locked. ``ending`` rides on the commit (a
        task's attempt record ended), ``beginning`` on the claim (the next
        task's begun). One row: the pause as the commit left it, then the
        claimed run's fields (:attr:`claimed_out`) and ledger (NULLs if not claimed).
        """
        r = self.run_columns
        run = self.run_table

        def build() -> str:
            commit = self._commit_ctes(fields, drop_ledger) + self._rides(ending, "fenced")
            paused = _epoch(f"fenced.{r['paused_at']}")
            chosen = f"SELECT {r['id']} FROM {run} WHERE {self._free} AND EXISTS (SELECT 1 FROM fenced)"
            return (
                f"{commit}, claimed AS (UPDATE {run} SET {self._take} WHERE {r['id']} = "
                f"({chosen} FOR UPDATE SKIP LOCKED) RETURNING {self.columns})"
                f"{self._rides(beginning, 'claimed', len(ending))} "
                f"SELECT {paused}, {self.claimed_out}, {self._ledger_of_claimed} "
                "FROM fenced LEFT JOIN claimed ON TRUE"
            )

        return self._cached(("commit and claim", tuple(fields), drop_ledger, ending, beginning), build)

    def assignments(self, fields: dict[str, Any]) -> str:
        """``"col" = %s, …`` for these fields; an increment (``F(name) + 1``) is written as SQL, not a parameter."""
        return ", ".join(f"{self.run_columns[name]} = {self._value(name, value)}" for name, value in fields.items())

    def due_selected(self, jobs: int | None, queues: int | None, *, after: bool = False) -> str:
        """The due read, limited to ``jobs`` (module, job) pairs and ``queues`` task queues when given (D1).

        Job runs have no queue: a drive limited to some queues still reads them.
        """
        key = ("due", jobs, queues, after)
        text = self._cache.get(key)
        if text is None:
            r = self.run_columns
            parts = [self._due]
            if jobs is not None:
                pair = f"({r['module']} = %s AND {r['job']} = %s)"
                parts.append(f"AND ({' OR '.join([pair] * jobs)})")
            if queues is not None:
                parts.append(f"AND ({r['queue_name']} IS NULL OR {r['queue_name']} IN ({', '.join(['%s'] * queues)}))")
            if after:
                parts.append(f"AND {self._after}")
            parts.append(f"{self._order} LIMIT %s")
            text = self._cache[key] = " ".join(parts)
        return text

    def parameters(self, fields: dict[str, Any]) -> list[Any]:
        """The parameters of :meth:`assignments`: the values, datetimes adapted, expiries as the clock sets them."""
        params: list[Any] = []
        for value in fields.values():
            if isinstance(value, Expiry):
                params += self.clock.expiry_params(value, self.adapt)
            elif isinstance(value, datetime):
                params.append(self.adapt(value))
            elif not hasattr(value, "resolve_expression"):
                params.append(value)
        return params

    def now_params(self, now: datetime | None) -> list[Any]:
        return self.clock.now_params(now, self.adapt)

    def expiry_params(self, now: datetime | None, ttl: timedelta) -> list[Any]:
        return self.clock.expiry_params(Expiry(now, ttl), self.adapt)

    def _value(self, name: str, value: Any) -> str:
        if isinstance(value, Expiry):
            return self.clock.expiry
        if not hasattr(value, "resolve_expression"):
            return "%s"
        if (
            isinstance(value, CombinedExpression)
            and value.connector == "+"
            and isinstance(value.lhs, F)
            and getattr(value.lhs, "name", None) == name
            and isinstance(value.rhs, Value)
            and type(value.rhs.value) is int
        ):
            return f"{self.run_columns[name]} + {value.rhs.value}"
        raise TypeError(f"the store writes values and increments of a column by itself, not {value!r}")

    def _cached(self, key: tuple[Any, ...], build: Any) -> str:
        text = self._cache.get(key)
        if text is None:
            text = self._cache[key] = build()
        return text
