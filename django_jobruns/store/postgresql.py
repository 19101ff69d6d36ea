"""PostgreSQL: every fenced write ONE statement; a plain claim returns the step ledger with the run."""

from __future__ import annotations

import contextlib
import functools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction

from .base import ClaimedRow, ClaimRider, Committed, PlainClaim, Rider, Riders, StepWrite, Store
from .rows import joinable
from .statements import DATETIME_PLACES, RUN_FIELDS, PostgresClockSQL

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _from_epoch(micros: int | None, zone: Any) -> datetime | None:
    """A datetime a statement sent as microseconds since the epoch, as the ORM reads it (in the connection's zone)."""
    if micros is None:
        return None
    at = _EPOCH + timedelta(microseconds=micros)
    return at if zone is None or zone is UTC else at.astimezone(zone)


#: psycopg's own default: a statement is prepared on a connection once it has run this many times there.
PREPARE_THRESHOLD = 5


@functools.cache
def _server_binding() -> Any:
    """How to make a cursor with server-side parameters on a Django connection (``None`` on psycopg2).

    ``make(wrapper, raw, engine_only)``: with ``engine_only``, the cursor
    prepares what it runs at :data:`PREPARE_THRESHOLD` while the connection's
    threshold stays as the project left it (``None``), so the engine's
    statements are prepared and the project's never are.
    """
    from django.db.backends.postgresql import psycopg_any

    if not psycopg_any.is_psycopg3:
        return None
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, ServerBindingCursor
    from psycopg import OperationalError
    from psycopg.errors import DuplicatePreparedStatement, InvalidSqlStatementName
    from psycopg.pq import Format

    cursor_class: Any = ServerBindingCursor

    class EnginePreparing(cursor_class):  # type: ignore[misc]
        """Prepares the statements it runs at :data:`PREPARE_THRESHOLD`, whatever the connection's threshold."""

        def execute(self, *args: Any, **kwargs: Any) -> Any:
            conn = self.connection
            kept, conn.prepare_threshold = conn.prepare_threshold, PREPARE_THRESHOLD
            try:
                return super().execute(*args, **kwargs)
            except (InvalidSqlStatementName, DuplicatePreparedStatement) as exc:
                # The server session is not the one psycopg prepared in: a pooler the connect did
                # not show. Nothing more is prepared on this connection, and the statement's failure
                # is the connection's (not charged to the job, as a lost connection is not).
                conn._jobruns_direct = False
                raise OperationalError(
                    f"{exc} (a pooler between: the engine's statements are no longer prepared)"
                ) from exc
            finally:
                conn.prepare_threshold = kept

    def make(wrapper: Any, raw: Any, engine_only: bool) -> Any:
        cursor = (EnginePreparing if engine_only else cursor_class)(raw)
        # As Django's own cursors: the connection's time zone where it differs from the loader's.
        if wrapper.timezone != raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT).timezone:
            psycopg_any.register_tzloader(wrapper.timezone, cursor)
        return cursor

    return make


def reaches_the_server_directly(wrapper: Any) -> bool:
    """Whether this connection is a server session of its own (no pooler between), asked once per connection.

    A pooler (PgBouncer, pgcat, Odyssey, RDS Proxy...) gives its clients a
    process id of its own at connect, since the server sessions behind it
    change from one transaction to the next; so the id psycopg was given
    and the one the server reports differ. A prepared statement lives in
    one server session: only where they are the same is it found again.
    """
    raw = wrapper.connection
    known = getattr(raw, "_jobruns_direct", None)
    if known is None:
        with wrapper.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            (server_pid,) = cur.fetchone()
        known = raw._jobruns_direct = server_pid == raw.info.backend_pid
    return bool(known)


