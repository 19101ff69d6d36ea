"""The admin's overview above the runs: counts per state, the head of the queue's wait, a day's chart.

Read from indexes, not the table, so the changelist stays within its budget at
millions of retained runs: the running runs' counts from the due index and
two small partial ones (runs held under a lease, paused runs), the last day's
finished runs from the retention index ``(status, ended_at)``. The chart is an
inline SVG drawn here (no JavaScript), coloured by the admin's own theme
variables, so it reads in the light and the dark theme.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, F
from django.db.models.functions import Substr, TruncHour
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import JobRun, JobSchedule, Status
from ..store import estimates, store

HOURS = 24


#: Counts up to this are exact; a larger one is the planner's estimate, where the database has one.
EXACT_UP_TO = 10_000


@dataclass(frozen=True)
class Tile:
    label: str
    count: int
    query: str  # the changelist's filter that lists them
    alarm: bool = False  # worth an operator's look when not zero
    estimated: bool = False  # ``count`` is the planner's estimate (more than EXACT_UP_TO runs)


@dataclass(frozen=True)
class Hour:
    start: datetime
    done: int
    failed: int
    #: The counts are the planner's estimates: the day ended more than EXACT_UP_TO runs.
    estimated: bool = False


@dataclass(frozen=True)
class Overview:
    tiles: list[Tile]
    next_due_wait: float | None  # seconds the head of the queue has waited to be taken (None: no run is due)
    hours: list[Hour]
    #: The schedules' next tick: (schedule, when), or ``None`` (no schedule declared, or none active).
    next_tick: tuple[str, datetime] | None = None
    #: The head was found among the EXACT_UP_TO + 1 due runs started first, not all (MariaDB/MySQL, more due).

    @property
    def chart(self) -> SafeString:
        return chart(self.hours)

    @property
    def chart_estimated(self) -> bool:
        return any(hour.estimated for hour in self.hours)

    @property
    def exact_up_to(self) -> int:
        return EXACT_UP_TO


def overview(rows: Any, now: datetime) -> Overview:
    """The overview of ``rows`` (the app's runs, on its database) at ``now``: two statements.

    The counts and the head of the queue are one statement of scalar
    subqueries (one round trip, each subquery planned as its own index read);
    the chart's hours are the second. Where the database estimates (PostgreSQL,
    MariaDB/MySQL), each count reads at most :data:`EXACT_UP_TO` + 1 index
    entries, and a count that reaches it is replaced by the planner's estimate
    (one ``EXPLAIN`` each), as the changelist's total is: at a million runs an
    exact count of the runs in flight would read a quarter of a million entries
    on every view of the page. So is the chart's day: past that many runs ended
    its bars are the planner's estimates (:func:`estimated_per_hour`).
    """
    now = now.astimezone(UTC)
    since = now - timedelta(hours=HOURS)
    running = rows.filter(status=Status.RUNNING)
    counted = {
        "running": running,
        "backoff": rows.backing_off(now),
        "leased": rows.leased(now),
        "lapsed": rows.lapsed(now),
        "paused": rows.paused(),
        "failed": rows.filter(status=Status.FAILED, ended_at__gte=since),
    }
    # (Any: the type stubs lose an annotation carried in a variable.)
    due: Any = JobRun.objects.using(rows.db).due(now).annotate(head_since=F("due_at"))
    vendor = connections[rows.db].vendor
    bounded = vendor in estimates.ESTIMATING
    parts: list[str] = []
    params: list[Any] = []
    tail, tail_params = "", list[Any]()
    if bounded:
        # Each count its own index read, of at most EXACT_UP_TO + 1 entries.
        for index, query in enumerate(counted.values()):
            sql, part = _compiled(query.values("pk")[: EXACT_UP_TO + 1], rows.db)
            parts.append(f"(SELECT COUNT(*) FROM ({sql}) counted_{index})")
            params.extend(part)
    else:
        # SQLite has no index of the held runs (every claim and release would
        # write it) and no estimates: the runs in flight are read once, for all
        # their counts, rather than once per count.
        for name, query in counted.items():
            if name == "running":
                parts.append("COUNT(*)")
                continue
            if name == "failed":
                sql, part = _compiled(query.values("pk"), rows.db)
                parts.append(f"(SELECT COUNT(*) FROM ({sql}) counted_failed)")
            else:
                sql, part = _where(query, rows.db)
                parts.append(f"COUNT(CASE WHEN {sql} THEN 1 END)")
            params.extend(part)
        where, tail_params = _where(running, rows.db)
        tail = f" FROM {connections[rows.db].ops.quote_name(JobRun._meta.db_table)} WHERE {where}"
    if bounded:
        # Whether the chart's day ended more runs than are counted one by one (its bars are estimated then).
        sql, part = _compiled(_ended(rows, now).values("pk")[: EXACT_UP_TO + 1], rows.db)
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) counted_finished)")
        params.extend(part)
    # The due order's own index (jobruns_due_at) leads to the head, on every database.
    sql, part = _compiled(due.in_due_order().values_list("head_since")[:1], rows.db)
    parts.append(f"(SELECT head_since FROM ({sql}) head)")
    params.extend(part)
    with connections[rows.db].cursor() as cur:
        cur.execute("SELECT " + ", ".join(parts) + tail, params + tail_params)
        found = cur.fetchone()
    counts = dict(zip(counted, (int(n) for n in found[: len(counted)]), strict=True))
    many_finished = bounded and int(found[len(counted)]) > EXACT_UP_TO
    estimated = set()
    for name, n in counts.items():
        if bounded and n > EXACT_UP_TO:
            planned = estimates.planned_rows(counted[name].order_by())
            counts[name] = max(planned or 0, n)  # at least the entries read
            estimated.add(name)
    waiting_since = store().read_datetime(found[-1])

    def tile(label: str, name: str, query: str, alarm: bool = False) -> Tile:
        return Tile(label, counts[name], query, alarm, name in estimated)

    tiles = [
        tile("running", "running", "status__exact=running"),
        tile("leased", "leased", "state=leased"),
        tile("in backoff", "backoff", "state=backoff"),
        tile("lease lapsed", "lapsed", "state=lapsed", alarm=True),
        tile("paused", "paused", "state=paused"),
        tile(
            f"failed in {HOURS} h",
            "failed",
            f"status__exact=failed&ended_at__range__gte={since:%Y-%m-%d}",
            alarm=True,
        ),
    ]
    return Overview(
        tiles=tiles,
        next_due_wait=max((now - waiting_since).total_seconds(), 0.0) if waiting_since is not None else None,
        hours=estimated_per_hour(rows, now) if many_finished else finished_per_hour(rows, now),
        next_tick=next_tick(rows.db),
    )


def next_tick(using: str) -> tuple[str, datetime] | None:
    """The schedules' next tick (one read of the schedules' index; none without schedules in settings)."""
    from ..schedule_specs import declared

    if not declared()[0]:
        return None
    found = (
        JobSchedule.objects.using(using)
        .filter(paused_at__isnull=True, removed_at__isnull=True, next_tick__isnull=False)
        .order_by("next_tick")
        .values_list("name", "next_tick")
        .first()
    )
    return (found[0], found[1]) if found is not None and found[1] is not None else None


def _compiled(queryset: Any, using: str) -> tuple[str, list[Any]]:
    sql, params = queryset.query.get_compiler(using).as_sql()
    return sql, list(params)


def _where(queryset: Any, using: str) -> tuple[str, list[Any]]:
    """The WHERE condition of a queryset of the runs' table alone (no joins), as SQL and its parameters."""
    sql, params = queryset.query.get_compiler(using).compile(queryset.query.where)
    return sql, list(params)


