"""The changelist's machinery: page numbers from estimates at millions of runs, and its filters."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404
from django.utils.functional import cached_property

from ..models import JobRun, Status
from ..queue_safety import unstorable
from ..records import STATES, in_state
from ..registry import registered_jobs
from ..store import estimates


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Page a large list by the database's row estimate instead of counting it (``store.estimates``).

    Lists estimated to be small and databases without estimates (SQLite) are
    counted exactly. A searched list (a text search's estimate can be far off)
    is counted exactly up to :attr:`COUNT_SEARCH_UP_TO` runs, on every database:
    a word most runs hold would otherwise read the whole table on each view
    (ten million rows, seconds). Past it the list says "more than" and its pages
    stop there.
    """

    ESTIMATE_ABOVE = 10_000
    #: A searched list is counted up to this many runs.
    COUNT_SEARCH_UP_TO = 10_000
    #: Whether the searched list matched more runs than are counted (``count`` is the bound).
    capped = False
    #: Whether ``count`` is the planner's estimate (the changelist says so).
    estimated = False
    #: Whether a filtered list may be numbered by its estimate (not a searched one).
    estimate_filtered = True
    #: Whether to read the first page before counting (a search shown from its first page).
    read_first_page = False
    #: The first page's rows, when reading them showed that they are all there is.
    first_page_rows: list[Any] | None = None

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return int(super().count)
        if self.read_first_page:
            # A search for something rare reads the whole table, or its index,
            # to find the few runs it matches -- once for the count and once
            # more for the page. Read the page first: when it is not full, it
            # is the count too. When it is, the count follows (and the scan
            # that filled a page was short).
            first = list(queryset[: self.per_page + 1])
            if len(first) <= self.per_page:
                self.first_page_rows = first
                return len(first)
        if not self.estimate_filtered:
            bounded = queryset.order_by()
            if connections[queryset.db].vendor == "postgresql":
                # Newest first: a prune deletes the oldest runs, and until a vacuum their dead rows
                # lead the table. Read in no order, a word many runs hold was counted by reading
                # through them first (1.5 s on the first view after a prune at ten million runs).
                bounded = queryset.order_by("-pk")
            found = bounded[: self.COUNT_SEARCH_UP_TO + 1].count()
            self.capped = found > self.COUNT_SEARCH_UP_TO
            return min(found, self.COUNT_SEARCH_UP_TO)
        if connections[queryset.db].vendor not in estimates.ESTIMATING:
            return int(super().count)
        if queryset.query.where:
            if self.estimate_filtered:
                rows = estimates.planned_rows(queryset.order_by())
                if rows is not None and rows > self.ESTIMATE_ABOVE:
                    self.estimated = True
                    return rows
            return int(super().count)
        total = estimates.whole_table(queryset, self.ESTIMATE_ABOVE)
        if total is None:
            return int(super().count)
        self.estimated = total > self.ESTIMATE_ABOVE
        return total


_M = TypeVar("_M", bound=Model)


class HeldLookups:
    """An id or a filter's value no database holds (a NUL: PostgreSQL refuses it in any text, with a
    ``DataError``) is one nothing matches: the object is not found, the filter an incorrect lookup
    (``?e=1``), as Django's admin reads what it cannot look up. Not a server error on one database."""

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        admin_class: Any = super()  # a mixin of a ModelAdmin
        return None if unstorable(object_id) else admin_class.get_object(request, object_id, from_field)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        if any(unstorable(value) for _, values in request.GET.lists() for value in values):
            raise IncorrectLookupParameters("a filter's value holds what no database stores")
        admin_class: Any = super()
        return admin_class.get_changelist_instance(request)


def held_or_404(queryset: QuerySet[_M], object_id: str) -> _M:
    """``get_object_or_404`` for an id from the URL, which may hold what no database stores."""
    if unstorable(object_id):
        raise Http404(f"No {queryset.model._meta.object_name} matches the given query.")
    return get_object_or_404(queryset, pk=object_id)


class JobRunChangeList(ChangeList):
    """The changelist, showing a search's first page from the rows its count already read."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = getattr(self.paginator, "first_page_rows", None)
        if rows is not None and not self.multi_page:
            self.result_list = rows


class JobFilter(admin.SimpleListFilter):
    """Filter by job, from the registry: no query, whatever the table's size."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        known = [(entry.label, entry.label) for entry in registered_jobs()]
        # And the jobs of runs in flight that no job here is registered for, marked so by the
        # drive that stepped over them: found in the index of the warned runs (jobruns_warned),
        # not by reading the runs in flight.
        labels = {label for label, _ in known}
        strays = JobRun.objects.marked_unregistered().filter(status=Status.RUNNING).values_list("module", "job")
        strays = strays.distinct()
        extra = sorted({f"{module}.{job}" for module, job in strays} - labels)
        return known + [(label, f"{label} (not registered)") for label in extra]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        if not value:
            return queryset
        module, _, name = value.partition(".")
        return queryset.filter(module=module, job=name)


class QueueFilter(admin.SimpleListFilter):
    """A task run's queue (Django's Tasks framework), from the TASKS setting: no query."""

    title = "task queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from django.conf import settings

        names: set[str] = set()
        for params in (getattr(settings, "TASKS", None) or {}).values():
            if params.get("BACKEND") == "django_jobruns.backend.JobRunsBackend":
                names.update(params.get("QUEUES") or ["default"])
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        return queryset.filter(queue_name=value) if value else queryset


class PriorityFilter(admin.SimpleListFilter):
    """A task run's priority, as Django's Tasks framework ranges it (-100..100; job runs 0)."""

    title = "priority"
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("high", "above 0"), ("normal", "0"), ("low", "below 0")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        if value == "high":
            return queryset.filter(priority__gt=0)
        if value == "normal":
            return queryset.filter(priority=0)
        if value == "low":
            return queryset.filter(priority__lt=0)
        return queryset


class StateFilter(admin.SimpleListFilter):
    """What an operator looks for at 3 a.m.: runs backing off, leased, with a lapsed lease, paused, orphaned."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(STATES.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        result: QuerySet[JobRun] = in_state(queryset, value) if value in STATES else queryset
        return result
