"""The Django admin for job runs: read, filter, and restart or resume failed runs.

Runs are never edited by hand: every field is read-only, and the only ways to
act on a run are the restart and resume buttons (and bulk actions) on failed
runs, which start a NEW run through ``restart_job_run``.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil
from django.views.decorators.http import require_POST
from rangefilter.filters import DateRangeFilterBuilder

from . import search
from .exceptions import JobRunsError
from .models import JobRun, JobStep, Status
from .registry import registered_jobs
from .starts import restart_job_run
from .steering import cancel_job_run, pause_job_run, retry_job_run_now, unpause_job_run

RESTART_PERMISSION = "django_jobruns.restart_jobrun"
_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
STEER_PERMISSION = "django_jobruns.steer_jobrun"

#: The steering verbs: (label of the button, past tense for the message, function).
STEERING: dict[str, tuple[str, str, Any]] = {
    "cancel": ("Cancel", "Cancelled", cancel_job_run),
    "pause": ("Pause", "Paused", pause_job_run),
    "unpause": ("Unpause", "Unpaused", unpause_job_run),
    "retry_now": ("Retry now", "Made due now", retry_job_run_now),
}


def steering_verbs(run: JobRun, now: Any) -> list[str]:
    """The verbs that apply to ``run`` as it is: what its buttons offer."""
    if run.status != Status.RUNNING:
        return []
    verbs = ["unpause" if run.paused_at is not None else "pause", "cancel"]
    if run.next_attempt_at is not None and run.next_attempt_at > now:
        verbs.insert(0, "retry_now")
    return verbs


# Generic for the type checker only: Django's admin classes are not subscriptable at run time.
if TYPE_CHECKING:
    _InlineBase = admin.TabularInline[JobStep, JobRun]
    _AdminBase = admin.ModelAdmin[JobRun]
else:
    _InlineBase = admin.TabularInline
    _AdminBase = admin.ModelAdmin


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Page a large list by the database's row estimate instead of counting it.

    An exact COUNT(*) reads every row it counts, on every page view: the whole
    table unfiltered, a quarter of it for "status = failed". The planner's
    estimate costs next to nothing and is close enough to number pages:

    - PostgreSQL: the table's ``reltuples`` (kept by ANALYZE and autovacuum)
      for the whole table; the plan's row estimate, from the columns'
      statistics, for a filtered list;
    - MariaDB/MySQL: InnoDB's ``TABLE_ROWS`` for the whole table; the rows
      ``EXPLAIN`` expects the query to read (its index dives) for a filtered list.

    Lists estimated to be small, searched lists (a text search's estimate can
    be far off) and SQLite are counted exactly.
    """

    ESTIMATE_ABOVE = 10_000
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
        vendor = connections[queryset.db].vendor
        if vendor not in ("postgresql", "mysql"):
            return int(super().count)
        if queryset.query.where:
            if self.estimate_filtered:
                rows = self._plan_rows(queryset.order_by(), vendor)
                if rows > self.ESTIMATE_ABOVE:
                    self.estimated = True
                    return rows
            return int(super().count)
        wrapper = connections[queryset.db]
        table = wrapper.ops.quote_name(queryset.model._meta.db_table)
        # One query either way: the exact count runs only when the estimate is
        # small (the branch not taken is not evaluated).
        if vendor == "postgresql":
            sql = (
                f"SELECT CASE WHEN reltuples > %s THEN reltuples::bigint "
                f"ELSE (SELECT COUNT(*) FROM {table}) END FROM pg_class WHERE oid = %s::regclass"
            )
            params: list[Any] = [self.ESTIMATE_ABOVE, table]
        else:
            sql = (
                f"SELECT CASE WHEN estimate.n > %s THEN estimate.n ELSE (SELECT COUNT(*) FROM {table}) END "
                "FROM (SELECT TABLE_ROWS AS n FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s) AS estimate"
            )
            params = [self.ESTIMATE_ABOVE, queryset.model._meta.db_table]
        with wrapper.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        if row is None or row[0] is None:
            return int(super().count)
        self.estimated = int(row[0]) > self.ESTIMATE_ABOVE
        return int(row[0])

    @staticmethod
    def _plan_rows(queryset: QuerySet[Any], vendor: str) -> int:
        """The rows the planner expects ``queryset`` to return (PostgreSQL) or read (MariaDB/MySQL)."""
        if vendor == "postgresql":
            plan = json.loads(queryset.explain(format="json"))
            return int(plan[0]["Plan"]["Plan Rows"])
        sql, params = queryset.values("pk").query.sql_with_params()
        with connections[queryset.db].cursor() as cur:
            cur.execute(f"EXPLAIN {sql}", params)
            names = [column[0].lower() for column in cur.description]
            row = cur.fetchone()
        return int(row[names.index("rows")] or 0) if row is not None else 0