def _first_hour(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)


def _ended(rows: Any, now: datetime) -> Any:
    """The runs the chart counts: ended done or failed since the start of its first hour."""
    return rows.filter(status__in=[Status.DONE, Status.FAILED], ended_at__gte=_first_hour(now))


def estimated_per_hour(rows: Any, now: datetime) -> list[Hour]:
    """The chart's bars from the planner's estimates: one ``EXPLAIN`` per hour and status, no run read.

    For a day that ended more than :data:`EXACT_UP_TO` runs: counting them would
    read every one (a third of a million a day at ten million retained runs).
    """
    first_hour = _first_hour(now)
    starts = [first_hour + timedelta(hours=index) for index in range(HOURS)]
    # One query (its parameters in the order Django gives them: the lookups sorted), asked of each hour and status.
    each = [[start, start + timedelta(hours=1), status] for start in starts for status in (Status.DONE, Status.FAILED)]
    one = rows.filter(ended_at__gte=each[0][0], ended_at__lt=each[0][1], status=each[0][2]).order_by()
    planned = estimates.planned_rows_each(one.values("pk"), each)
    if planned is None:
        planned = [
            estimates.planned_rows(rows.filter(ended_at__gte=a, ended_at__lt=b, status=s).order_by()) or 0
            for a, b, s in each
        ]
    return [
        Hour(start, done, failed, estimated=True)
        for start, done, failed in zip(starts, planned[::2], planned[1::2], strict=True)
    ]


