"""The admin's actions on runs: restart and resume failed runs, cancel / pause / unpause / retry now live ones.

POST only (``require_POST``), CSRF-checked (``admin_view``), each checked against
its own permission; the work is done by the public functions (``restart_job_run``,
``steering``), so the admin, the commands and a project's code act alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from ..exceptions import JobRunsError
from ..models import JobRun, JobStep, Status
from ..starts import restart_job_run
from ..steering import cancel_job_run, pause_job_run, retry_job_run_now, unpause_job_run
from .display import change_url
from .pages import HeldLookups, held_or_404
from .summary import summary

#: Runs one bulk action acts on at most: the request stays within a proxy's timeout and its page
#: small; chosen again, the action goes on with the runs still to act on.
BULK_MAX = 1_000
#: A bulk action on at most this many runs says each one; on more, it counts them.
NAMED_MAX = 10
#: What deciding and doing a steering verb reads of a run (``steering_verbs``, the log's name).
_STEERED_FIELDS = ("id", "module", "job", "instance", "status", "paused_at", "next_attempt_at")

RESTART_PERMISSION = "django_jobruns.restart_jobrun"
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


class RunActions(HeldLookups, _AdminBase):
    """The buttons and bulk actions of the run admin, and the permissions they check."""

    def has_restart_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RESTART_PERMISSION))

    def has_steer_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(STEER_PERMISSION))

    # -- restart and resume ----------------------------------------------------

    def get_urls(self) -> list[Any]:
        restart = self.admin_site.admin_view(require_POST(self.restart_view))
        steer = self.admin_site.admin_view(require_POST(self.steer_view))
        cancel = self.admin_site.admin_view(self.cancel_view)
        return [
            path("<path:object_id>/restart/", restart, name="django_jobruns_jobrun_restart"),
            path("<path:object_id>/steer/", steer, name="django_jobruns_jobrun_steer"),
            path("<path:object_id>/cancel/", cancel, name="django_jobruns_jobrun_cancel"),
            *super().get_urls(),
        ]

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        obj = kwargs.get("obj")
        context["can_restart"] = (
            obj is not None
            and obj.status == Status.FAILED
            and self.has_restart_permission(request)
            and obj.restarted_as is None
        )
        verbs = steering_verbs(obj, timezone.now()) if obj is not None and self.has_steer_permission(request) else []
        # Cancel is final: it is a link to a page of its own that asks, set apart from the others.
        context["steering"] = [(verb, STEERING[verb][0]) for verb in verbs if verb != "cancel"]
        context["can_cancel"] = "cancel" in verbs
        # A task run restarts as the task again; "resume from its cursor" means nothing for a task.
        context["can_resume"] = context["can_restart"] and obj is not None and not obj.is_task
        context["run_summary"] = summary(obj, timezone.now()) if obj is not None else []
        return super().render_change_form(request, context, *args, **kwargs)

    def _run_permitted(self, request: HttpRequest, object_id: str, permitted: bool) -> JobRun:
        """The run to act on, if the action is ``permitted`` and the user may see the run.

        Acting on a run one may not see would act on a guessed id.
        """
        run = held_or_404(JobRun.objects.all(), object_id)
        if not (permitted and self.has_view_permission(request, run)):
            raise PermissionDenied
        return run

    def steer_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel, pause, unpause or retry now: POST only, CSRF-checked, permission-checked here."""
        run = self._run_permitted(request, object_id, self.has_steer_permission(request))
        verb = request.POST.get("verb", "")
        if verb not in STEERING:
            self.message_user(request, f"Unknown action {verb!r:.50}.", messages.ERROR)
        else:
            self._steer(request, run, verb, reason=request.POST.get("reason", "")[:1000])
        return HttpResponseRedirect(change_url(run.pk))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel asks first, on a page of its own: it is final (the run ends; a new start makes a new run)."""
        run = self._run_permitted(request, object_id, self.has_steer_permission(request))
        if request.method == "POST":
            self._steer(request, run, "cancel", reason=request.POST.get("reason", "")[:1000])
            return HttpResponseRedirect(change_url(run.pk))
        if "cancel" not in steering_verbs(run, timezone.now()):
            self.message_user(
                request, f"run {run.pk} is {run.status}; only a live run can be cancelled", messages.ERROR
            )
            return HttpResponseRedirect(change_url(run.pk))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Cancel run {run.pk}?",
            "run": run,
            "change_url": change_url(run.pk),
        }
        return TemplateResponse(request, "admin/django_jobruns/jobrun/cancel_confirmation.html", context)

    def _steer(self, request: HttpRequest, run: JobRun, verb: str, *, reason: str = "", say: bool = True) -> str | None:
        """Steer ``run``; its error, if it could not be (said, with the success, when ``say``)."""
        label, done, act = STEERING[verb]
        try:
            if verb == "cancel":
                by = f"by {request.user.get_username()} in the admin"
                act(run, reason=f"{reason} ({by})" if reason else by)
            else:
                act(run)
        except JobRunsError as exc:
            if say:
                self.message_user(request, str(exc), messages.ERROR)
            return str(exc)
        self.log_change(request, run, f"{done} from the admin")
        if say:
            self.message_user(request, f"{done} run {run.pk}.", messages.SUCCESS)
        return None

    def _steer_selected(self, request: HttpRequest, queryset: QuerySet[JobRun], verb: str) -> None:
        now, batch, skipped, passed, more = timezone.now(), list[JobRun](), list[str](), 0, False
        # The live runs read a page at a time by id (no server-side cursor: a pooler may stand between),
        # each checked by the verbs' own rule, until the batch is full and one more is seen: a selection
        # of millions is not read whole. The others are skipped, counted without being read.
        live, after = queryset.filter(status=Status.RUNNING).only(*_STEERED_FIELDS).order_by("id"), ""
        while not more and (page := list(live.filter(pk__gt=after)[:500])):
            after = page[-1].pk
            for run in page:
                if verb not in steering_verbs(run, now):
                    passed += 1
                    if len(skipped) < NAMED_MAX:
                        skipped.append(run.pk)
                elif len(batch) < BULK_MAX:
                    batch.append(run)
                else:
                    more = True
                    break
        ended = queryset.exclude(status=Status.RUNNING)
        label, done, _ = STEERING[verb]
        self._say_skipped(
            request,
            passed + ended.count(),
            [*skipped, *ended.order_by("id").values_list("pk", flat=True)[:NAMED_MAX]],
            f"to which {label!r} does not apply",
        )
        say = len(batch) <= NAMED_MAX
        errors = [error for run in batch if (error := self._steer(request, run, verb, say=say)) is not None]
        left = f"More selected runs are still to {label.lower()}" if more else ""
        done_line = None if say else f"{done} {len(batch) - len(errors)} runs."
        self._say_batch(request, done_line, [] if say else errors, label.lower(), left)

    def _say_skipped(self, request: HttpRequest, count: int, ids: list[str], why: str) -> None:
        if count:
            shown = ", ".join(ids[:NAMED_MAX]) + (", …" if count > NAMED_MAX else "")
            self.message_user(request, f"Skipped {count} run(s) {why}: {shown}", messages.WARNING)

    def _say_batch(self, request: HttpRequest, done: str | None, errors: list[str], verb: str, left: str) -> None:
        """A bulk action's outcome in a few lines: what it did, what it could not, what is left."""
        if done is not None:
            self.message_user(request, done, messages.SUCCESS)
        if errors:
            self.message_user(request, f"{len(errors)} could not {verb}; the first: {errors[0]}", messages.ERROR)
        if left:
            self.message_user(
                request,
                f"{left}: at most {BULK_MAX} are acted on at a time; choose the action again.",
                messages.WARNING,
            )

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
        run = self._run_permitted(request, object_id, self.has_restart_permission(request))
        resume = request.POST.get("resume") == "1"
        new = self._restart(request, run, resume=resume)
        return HttpResponseRedirect(change_url(new.pk if isinstance(new, JobRun) else run.pk))

    def _restart(self, request: HttpRequest, run: JobRun, *, resume: bool, say: bool = True) -> JobRun | str:
        """Restart ``run``; the new (or joined) run, or the error (said, with the outcome, when ``say``)."""
        verb = "Resumed" if resume else "Restarted"
        try:
            new, created = restart_job_run(run, resume=resume)
        except JobRunsError as exc:
            if say:
                self.message_user(request, str(exc), messages.ERROR)
            return str(exc)
        if created:
            self.log_addition(request, new, f"{verb} as a new run from failed run {run.pk}")
        if not say:
            return new
        if created:
            self.message_user(
                request,
                format_html(
                    '{} failed run {} as new run <a href="{}">{}</a>.', verb, run.pk, change_url(new.pk), new.pk
                ),
                messages.SUCCESS,
            )
        elif new.restarted_from_id == run.pk:
            self.message_user(
                request,
                format_html(
                    'Run {} was already restarted as run <a href="{}">{}</a>, which is still running: joined it '
                    "instead of starting another.",
                    run.pk,
                    change_url(new.pk),
                    new.pk,
                ),
                messages.WARNING,
            )
        else:
            self.message_user(
                request,
                format_html(
                    'A live run for {} was already running: joined run <a href="{}">{}</a> instead of '
                    "starting another.",
                    f"{run.label} [{run.instance}]",
                    change_url(new.pk),
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
        # A failed run is restarted once: one restarted already is skipped, so a second click goes on.
        to_restart = queryset.filter(status=Status.FAILED, restarted_as__isnull=True)
        # What the messages name: ``restart_job_run`` reads each run afresh (its payload among the rest).
        batch = list(to_restart.only("id", "module", "job", "instance", "status").order_by("id")[:BULK_MAX])
        others = queryset.exclude(status=Status.FAILED, restarted_as__isnull=True)
        self._say_skipped(
            request,
            others.count(),
            list(others.order_by("id").values_list("pk", flat=True)[:NAMED_MAX]),
            "that are not failed or were restarted already",
        )
        say = len(batch) <= NAMED_MAX
        started = [self._restart(request, run, resume=resume, say=say) for run in batch]
        landed = [new for new in started if isinstance(new, JobRun)]
        errors = [error for error in started if isinstance(error, str)]
        verb, left = ("resume" if resume else "restart"), to_restart.count()
        done = f"{'Resumed' if resume else 'Restarted'} {len(landed)} failed runs as new runs"
        done += " (or joined the live run of their key)."
        more = f"{left} more selected failed runs are still to {verb}" if left else ""
        self._say_batch(request, None if say else done, [] if say else errors, verb, more)
        if len(landed) == 1:
            return HttpResponseRedirect(change_url(landed[0].pk))
        return None
