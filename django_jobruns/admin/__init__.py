"""The Django admin for job runs: read, filter, steer, and restart or resume failed runs.

Runs are never edited by hand: every field is read-only, and the only ways to
act on a run are its buttons and bulk actions (:mod:`.actions`), which go
through the same functions as the commands. The list stays fast at millions of
runs (:mod:`.pages`); stored values are shown by :mod:`.display`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from rangefilter.filters import DateRangeFilterBuilder

from .. import db
from ..models import JobAttempt, JobRun, JobStep, Status
from . import schedules as schedules  # registers the schedules' admin
from . import search
from .actions import STEERING, RunActions, _InlineBase, steering_verbs
from .display import (
    ago,
    breakable,
    change_url,
    compact_time,
    exact_time,
    pretty,
    progress_html,
    within,
    without_carets,
)
from .overview import overview
from .pages import EstimatedCountPaginator, JobFilter, JobRunChangeList, PriorityFilter, QueueFilter, StateFilter

_ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")

__all__ = ["EstimatedCountPaginator", "JobRunAdmin", "STEERING", "steering_verbs"]


class _LastRows(BaseInlineFormSet):  # type: ignore[type-arg]
    """An inline's last ``shown_max`` rows in its order, read in one bounded query."""

    shown_max = 0

    def get_queryset(self) -> Any:
        if not hasattr(self, "_last"):
            rows = super().get_queryset()
            self._last = list(reversed(rows.reverse()[: self.shown_max]))
        return self._last


class _ReadOnlyInline(_InlineBase):
    """Rows shown under a run, never edited here; the last ``shown_max`` of them, the heading saying so.

    A failed pass of 20 000 steps took a minute to show whole, past a proxy's timeout; its last steps
    (where it failed) are the ones an operator reads, and ``manage.py job_runs RUN_ID`` shows them all.
    """

    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False
    shown_max = 200

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("formset", type("LastRows", (_LastRows,), {"shown_max": self.shown_max}))
        formset = super().get_formset(request, obj, **kwargs)
        total = self.model._default_manager.filter(run=obj).count() if obj is not None else 0
        if total > self.shown_max:
            # An instance of the inline for each request: its heading is this page's alone.
            self.verbose_name_plural = (
                f"{self.verbose_name_plural}: the last {self.shown_max} of {total} "
                f"(all of them: manage.py job_runs {obj.pk})"
            )
        return formset

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class JobStepInline(_ReadOnlyInline):
    model = JobStep
    fields = ("step", "completed", "result_display", "attempts", "last_error", "recorded_at")
    readonly_fields = fields
    ordering = ("recorded_at", "id")
    verbose_name_plural = "step ledger (the pass in flight, or the last pass of a failed run)"

    @admin.display(boolean=True, description="completed")
    def completed(self, obj: JobStep) -> bool:
        return obj.result is not None

    @admin.display(description="result")
    def result_display(self, obj: JobStep) -> SafeString:
        return pretty(obj.result, empty="(not completed)")


class JobAttemptInline(_ReadOnlyInline):
    """A task run's attempts: who worked it, when, and the task's own error and traceback."""

    model = JobAttempt  # type: ignore[assignment]
    fields = ("number", "holder", "started_at", "ended_at", "error")
    readonly_fields = fields
    ordering = ("number",)
    verbose_name_plural = "attempts (one per claim; an attempt without an end was a worker that stopped reporting)"

    @admin.display(description="error")
    def error(self, obj: JobAttempt) -> SafeString:
        if not obj.error_class:
            return format_html("{}", "—")
        return format_html(
            '<details><summary>{}</summary><pre class="jobruns-error">{}</pre></details>',
            obj.error_class,
            without_carets(obj.traceback or ""),
        )


def _exactly(name: str) -> Any:
    """A time field as the change page shows it: to the second, in the project's time zone."""

    def shown(self: Any, obj: JobRun) -> SafeString | str:
        value = getattr(obj, name)
        if value is None:
            return "—"
        return format_html('<time datetime="{}">{}</time>', value.isoformat(), exact_time(value))

    shown.__name__ = f"{name}_exact"
    return admin.display(description=name.replace("_", " "), ordering=name)(shown)