def finished_per_hour(rows: Any, now: datetime) -> list[Hour]:
    """Runs that ended done and failed in each of the last :data:`HOURS` hours (UTC), oldest first."""
    first_hour = _first_hour(now)
    ended = _ended(rows, now)
    by_hour: dict[datetime, dict[str, int]] = {}
    if connections[rows.db].vendor == "sqlite":
        # Django's TruncHour is a Python function on SQLite, called for each of
        # the day's runs (a tenth of a second at 30 000); the stored text's
        # first 13 characters are the hour (UTC, 'YYYY-MM-DD HH').
        for status, text, n in ended.values_list("status", Substr("ended_at", 1, 13)).annotate(n=Count("*")):
            hour = datetime.strptime(text, "%Y-%m-%d %H").replace(tzinfo=UTC)
            by_hour.setdefault(hour, {})[status] = n
    else:
        found = ended.annotate(hour=TruncHour("ended_at", tzinfo=UTC)).values("status", "hour").annotate(n=Count("*"))
        for row in found:
            hour = row["hour"]
            if hour is not None:
                hour = hour.astimezone(UTC) if hour.tzinfo else hour.replace(tzinfo=UTC)
                by_hour.setdefault(hour, {})[row["status"]] = row["n"]
    hours = []
    for index in range(HOURS):
        start = first_hour + timedelta(hours=index)
        seen = by_hour.get(start, {})
        hours.append(Hour(start, seen.get(Status.DONE, 0), seen.get(Status.FAILED, 0)))
    return hours


def chart(hours: list[Hour]) -> SafeString:
    """Bars of runs finished per hour, done stacked on failed, with a title per bar for the numbers."""
    width, height, left, bottom, top_pad = 720, 150, 36, 22, 8
    plot_height = height - bottom - top_pad
    slot = (width - left) / max(len(hours), 1)
    peak = max((h.done + h.failed for h in hours), default=0)
    scale = plot_height / peak if peak else 0.0
    bars = []
    for index, hour in enumerate(hours):
        x = left + index * slot + 1
        failed_height = hour.failed * scale
        done_height = hour.done * scale
        base = height - bottom
        about = "about " if hour.estimated else ""
        label = (
            f"{hour.start:%H}:00–{hour.start + timedelta(hours=1):%H}:00 UTC: "
            f"{about}{hour.done} done, {hour.failed} failed"
        )
        bars.append(
            format_html(
                '<g><title>{}</title><rect class="jobruns-bar-failed" x="{}" y="{}" width="{}" height="{}"/>'
                '<rect class="jobruns-bar-done" x="{}" y="{}" width="{}" height="{}"/></g>',
                label,
                f"{x:.1f}",
                f"{base - failed_height:.1f}",
                f"{slot - 2:.1f}",
                f"{failed_height:.1f}",
                f"{x:.1f}",
                f"{base - failed_height - done_height:.1f}",
                f"{slot - 2:.1f}",
                f"{done_height:.1f}",
            )
        )
    ticks = format_html_join(
        "",
        '<text class="jobruns-axis" x="{}" y="{}" text-anchor="middle">{}</text>',
        (
            (f"{left + index * slot + slot / 2:.1f}", height - 6, f"{hour.start:%H}:00")
            for index, hour in enumerate(hours)
            if index % 6 == 0
        ),
    )
    total_done = sum(h.done for h in hours)
    total_failed = sum(h.failed for h in hours)
    about = "about " if any(h.estimated for h in hours) else ""
    summary = f"Runs finished per hour, last {len(hours)} hours: {about}{total_done} done, {total_failed} failed"
    return format_html(
        '<svg class="jobruns-chart" viewBox="0 0 {} {}" role="img" aria-labelledby="jobruns-chart-title" '
        'preserveAspectRatio="xMinYMin meet"><title id="jobruns-chart-title">{}</title>'
        '<line class="jobruns-grid" x1="{}" y1="{}" x2="{}" y2="{}"/>'
        '<text class="jobruns-axis" x="{}" y="{}" text-anchor="end">{}</text>'
        '<text class="jobruns-axis" x="{}" y="{}" text-anchor="end">0</text>'
        "{}{}</svg>",
        width,
        height,
        summary,
        left,
        height - bottom,
        width,
        height - bottom,
        left - 4,
        top_pad + 10,
        peak,
        left - 4,
        height - bottom,
        SafeString("".join(bars)),
        ticks,
    )
