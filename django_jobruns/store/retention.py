"""Retention's batches on the store: finished runs deleted with their records, a bounded batch at a time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, transaction

from ..models import JobAttempt, JobRun, JobStep


class Retention:
    """The portable prune batch (a read and four statements in one transaction); PostgreSQL's is one statement."""

    alias: str

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    def prune_names(self) -> dict[str, str]:
        """The quoted tables and columns a prune batch names."""
        q = self.connection.ops.quote_name
        return {
            "run": q(JobRun._meta.db_table),
            "step": q(JobStep._meta.db_table),
            "attempt": q(JobAttempt._meta.db_table),
            "link": q(JobRun._meta.get_field("restarted_from").column),
            "step_run": q(JobStep._meta.get_field("run").column),
            "attempt_run": q(JobAttempt._meta.get_field("run").column),
            "id": q("id"),
            "status": q("status"),
            "ended_at": q("ended_at"),
        }

    def prune_batch(self, statuses: list[str], cutoff: datetime, size: int) -> tuple[int, int]:
        """Delete up to ``size`` runs of ``statuses`` ended before ``cutoff``: (how many were taken, deleted).

        One transaction: the batch's ids read through the (status, ended_at)
        index, the lineage links to them cleared, their step and attempt
        records and the runs deleted. A run whose status changed since the
        read (none can: only finished runs qualify) is not deleted.
        """
        ids = list(
            JobRun.objects.using(self.alias)
            .filter(status__in=statuses, ended_at__lt=cutoff)
            .values_list("id", flat=True)[:size]
        )
        if not ids:
            return 0, 0
        n = self.prune_names()
        marks, among = ", ".join(["%s"] * len(ids)), ", ".join(["%s"] * len(statuses))
        with transaction.atomic(using=self.alias), self.connection.cursor() as cur:
            cur.execute(f"UPDATE {n['run']} SET {n['link']} = NULL WHERE {n['link']} IN ({marks})", ids)
            cur.execute(f"DELETE FROM {n['step']} WHERE {n['step_run']} IN ({marks})", ids)
            cur.execute(f"DELETE FROM {n['attempt']} WHERE {n['attempt_run']} IN ({marks})", ids)
            cur.execute(
                f"DELETE FROM {n['run']} WHERE {n['id']} IN ({marks}) AND {n['status']} IN ({among})", [*ids, *statuses]
            )
            return len(ids), int(cur.rowcount)