class JobRunChangeList(ChangeList):
    """The changelist, showing a search's first page from the rows its count already read."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = getattr(self.paginator, "first_page_rows", None)
        if rows is not None and not self.multi_page:
            self.result_list = rows


#: Characters of one stored value the change view shows at most; a note says what was cut.
SHOW_MAX = 20_000


def _bounded(text: str) -> tuple[str, str]:
    """``text`` cut to :data:`SHOW_MAX` characters, and the note saying so (empty if nothing was cut)."""
    if len(text) <= SHOW_MAX:
        return text, ""
    return text[:SHOW_MAX], f"… {len(text) - SHOW_MAX} more characters not shown"


def _pretty(text: str | None, *, empty: str = "—") -> SafeString:
    """Pretty-print stored JSON, or show the raw text beside why it does not parse; bounded either way."""
    if text is None:
        return format_html('<span class="jobruns-empty">{}</span>', empty)
    try:
        pretty = json.dumps(json.loads(text), indent=2, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raw, cut = _bounded(text)
        return format_html(
            '<p class="errornote jobruns-decode-error">Cannot decode: {}</p><pre class="jobruns-raw">{}</pre>{}',
            why,
            raw,
            format_html('<p class="jobruns-cut">{}</p>', cut) if cut else "",
        )
    shown, cut = _bounded(pretty)
    return format_html(
        '<pre class="jobruns-json">{}</pre>{}', shown, format_html('<p class="jobruns-cut">{}</p>', cut) if cut else ""
    )


def _progress(counters_text: str) -> SafeString | str:
    try:
        counters = json.loads(counters_text)
    except (TypeError, ValueError, RecursionError):
        return format_html('<span class="jobruns-decode-error">{}</span>', "unreadable counters")
    if not isinstance(counters, dict) or not counters:
        return "—"
    total = counters.get("total")
    done = next((counters[k] for k in ("imported", "done", "processed", "count") if k in counters), None)
    if isinstance(total, (int, float)) and total > 0 and isinstance(done, (int, float)):
        share = max(0.0, min(1.0, done / total))
        return format_html(
            '<progress class="jobruns-progress" value="{}" max="{}" title="{} of {}"></progress> {}%',
            done,
            total,
            done,
            total,
            round(share * 100),
        )
    text = ", ".join(f"{key}={value!s:.50}" for key, value in sorted(counters.items())[:20])
    return text if len(counters) <= 20 else f"{text}, … ({len(counters) - 20} more)"


class JobFilter(admin.SimpleListFilter):
    """Filter by job, from the registry: no query, whatever the table's size."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(entry.label, entry.label) for entry in registered_jobs()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        value = self.value()
        if not value:
            return queryset
        module, _, name = value.partition(".")
        return queryset.filter(module=module, job=name)