@admin.register(JobRun)
class JobRunAdmin(RunActions):
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
        QueueFilter,
        PriorityFilter,
        ("started_at", DateRangeFilterBuilder(title="started")),
        ("ended_at", DateRangeFilterBuilder(title="ended")),
    )
    # Searched by id too (exactly, when the term is one), in get_search_results:
    # a partial match on the id would defeat the search indexes.
    search_fields = ("instance", "last_error")
    search_help_text = "Instance or error text contains the term; or the exact run id."
    ordering = ("-id",)
    list_per_page = 50
    # One dash for every empty value, Django's own fields and the app's columns alike.
    empty_value_display = "—"
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
        (
            None,
            {
                "fields": (
                    "id",
                    "key",
                    "status_badge",
                    "progress",
                    "started_at_exact",
                    "updated_at_exact",
                    "paused_at_exact",
                    "ended_at_exact",
                )
            },
        ),
        (
            "Retry",
            {"fields": ("attempts", "failed_passes", "next_attempt_at_exact", "last_error_display", "last_warning")},
        ),
        ("Data", {"fields": ("payload_display", "cursor_display", "counters_display")}),
        ("Lease", {"fields": ("lease_holder", "lease_state", "lease_expires_at_exact", "lease_fence")}),
        ("Lineage", {"fields": ("restarted_from_link", "restarts_links")}),
    )
    # Every field shown is read-only: runs are never edited by hand.
    readonly_fields = tuple(str(name) for _, section in fieldsets for name in section["fields"])

    started_at_exact = _exactly("started_at")
    updated_at_exact = _exactly("updated_at")
    paused_at_exact = _exactly("paused_at")
    ended_at_exact = _exactly("ended_at")
    next_attempt_at_exact = _exactly("next_attempt_at")
    lease_expires_at_exact = _exactly("lease_expires_at")

    _TASK_FIELDSET: Any = (
        "Task",
        {"fields": ("task_name", "queue_name", "priority", "task_arguments", "task_return_value")},
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and obj.is_task:
            fieldsets.insert(1, self._TASK_FIELDSET)
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (*self.readonly_fields, "task_name", "queue_name", "priority", "task_arguments", "task_return_value")

    def get_inlines(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.is_task:
            return [JobAttemptInline, *self.inlines]
        return self.inlines

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[JobRun], search_term: str
    ) -> tuple[QuerySet[JobRun], bool]:
        term = search_term.strip().upper()
        if _ULID.fullmatch(term):
            # A pasted run id: that run, found by its primary key, not by scanning text for it.
            return queryset.filter(pk=term), False
        # The index narrows to the candidates (SQLite: FTS5 trigrams); Django's
        # own conditions, which PostgreSQL's trigram indexes serve, decide.
        narrowed, bound = search.narrow(queryset, search_term)
        if bound is not None and request is not None:
            setattr(request, "jobruns_search_bound", bound)  # noqa: B010 -- for the page to say so
        return super().get_search_results(request, narrowed, search_term)

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
            context["count_capped"] = getattr(paginator, "capped", False) and paginator.COUNT_SEARCH_UP_TO
            context["search_bound"] = getattr(request, "jobruns_search_bound", None)
            cl = context["cl"]
            if not cl.has_active_filters and not cl.query and cl.page_num == 1:
                # The whole queue, on the list an operator lands on (two statements);
                # a filtered or searched list, or a later page, is about its rows and reads only them.
                context["overview"] = overview(JobRun.objects.using(db.alias()), db.now())
        return response

    # -- columns ---------------------------------------------------------------

    @admin.display(description="job [instance]", ordering="module")
    def key(self, obj: JobRun) -> SafeString:
        if obj.is_task:
            return breakable(f"task {obj.task_path or '?'} [queue {obj.queue_name}, priority {obj.priority}]")
        return breakable(f"{obj.module}.{obj.job} [{obj.instance}]")

    @admin.display(description="task")
    def task_name(self, obj: JobRun) -> str:
        return obj.task_path or "—"

    @admin.display(description="arguments")
    def task_arguments(self, obj: JobRun) -> SafeString:
        payload = obj.payload_value if isinstance(obj.payload_value, dict) else {}
        arguments = {"args": payload.get("args", []), "kwargs": payload.get("kwargs", {})}
        return pretty(json.dumps(arguments))

    @admin.display(description="return value")
    def task_return_value(self, obj: JobRun) -> SafeString:
        if obj.status != Status.DONE:
            return format_html('<span class="jobruns-empty">{}</span>', "(not finished)")
        return pretty(obj.cursor)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: JobRun) -> SafeString:
        if obj.status == Status.RUNNING and obj.is_marked_unregistered:
            return format_html(
                '<span class="jobruns-status jobruns-status-unregistered" title="{}">{}</span>',
                obj.last_warning,
                "running (job not registered)",
            )
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
                'that pass as a failed attempt">lapsed {} — its holder {} stopped reporting</span>',
                obj.lease_expires_at,
                ago(obj.lease_expires_at, now),
                obj.lease_holder,
            )
        return format_html(
            '<span class="jobruns-lease-held" title="until {}">held by {}, expires {}</span>',
            obj.lease_expires_at,
            obj.lease_holder,
            within(obj.lease_expires_at, now),
        )

    @admin.display(description="failed passes", ordering="failed_passes")
    def attempts_and_next(self, obj: JobRun) -> SafeString:
        """The run's failed passes over its life (kept once it is done), those of the pass in flight
        when fewer, and when the next attempt is due if the run waits out a backoff."""
        shown = format_html("{}", obj.failed_passes)
        if 0 < obj.attempts < obj.failed_passes:
            shown = format_html('{}<br><span class="jobruns-next">{} in a row</span>', shown, obj.attempts)
        if obj.next_attempt_at is None:
            return shown
        now = timezone.now()
        when = (
            f"next {within(obj.next_attempt_at, now)}"
            if obj.next_attempt_at > now
            else f"next due {ago(obj.next_attempt_at, now)}"
        )
        return format_html(
            '{}<br><span class="jobruns-next" title="{}">{}</span>', shown, exact_time(obj.next_attempt_at), when
        )

    @admin.display(description="started / ended", ordering="started_at")
    def started_ended(self, obj: JobRun) -> SafeString:
        if obj.ended_at is None:
            return compact_time(obj.started_at)
        return format_html("{}<br>→ {}", compact_time(obj.started_at), compact_time(obj.ended_at))

    @admin.display(description="last error")
    def error_short(self, obj: JobRun) -> str:
        if not obj.last_error:
            return "—"
        first = obj.last_error.splitlines()[0]
        return first if len(first) <= 120 else f"{first[:119]}…"

    @admin.display(description="progress")
    def progress(self, obj: JobRun) -> SafeString | str:
        return progress_html(obj.counters)

    @admin.display(description="payload")
    def payload_display(self, obj: JobRun) -> SafeString:
        return pretty(obj.payload)

    @admin.display(description="cursor")
    def cursor_display(self, obj: JobRun) -> SafeString:
        return pretty(obj.cursor, empty="(no pass committed yet)" if obj.status == Status.RUNNING else "—")

    @admin.display(description="counters")
    def counters_display(self, obj: JobRun) -> SafeString:
        return pretty(obj.counters)

    @admin.display(description="last error")
    def last_error_display(self, obj: JobRun) -> SafeString:
        if not obj.last_error:
            return format_html("{}", "—")
        return format_html('<pre class="jobruns-error">{}</pre>', without_carets(obj.last_error))

    @admin.display(description="restarted from")
    def restarted_from_link(self, obj: JobRun) -> SafeString:
        if obj.restarted_from_id is None:
            return format_html("{}", "—")
        return format_html('<a href="{}">{}</a>', change_url(obj.restarted_from_id), obj.restarted_from_id)

    @admin.display(description="restarted as")
    def restarts_links(self, obj: JobRun) -> SafeString:
        ids = list(obj.restarts.order_by("id").values_list("id", flat=True))
        if not ids:
            return format_html("{}", "—")
        return format_html_join(", ", '<a href="{}">{}</a>', ((change_url(i), i) for i in ids))

    # -- permissions: read-only, restart is its own permission -----------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
