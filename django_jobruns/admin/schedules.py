"""The schedules in the admin (S4): what each starts and when, in words; its last run; run now, pause, unpause.

Read-only, as the runs are: a schedule is declared in settings and deployed
with the code. The three buttons (and the same bulk actions) are POST only,
CSRF-checked, under the ``django_jobruns.steer_jobschedule`` permission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from .. import db, schedules
from ..models import JobRun, JobSchedule
from ..outcomes import summary
from ..schedule_specs import Schedule, declared
from .display import change_url, exact_time, within
from .pages import HeldLookups, held_or_404

STEER_SCHEDULE_PERMISSION = "django_jobruns.steer_jobschedule"

if TYPE_CHECKING:
    _ScheduleAdminBase = admin.ModelAdmin[JobSchedule]
else:
    _ScheduleAdminBase = admin.ModelAdmin


def schedule_url(name: str) -> str:
    return reverse("admin:django_jobruns_jobschedule_change", args=[name])


@admin.register(JobSchedule)
class JobScheduleAdmin(HeldLookups, _ScheduleAdminBase):
    change_form_template = "admin/django_jobruns/jobschedule/change_form.html"
    list_display = ("name", "target", "when", "state", "next_tick_shown", "last_tick_shown", "last_run")
    list_filter = ("timezone",)
    search_fields = ("name", "target")
    actions = ["run_now_selected", "pause_selected", "unpause_selected"]
    fields = (
        "name",
        "target",
        "when",
        "timezone",
        "state",
        "next_tick_shown",
        "last_tick_shown",
        "last_run",
        "ticks",
        "joined",
    )
    readonly_fields = fields

    # -- what is shown -----------------------------------------------------------

    @admin.display(description="when")
    def when(self, obj: JobSchedule) -> SafeString:
        """The expression in words (as declared now), the expression itself beside it."""
        schedule = self._declared().get(obj.name)
        words = schedule.explain() if schedule is not None else "—"
        return format_html(
            '{} <code title="cron expression">{}</code> <span>({})</span>', words, obj.cron, obj.timezone
        )

    @admin.display(description="state")
    def state(self, obj: JobSchedule) -> SafeString:
        if obj.removed_at is not None or obj.name not in self._declared():
            return format_html('<span class="jobruns-status-cancelled">removed from settings</span>')
        if obj.paused_at is not None:
            return format_html('<span class="jobruns-status-paused">paused since {}</span>', exact_time(obj.paused_at))
        return format_html("{}", "active")

    @admin.display(description="next tick", ordering="next_tick")
    def next_tick_shown(self, obj: JobSchedule) -> SafeString:
        if obj.next_tick is None or not obj.is_active:
            return format_html("{}", "—")
        return format_html(
            '<time datetime="{}">{}</time> ({})', obj.next_tick.isoformat(), exact_time(obj.next_tick),
            within(obj.next_tick, timezone.now()),
        )  # fmt: skip

    @admin.display(description="last tick", ordering="last_tick")
    def last_tick_shown(self, obj: JobSchedule) -> SafeString:
        if obj.last_tick is None:
            return format_html("{}", "—")
        return format_html('<time datetime="{}">{}</time>', obj.last_tick.isoformat(), exact_time(obj.last_tick))

    @admin.display(description="last run")
    def last_run(self, obj: JobSchedule) -> SafeString:
        if obj.last_run_id is None:
            return format_html("{}", "—")
        status = getattr(obj, "last_run_status", None) or "pruned"
        return format_html(
            '<a href="{}">{}</a> <span class="jobruns-status jobruns-status-{}">{}</span>',
            change_url(obj.last_run_id), obj.last_run_id, status, status,
        )  # fmt: skip

    def _declared(self) -> dict[str, Schedule]:
        return declared()[0]

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobSchedule]:
        # The last run's status in the same query (no query per row); a pruned run has none.
        status = JobRun.objects.filter(pk=OuterRef("last_run_id")).values("status")[:1]
        return super().get_queryset(request).using(db.alias()).annotate(last_run_status=Subquery(status))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        schedules.sync(db.now())  # a schedule that left settings is marked removed (S5)
        return super().changelist_view(request, extra_context)

    # -- the buttons ---------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        steer = self.admin_site.admin_view(require_POST(self.steer_view))
        return [path("<path:object_id>/steer/", steer, name="django_jobruns_jobschedule_steer"), *super().get_urls()]

    def has_steer_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(STEER_SCHEDULE_PERMISSION))

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        obj = kwargs.get("obj")
        verbs: list[tuple[str, str]] = []
        if obj is not None and self.has_steer_permission(request) and obj.name in self._declared():
            verbs = [("run_now", "Run now"), ("unpause", "Unpause") if obj.paused_at else ("pause", "Pause")]
        context["schedule_verbs"] = verbs
        return super().render_change_form(request, context, *args, **kwargs)

    def steer_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        row = held_or_404(JobSchedule.objects.using(db.alias()), object_id)
        if not (self.has_steer_permission(request) and self.has_view_permission(request, row)):
            raise PermissionDenied
        self._steer(request, row.name, request.POST.get("verb", ""))
        return HttpResponseRedirect(schedule_url(row.name))

    def _steer(self, request: HttpRequest, name: str, verb: str) -> None:
        if verb == "run_now":
            try:
                run_id, created = schedules.run_now(name)
                here = schedules.runs_here(name)
            except KeyError as exc:
                self.message_user(request, str(exc.args[0]), messages.ERROR)
                return
            except Exception as exc:  # the job's start or the task's enqueue refused: said, not a server error
                said = summary(exc).splitlines()[0]
                self.message_user(request, f"Schedule {name} could not start: {said}", messages.ERROR)
                return
            if here:
                said = "Started" if created else "Joined the live"
                text = format_html('{} run <a href="{}">{}</a> of schedule {}.', said, change_url(run_id), run_id, name)
            else:
                text = format_html("Enqueued task {} of schedule {} on its backend.", run_id, name)
            self.message_user(request, text, messages.SUCCESS)
        elif verb in ("pause", "unpause"):
            changed = schedules.pause(name) if verb == "pause" else schedules.unpause(name)
            state = "Paused" if verb == "pause" else "Unpaused"
            if changed:
                self.message_user(request, f"{state} schedule {name}.", messages.SUCCESS)
            else:
                self.message_user(request, f"Schedule {name} was already {state.lower()}.", messages.WARNING)
        else:
            self.message_user(request, f"Unknown action {verb!r:.50}.", messages.ERROR)
            return
        self.log_change(request, JobSchedule.objects.using(db.alias()).get(pk=name), f"{verb} from the admin")

    def _steer_selected(self, request: HttpRequest, queryset: QuerySet[JobSchedule], verb: str) -> None:
        if not self.has_steer_permission(request):
            raise PermissionDenied
        for row in queryset.order_by("name"):
            self._steer(request, row.name, verb)

    @admin.action(description="Run the selected schedules now")
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet[JobSchedule]) -> None:
        self._steer_selected(request, queryset, "run_now")

    @admin.action(description="Pause the selected schedules")
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[JobSchedule]) -> None:
        self._steer_selected(request, queryset, "pause")

    @admin.action(description="Unpause the selected schedules")
    def unpause_selected(self, request: HttpRequest, queryset: QuerySet[JobSchedule]) -> None:
        self._steer_selected(request, queryset, "unpause")

    # -- read-only: declared in settings ---------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