class PostgresStore(Store):
    """PostgreSQL: data-modifying CTEs carry the fence check, the heartbeat and the write in one statement."""

    returning = True
    locks_rows = True
    clock_sql = PostgresClockSQL()

    def cursor(self) -> Any:
        """Django's cursor with server-side parameters, so psycopg prepares the engine's statements.

        A statement run a few times on a connection (psycopg's threshold,
        five) is prepared there: the server parses and plans it once per
        connection, not on every pass, whatever binding the project chose
        for its own queries (Django's default is client-side).

        - Where the project set ``"prepare_threshold"`` in ``OPTIONS``, as it
          says: a number prepares at that threshold; ``None`` prepares
          nothing (a pooler in transaction mode).
        - Where it is unset (Django's default: nothing prepared, so that a
          pooler keeps working), the engine's own statements are prepared on
          a connection that reaches PostgreSQL directly
          (:func:`reaches_the_server_directly`), and on none behind a pooler.
          The project's queries are not prepared either way.
        - Never on psycopg2, nor while Django records the queries
          (``DEBUG``, a test's ``CaptureQueriesContext``): the record then
          shows each statement with its values, as Django's own cursor sends it.
        """
        wrapper = self.connection
        wrapper.close_if_health_check_failed()
        wrapper.ensure_connection()
        make = _server_binding()
        if make is None or wrapper.queries_logged:
            return wrapper.cursor()
        raw = wrapper.connection
        engine_only = False
        if getattr(raw, "prepare_threshold", None) is None:
            if "prepare_threshold" in wrapper.settings_dict["OPTIONS"] or not reaches_the_server_directly(wrapper):
                return wrapper.cursor()
            engine_only = True
        with wrapper.wrap_database_errors:
            return wrapper._prepare_cursor(make(wrapper, raw, engine_only))

    def claim_on(
        self, cur: Any, claim: PlainClaim, also: Riders | None = None, *, skip_locked: bool = False
    ) -> ClaimedRow | None:
        texts, extra = self._joins(also)
        params = self._claim_params(claim.row, claim.fence, claim.holder, claim.expires, None)
        cur.execute(self.statements.claim_riding(skip_locked=skip_locked, riders=texts), [*params, *extra])
        found = cur.fetchone()
        if found is None:
            return None
        if not texts:
            self._ride(cur, also)
        return self._claimed_with_ledger(found, claim.now)

    def claim_together(self, claims: list[tuple[PlainClaim, Riders]]) -> list[ClaimedRow | None]:
        """The claims in one statement; what rides with each claim that held, in its transaction."""
        st = self.statements
        first = claims[0][0]
        at = st.now_params(first.expires.now)  # the lease's "now": the claims' one (``lease_now``)
        params = [
            [plain.row.id for plain, _ in claims],
            [plain.row.fence for plain, _ in claims],
            [plain.expires.ttl.total_seconds() for plain, _ in claims],
            *at,
            first.holder,
            *at,
        ]
        riders = any(also for _, also in claims)
        together = transaction.atomic(using=self.alias) if riders else contextlib.nullcontext()
        with together, self.cursor() as cur:
            cur.execute(st.claim_together, params)
            found = {row[0]: row for row in cur.fetchall()}
            taken: list[ClaimedRow | None] = []
            for plain, also in claims:
                row = found.get(plain.row.id)
                if row is not None:
                    self._ride(cur, also)
                taken.append(None if row is None else self._claimed_with_ledger(row, plain.now))
            return taken

    def _claimed_with_ledger(self, found: tuple[Any, ...], now: datetime) -> ClaimedRow:
        """The run's fields as a claim returned them (``Statements.claimed_out``), then its ledger as JSON text."""
        steps = found[len(RUN_FIELDS)]
        ledger = [tuple(entry) for entry in json.loads(steps)] if steps else []
        values = list(found[: len(RUN_FIELDS)])
        zone = self.connection.timezone
        for index in DATETIME_PLACES:
            values[index] = _from_epoch(values[index], zone)
        return self._claimed(values, now, ledger)

    def record_step(self, write: StepWrite) -> tuple[bool, bool]:
        st, at = self.statements, self.adapt
        head = [*st.expiry_params(write.expires.now, write.expires.ttl), write.run_id, write.fence]
        with self._savepoint_if_nested(), self.cursor() as cur:
            if write.exists:
                cur.execute(
                    st.update_step_fenced, [*head, write.result, write.attempts, write.error, at(write.at), write.step]
                )
            else:
                cur.execute(
                    st.insert_step_fenced, [*head, write.step, write.result, write.attempts, write.error, at(write.at)]
                )
            return cur.fetchone() is not None, True

    def commit_pass(
        self,
        run_id: str,
        fence: int,
        fields: dict[str, Any],
        *,
        drop_ledger: bool,
        read_back: bool = False,
        also: Riders | None = None,
    ) -> Committed | None:
        """The commit in one statement, with what rides on it where each can be written within it.

        What rides on a pass's commit: a task's attempt record ended, and the
        claim of the drive's next run with what its job writes with a claim.
        """
        ending = [rider for rider in also or () if isinstance(rider, Rider)]
        following = [rider for rider in also or () if isinstance(rider, ClaimRider)]
        if joinable(ending) and len(following) == 1:
            claim = following[0].arguments()
            if claim is None:
                also = ending  # the drive is stopping: no next run is claimed
            else:
                beginning = following[0].riding(claim)
                if joinable(beginning):
                    return self._commit_and_claim(
                        run_id, fence, fields, drop_ledger, (ending, following[0], claim, beginning)
                    )
        st = self.statements
        texts, extra = self._joins(also)
        with self._together(None if texts else also), self.cursor() as cur:
            cur.execute(
                st.commit_fenced(fields, drop_ledger=drop_ledger, riders=texts),
                [*st.parameters(fields), run_id, fence, *extra],
            )
            row = cur.fetchone()
            if row is not None and not texts:
                self._ride(cur, also)
        return None if row is None else Committed(_from_epoch(row[0], self.connection.timezone))

    def _commit_and_claim(
        self,
        run_id: str,
        fence: int,
        fields: dict[str, Any],
        drop_ledger: bool,
        riding: tuple[Riders, ClaimRider, PlainClaim, Riders],
    ) -> Committed | None:
        """The pass's commit and the claim of the drive's next run in one statement (one round trip, one commit).

        ``riding``: what rides on the commit, the claim's rider, its claim, and what rides on the claim.
        """
        st = self.statements
        ending, rider, claim, beginning = riding
        (ends, end_params), (begins, begin_params) = self._joins(ending), self._joins(beginning)
        took = self._claim_params(claim.row, claim.fence, claim.holder, claim.expires, None)
        with self._savepoint_if_nested(), self.cursor() as cur:
            cur.execute(
                st.commit_fenced_and_claim(fields, drop_ledger=drop_ledger, ending=ends, beginning=begins),
                [*st.parameters(fields), run_id, fence, *end_params, *took, *begin_params],
            )
            found = cur.fetchone()
        if found is None:
            return None  # the fence did not hold: nothing written, nothing claimed
        if found[1] is not None:
            rider.took(self._claimed_with_ledger(found[1:], claim.now))
        return Committed(_from_epoch(found[0], self.connection.timezone))

    def write_fenced(self, run_id: str, fence: int, fields: dict[str, Any], also: Riders | None = None) -> bool:
        st = self.statements
        texts, extra = self._joins(also)
        text = st.fenced_riding(fields, texts) if texts else st.update_fenced(fields)
        with self._together(None if texts else also), self.cursor() as cur:
            cur.execute(text, [*st.parameters(fields), run_id, fence, *extra])
            held = bool(cur.rowcount == 1)
            if held and not texts:
                self._ride(cur, also)
            return held

    def prune_batch(self, statuses: list[str], cutoff: datetime, size: int) -> tuple[int, int]:
        """The batch in ONE statement (data-modifying CTEs): the ids never travel to Python and back."""
        n = self.prune_names()
        batch = (
            f"WITH batch AS (SELECT {n['id']} FROM {n['run']} WHERE {n['status']} = ANY(%s) AND {n['ended_at']} < %s "
            f"LIMIT %s), "
            f"unlinked AS (UPDATE {n['run']} SET {n['link']} = NULL WHERE {n['link']} IN (SELECT {n['id']} FROM batch) "
            f"AND {n['id']} NOT IN (SELECT {n['id']} FROM batch)), "
            f"steps AS (DELETE FROM {n['step']} WHERE {n['step_run']} IN (SELECT {n['id']} FROM batch)), "
            f"attempts AS (DELETE FROM {n['attempt']} WHERE {n['attempt_run']} IN (SELECT {n['id']} FROM batch)) "
            f"DELETE FROM {n['run']} WHERE {n['id']} IN (SELECT {n['id']} FROM batch)"
        )
        with self.cursor() as cur:
            cur.execute(batch, [statuses, self.adapt(cutoff), size])
            count = int(cur.rowcount)
        return count, count

    def _together(self, also: Riders | None) -> Any:
        """A write and its riders in one transaction; a lone statement in the caller's gets a savepoint."""
        return transaction.atomic(using=self.alias) if also else self._savepoint_if_nested()

    def _joined(self, also: Riders | None) -> bool:
        return bool(also) and joinable(also or [])

    @staticmethod
    def _joins(also: Riders | None) -> tuple[tuple[str, ...], list[Any]]:
        """The texts of riders written within a fenced write's statement, and their parameters in order.

        None (``()``) where there are no riders or one of them cannot be so written: then each is
        written after the fenced write, in its transaction.
        """
        if not also or not joinable(also):
            return (), []
        joined = [rider.joined for rider in also]
        return tuple(text for text, _ in joined), [value for _, params in joined for value in params]

    def _savepoint_if_nested(self) -> Any:
        """A savepoint around a one-statement write made inside the caller's transaction.

        Outside any transaction the statement is its own and needs none. Inside
        one (a test case, a caller's ``atomic``), a failed statement would
        otherwise abort the caller's whole transaction.
        """
        if self.connection.in_atomic_block:
            return transaction.atomic(using=self.alias)
        return contextlib.nullcontext()
