"""PostgreSQL: every fenced write ONE statement; a plain claim returns the step ledger with the run."""

from __future__ import annotations

import contextlib
import functools
from datetime import datetime
from typing import Any

from django.db import transaction

from .base import ClaimedRow, ClaimRider, Committed, PlainClaim, Riders, StepWrite, Store
from .statements import RUN_FIELDS, PostgresClockSQL


@functools.cache
def _server_binding() -> Any:
    """How to make a cursor with server-side parameters on a Django connection (``None`` on psycopg2)."""
    from django.db.backends.postgresql import psycopg_any

    if not psycopg_any.is_psycopg3:
        return None
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID, ServerBindingCursor
    from psycopg.pq import Format

    cursor_class: Any = ServerBindingCursor

    def make(wrapper: Any, raw: Any) -> Any:
        cursor = cursor_class(raw)
        # As Django's own cursors: the connection's time zone where it differs from the loader's.
        if wrapper.timezone != raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT).timezone:
            psycopg_any.register_tzloader(wrapper.timezone, cursor)
        return cursor

    return make


class PostgresStore(Store):
    """PostgreSQL: data-modifying CTEs carry the fence check, the heartbeat and the write in one statement."""

    returning = True
    locks_rows = True
    clock_sql = PostgresClockSQL()

    def cursor(self) -> Any:
        """Django's cursor with server-side parameters, so psycopg prepares the engine's statements.

        A statement run a few times on a connection (psycopg's
        ``prepare_threshold``, five) is prepared there: the server parses and
        plans it once per connection, not on every pass, whatever binding the
        project chose for its own queries (Django's default is client-side).
        Not where preparing is off (``"prepare_threshold": None``, Django's
        default, for a pooler in transaction mode), nor on psycopg2, nor while
        Django records the queries (``DEBUG``, a test's
        ``CaptureQueriesContext``): the record then shows each statement with
        its values, as Django's own cursor sends it.
        """
        wrapper = self.connection
        wrapper.close_if_health_check_failed()
        wrapper.ensure_connection()
        raw = wrapper.connection
        make = _server_binding()
        if make is None or getattr(raw, "prepare_threshold", None) is None or wrapper.queries_logged:
            return wrapper.cursor()
        with wrapper.wrap_database_errors:
            return wrapper._prepare_cursor(make(wrapper, raw))

    def claim_on(
        self, cur: Any, claim: PlainClaim, also: Riders | None = None, *, skip_locked: bool = False
    ) -> ClaimedRow | None:
        st = self.statements
        text = st.claim_with_ledger_skipping if skip_locked else st.claim_with_ledger
        cur.execute(text, self._claim_params(claim.row, claim.fence, claim.holder, claim.expires, None))
        found = cur.fetchone()
        if found is None:
            return None
        self._ride(cur, also)
        return self._claimed_with_ledger(found, claim.now)

    def _claimed_with_ledger(self, found: tuple[Any, ...], now: datetime) -> ClaimedRow:
        """The run's fields as a claim returned them, then its ledger as JSON."""
        steps = found[len(RUN_FIELDS)]
        ledger = [tuple(entry) for entry in steps] if steps else []
        return self._claimed(found[: len(RUN_FIELDS)], now, ledger)

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
        st = self.statements
        if also and len(also) == 1 and isinstance(also[0], ClaimRider) and not also[0].has_riders:
            rider, also = also[0], None
            claim = rider.arguments()
            if claim is not None:
                return self._commit_and_claim(run_id, fence, fields, drop_ledger, rider, claim)
        with self._together(also), self.cursor() as cur:
            cur.execute(st.commit_fenced(fields, drop_ledger=drop_ledger), [*st.parameters(fields), run_id, fence])
            row = cur.fetchone()
            if row is not None:
                self._ride(cur, also)
        return None if row is None else Committed(row[0])

    def _commit_and_claim(
        self, run_id: str, fence: int, fields: dict[str, Any], drop_ledger: bool, rider: ClaimRider, claim: PlainClaim
    ) -> Committed | None:
        """The pass's commit and the claim of the drive's next run in one statement (one round trip, one commit)."""
        st = self.statements
        took = self._claim_params(claim.row, claim.fence, claim.holder, claim.expires, None)
        with self._savepoint_if_nested(), self.cursor() as cur:
            cur.execute(
                st.commit_fenced_and_claim(fields, drop_ledger=drop_ledger),
                [*st.parameters(fields), run_id, fence, *took],
            )
            found = cur.fetchone()
        if found is None:
            return None  # the fence did not hold: nothing written, nothing claimed
        if found[1] is not None:
            rider.took(self._claimed_with_ledger(found[1:], claim.now))
        return Committed(found[0])

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

    def _savepoint_if_nested(self) -> Any:
        """A savepoint around a one-statement write made inside the caller's transaction.

        Outside any transaction the statement is its own and needs none. Inside
        one (a test case, a caller's ``atomic``), a failed statement would
        otherwise abort the caller's whole transaction.
        """
        if self.connection.in_atomic_block:
            return transaction.atomic(using=self.alias)
        return contextlib.nullcontext()