class StateFilter(admin.SimpleListFilter):
    """What an operator looks for at 3 a.m.: runs backing off, leased, with a lapsed lease, paused, orphaned."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("backoff", "in backoff"),
            ("leased", "leased"),
            ("lapsed", "lease lapsed"),
            ("paused", "paused"),
            ("unregistered", "job not registered here"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        now = timezone.now()
        running = queryset.filter(status=Status.RUNNING)
        value = self.value()
        if value == "backoff":
            return running.filter(next_attempt_at__gt=now)
        if value == "leased":
            return running.filter(lease_holder__isnull=False, lease_expires_at__gt=now)
        if value == "lapsed":
            return running.filter(lease_holder__isnull=False, lease_expires_at__lte=now)
        if value == "paused":
            return running.filter(paused_at__isnull=False)
        if value == "unregistered":
            known = Q()
            for entry in registered_jobs():
                known |= Q(module=entry.module, job=entry.name)
            return running.exclude(known) if known else running
        return queryset


class JobStepInline(_InlineBase):
    model = JobStep
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False
    fields = ("step", "completed", "result_display", "attempts", "last_error", "recorded_at")
    readonly_fields = fields
    ordering = ("recorded_at", "id")
    verbose_name_plural = "step ledger (the pass in flight, or the last pass of a failed run)"

    @admin.display(boolean=True, description="completed")
    def completed(self, obj: JobStep) -> bool:
        return obj.result is not None

    @admin.display(description="result")
    def result_display(self, obj: JobStep) -> SafeString:
        return _pretty(obj.result, empty="(not completed)")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(JobRun)
class JobRunAdmin(_AdminBase):
    change_form_template = "admin/django_jobruns/jobrun/change_form.html"
    list_display = (
        "id",
        "key",
        "status_badge",
        "progress",
        "attempts_and_next",
        "lease_state",
        "error_short",
        "started_ended",
    )
    list_filter = (
        "status",
        StateFilter,
        JobFilter,
        ("started_at", DateRangeFilterBuilder(title="started")),
        ("ended_at", DateRangeFilterBuilder(title="ended")),
    )
    # Searched by id too (exactly, when the term is one), in get_search_results:
    # a partial match on the id would defeat the search indexes.
    search_fields = ("instance", "last_error")
    search_help_text = "Instance or error text contains the term; or the exact run id."
    ordering = ("-id",)
    list_per_page = 50
    # A COUNT(*) over the whole table on every page view costs what the table
    # retains: no second count for "N total", and an estimate for the first
    # page of a large unfiltered list (PostgreSQL).
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    inlines = [JobStepInline]
    actions = [
        "restart_selected",
        "resume_selected",
        "cancel_selected",
        "pause_selected",
        "unpause_selected",
        "retry_now_selected",
    ]
    fieldsets = (
        (None, {"fields": ("id", "key", "status_badge", "progress", "started_at", "updated_at", "ended_at")}),
        ("Retry", {"fields": ("attempts", "next_attempt_at", "last_error_display", "last_warning")}),
        ("Data", {"fields": ("payload_display", "cursor_display", "counters_display")}),
        ("Lease", {"fields": ("lease_holder", "lease_state", "lease_expires_at", "lease_fence")}),
        ("Lineage", {"fields": ("restarted_from_link", "restarts_links")}),
    )
    readonly_fields = (
        "id",
        "key",
        "status_badge",
        "progress",
        "started_at",
        "updated_at",
        "ended_at",
        "attempts",
        "next_attempt_at",
        "last_error_display",
        "last_warning",
        "payload_display",
        "cursor_display",
        "counters_display",
        "lease_holder",
        "lease_state",
        "lease_expires_at",
        "lease_fence",
        "restarted_from_link",
        "restarts_links",
    )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobRun], search_term: str
    ) -> tuple[QuerySet[JobRun], bool]:
        term = search_term.strip().upper()
        if _ULID.fullmatch(term):
            # A pasted run id: that run, found by its primary key, not by scanning text for it.
            return queryset.filter(pk=term), False
        # The index narrows to the candidates (SQLite: FTS5 trigrams); Django's
        # own conditions, which PostgreSQL's trigram indexes serve, decide.
        return super().get_search_results(request, search.narrow(queryset, search_term), search_term)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobRunChangeList

    def get_ordering(self, request: HttpRequest) -> Any:
        # A date range is read newest first in that date: the page is then the
        # first rows of one range of the date's index, where "newest id first"
        # would read and skip every run newer than the range to reach it.
        for field in ("ended_at", "started_at"):
            if any(key.startswith(f"{field}__range__") and value for key, value in request.GET.items()):
                return (f"-{field}", "-id")
        return super().get_ordering(request)

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, orphans: int = 0, allow_empty_first_page: bool = True
    ) -> EstimatedCountPaginator:
        paginator = EstimatedCountPaginator(queryset, per_page, orphans, allow_empty_first_page)
        searched = bool(request.GET.get(SEARCH_VAR))
        paginator.estimate_filtered = not searched
        paginator.read_first_page = searched and request.GET.get(PAGE_VAR, "1") in ("", "1")
        return paginator

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context and "cl" in context:
            paginator = context["cl"].paginator
            context["count_estimated"] = bool(getattr(paginator, "estimated", False))
        return response

    # -- columns ---------------------------------------------------------------

    @admin.display(description="job [instance]", ordering="module")
    def key(self, obj: JobRun) -> str:
        return f"{obj.module}.{obj.job} [{obj.instance}]"

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: JobRun) -> SafeString:
        if obj.status == Status.RUNNING and obj.paused_at is not None:
            return format_html(
                '<span class="jobruns-status jobruns-status-paused" title="paused at {}">{}</span>',
                obj.paused_at,
                "running (paused)",
            )
        return format_html('<span class="jobruns-status jobruns-status-{}">{}</span>', obj.status, obj.status)

    @admin.display(description="lease", ordering="lease_expires_at")
    def lease_state(self, obj: JobRun) -> SafeString:
        """Whether the lease is held, or lapsed: a holder that stopped reporting (a killed worker)."""
        if obj.lease_holder is None or obj.lease_expires_at is None:
            return format_html("{}", "—")
        now = timezone.now()
        if obj.lease_expires_at <= now:
            return format_html(
                '<span class="jobruns-lease-lapsed" title="lapsed at {}; the next drive takes the run over and counts '
                'that pass as a failed attempt">lapsed {} ago — its holder {} stopped reporting</span>',
                obj.lease_expires_at,
                timesince(obj.lease_expires_at, now, depth=1),
                obj.lease_holder,
            )
        return format_html(
            '<span class="jobruns-lease-held" title="until {}">held by {}, expires in {}</span>',
            obj.lease_expires_at,
            obj.lease_holder,
            timeuntil(obj.lease_expires_at, now, depth=1),
        )

    @admin.display(description="attempts", ordering="attempts")
    def attempts_and_next(self, obj: JobRun) -> SafeString:
        """The failed attempts, and when the next one is due if the run waits out a backoff."""
        if obj.next_attempt_at is None:
            return format_html("{}", obj.attempts)
        now = timezone.now()
        when = (
            f"next in {timeuntil(obj.next_attempt_at, now, depth=1)}"
            if obj.next_attempt_at > now
            else f"next due {timesince(obj.next_attempt_at, now, depth=1)} ago"
        )
        return format_html(
            '{}<br><span class="jobruns-next" title="{}">{}</span>', obj.attempts, _exact(obj.next_attempt_at), when
        )

    @admin.display(description="started / ended", ordering="started_at")
    def started_ended(self, obj: JobRun) -> SafeString:
        if obj.ended_at is None:
            return _compact_time(obj.started_at)
        return format_html("{}<br>→ {}", _compact_time(obj.started_at), _compact_time(obj.ended_at))

    @admin.display(description="last error")
    def error_short(self, obj: JobRun) -> str:
        if not obj.last_error:
            return "—"
        first = obj.last_error.splitlines()[0]
        return first if len(first) <= 120 else f"{first[:119]}…"

    @admin.display(description="progress")
    def progress(self, obj: JobRun) -> SafeString | str:
        return _progress(obj.counters)

    @admin.display(description="payload")
    def payload_display(self, obj: JobRun) -> SafeString:
        return _pretty(obj.payload)

    @admin.display(description="cursor")
    def cursor_display(self, obj: JobRun) -> SafeString:
        return _pretty(obj.cursor, empty="(no pass committed yet)" if obj.status == Status.RUNNING else "—")

    @admin.display(description="counters")
    def counters_display(self, obj: JobRun) -> SafeString:
        return _pretty(obj.counters)

    @admin.display(description="last error")
    def last_error_display(self, obj: JobRun) -> SafeString:
        if not obj.last_error:
            return format_html("{}", "—")
        return format_html('<pre class="jobruns-error">{}</pre>', obj.last_error)

    @admin.display(description="restarted from")
    def restarted_from_link(self, obj: JobRun) -> SafeString:
        if obj.restarted_from_id is None:
            return format_html("{}", "—")
        return format_html('<a href="{}">{}</a>', _change_url(obj.restarted_from_id), obj.restarted_from_id)

    @admin.display(description="restarted as")
    def restarts_links(self, obj: JobRun) -> SafeString:
        ids = list(obj.restarts.order_by("id").values_list("id", flat=True))
        if not ids:
            return format_html("{}", "—")
        return format_html_join(", ", '<a href="{}">{}</a>', ((_change_url(i), i) for i in ids))

    # -- permissions: read-only, restart is its own permission -----------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_restart_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RESTART_PERMISSION))

    def has_steer_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(STEER_PERMISSION))

    # -- restart and resume ----------------------------------------------------

    def get_urls(self) -> list[Any]:
        restart = self.admin_site.admin_view(require_POST(self.restart_view))
        steer = self.admin_site.admin_view(require_POST(self.steer_view))
        return [
            path("<path:object_id>/restart/", restart, name="django_jobruns_jobrun_restart"),
            path("<path:object_id>/steer/", steer, name="django_jobruns_jobrun_steer"),
            *super().get_urls(),
        ]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        obj = kwargs.get("obj")
        context["can_restart"] = (
            obj is not None
            and obj.status == Status.FAILED
            and self.has_restart_permission(request)
            and not obj.restarts.exists()
        )
        verbs = steering_verbs(obj, timezone.now()) if obj is not None and self.has_steer_permission(request) else []
        context["steering"] = [(verb, STEERING[verb][0]) for verb in verbs]
        return super().render_change_form(request, context, *args, **kwargs)

    def steer_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel, pause, unpause or retry now: POST only, CSRF-checked, permission-checked here."""
        if not self.has_steer_permission(request):
            raise PermissionDenied
        run = get_object_or_404(JobRun, pk=object_id)
        verb = request.POST.get("verb", "")
        if verb not in STEERING:
            self.message_user(request, f"Unknown action {verb!r:.50}.", messages.ERROR)
        else:
            self._steer(request, run, verb, reason=request.POST.get("reason", "")[:1000])
        return HttpResponseRedirect(_change_url(run.pk))

    def _steer(self, request: HttpRequest, run: JobRun, verb: str, *, reason: str = "") -> bool:
        label, done, act = STEERING[verb]
        try:
            if verb == "cancel":
                act(run, reason=reason or f"by {request.user.get_username()} in the admin")
            else:
                act(run)
        except JobRunsError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return False
        self.log_change(request, run, f"{done} from the admin")
        self.message_user(request, f"{done} run {run.pk}.", messages.SUCCESS)
        return True

    def _steer_selected(self, request: HttpRequest, queryset: QuerySet[JobRun], verb: str) -> None:
        runs = list(queryset.order_by("id"))
        now = timezone.now()
        skipped = [run.pk for run in runs if verb not in steering_verbs(run, now)]
        if skipped:
            self.message_user(
                request,
                f"Skipped {len(skipped)} run(s) to which {STEERING[verb][0]!r} does not apply: {', '.join(skipped)}",
                messages.WARNING,
            )
        for run in runs:
            if run.pk not in skipped:
                self._steer(request, run, verb)

    @admin.action(description="Cancel selected live runs", permissions=["steer"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        self._steer_selected(request, queryset, "cancel")

    @admin.action(description="Pause selected live runs", permissions=["steer"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        self._steer_selected(request, queryset, "pause")

    @admin.action(description="Unpause selected paused runs", permissions=["steer"])
    def unpause_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        self._steer_selected(request, queryset, "unpause")

    @admin.action(description="Retry selected runs now (skip their backoff)", permissions=["steer"])
    def retry_now_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        self._steer_selected(request, queryset, "retry_now")

    def restart_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST only (require_POST), CSRF-checked (admin_view), permission-checked here."""
        if not self.has_restart_permission(request):
            raise PermissionDenied
        run = get_object_or_404(JobRun, pk=object_id)
        resume = request.POST.get("resume") == "1"
        new = self._restart(request, run, resume=resume)
        return HttpResponseRedirect(_change_url(new.pk if new is not None else run.pk))

    def _restart(self, request: HttpRequest, run: JobRun, *, resume: bool) -> JobRun | None:
        verb = "Resumed" if resume else "Restarted"
        try:
            new, created = restart_job_run(run, resume=resume)
        except JobRunsError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return None
        if created:
            self.log_addition(request, new, f"{verb} as a new run from failed run {run.pk}")
            self.message_user(
                request,
                format_html(
                    '{} failed run {} as new run <a href="{}">{}</a>.', verb, run.pk, _change_url(new.pk), new.pk
                ),
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                format_html(
                    'A live run for {} was already running: joined run <a href="{}">{}</a> instead of '
                    "starting another.",
                    f"{run.label} [{run.instance}]",
                    _change_url(new.pk),
                    new.pk,
                ),
                messages.WARNING,
            )
        return new

    @admin.action(description="Restart selected failed runs as new runs", permissions=["restart"])
    def restart_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> HttpResponse | None:
        return self._bulk(request, queryset, resume=False)

    @admin.action(description="Resume selected failed runs as new runs", permissions=["restart"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> HttpResponse | None:
        return self._bulk(request, queryset, resume=True)

    def _bulk(self, request: HttpRequest, queryset: QuerySet[JobRun], *, resume: bool) -> HttpResponse | None:
        runs = list(queryset.order_by("id"))
        skipped = [run.pk for run in runs if run.status != Status.FAILED]
        if skipped:
            self.message_user(
                request, f"Skipped {len(skipped)} run(s) that are not failed: {', '.join(skipped)}", messages.WARNING
            )
        started = [self._restart(request, run, resume=resume) for run in runs if run.status == Status.FAILED]
        landed = [new for new in started if new is not None]
        if len(landed) == 1:
            return HttpResponseRedirect(_change_url(landed[0].pk))
        return None


def _exact(moment: datetime.datetime) -> str:
    return timezone.localtime(moment).isoformat(sep=" ", timespec="seconds")


def _compact_time(moment: datetime.datetime) -> SafeString:
    """A time as a list column shows it: the day and minute, the exact time on hover."""
    local = timezone.localtime(moment)
    shown = local.strftime("%H:%M") if local.date() == timezone.localdate() else local.strftime("%b %-d, %H:%M")
    if local.year != timezone.localdate().year:
        shown = local.strftime("%Y-%m-%d %H:%M")
    return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(), _exact(moment), shown)


def _change_url(run_id: str) -> str:
    return reverse("admin:django_jobruns_jobrun_change", args=[run_id])
