"""How the admin shows a run's stored values: JSON pretty-printed and bounded, progress, times, links."""

from __future__ import annotations

import datetime
import json
import re

from django.urls import reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil

#: Characters of one stored value the change view shows at most; a note says what was cut.
SHOW_MAX = 20_000


def bounded(text: str) -> tuple[str, str]:
    """``text`` cut to :data:`SHOW_MAX` characters, and the note saying so (empty if nothing was cut)."""
    if len(text) <= SHOW_MAX:
        return text, ""
    return text[:SHOW_MAX], f"… {len(text) - SHOW_MAX} more characters not shown"


def pretty(text: str | None, *, empty: str = "—") -> SafeString:
    """Pretty-print stored JSON, or show the raw text beside why it does not parse; bounded either way."""
    if text is None:
        return format_html('<span class="jobruns-empty">{}</span>', empty)
    try:
        pretty = json.dumps(json.loads(text), indent=2, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raw, cut = bounded(text)
        return format_html(
            '<p class="errornote jobruns-decode-error">Cannot decode: {}</p><pre class="jobruns-raw">{}</pre>{}',
            why,
            raw,
            format_html('<p class="jobruns-cut">{}</p>', cut) if cut else "",
        )
    shown, cut = bounded(pretty)
    return format_html(
        '<pre class="jobruns-json">{}</pre>{}', shown, format_html('<p class="jobruns-cut">{}</p>', cut) if cut else ""
    )


def progress_html(counters_text: str) -> SafeString | str:
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


def exact_time(moment: datetime.datetime) -> str:
    return timezone.localtime(moment).isoformat(sep=" ", timespec="seconds")


def compact_time(moment: datetime.datetime) -> SafeString:
    """A time as a list column shows it: the day and minute, the exact time on hover."""
    local = timezone.localtime(moment)
    shown = local.strftime("%H:%M") if local.date() == timezone.localdate() else local.strftime("%b %-d, %H:%M")
    if local.year != timezone.localdate().year:
        shown = local.strftime("%Y-%m-%d %H:%M")
    return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(), exact_time(moment), shown)


def breakable(text: str) -> SafeString:
    """``text`` escaped, with a break opportunity after each ``.``, ``_``, ``/`` and ``-``: a long job name
    wraps between its words (``demo.import_<wbr>catalog``), never inside one."""
    return mark_safe(re.sub(r"([._/-])", r"\1<wbr>", str(conditional_escape(text))))  # noqa: S308 (escaped first)


#: Python's traceback markers under the failing expression (``^^^^^``, ``~~~^^^``): long, and no help here.
_CARETS = re.compile(r"^[ \t]*[~^]+[ \t]*$\n?", re.M)


def without_carets(text: str) -> str:
    """A stored traceback without its caret lines, which can run wider than the page."""
    return _CARETS.sub("", text)


def ago(moment: datetime.datetime, now: datetime.datetime) -> str:
    """``"3 minutes ago"``; under a minute ``"just now"`` (never "0 minutes ago")."""
    if (now - moment).total_seconds() < 60:
        return "just now"
    return f"{timesince(moment, now, depth=1)} ago"


def within(moment: datetime.datetime, now: datetime.datetime) -> str:
    """``"in 3 minutes"``; under a minute ``"in under a minute"``."""
    if (moment - now).total_seconds() < 60:
        return "in under a minute"
    return f"in {timeuntil(moment, now, depth=1)}"


def change_url(run_id: str) -> str:
    return reverse("admin:django_jobruns_jobrun_change", args=[run_id])
