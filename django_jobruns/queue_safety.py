"""Queue safety: only JSON's own values may cross into a run's record.

A payload (at start) and a cursor (at every commit) are stored as JSON text and
read back by a later pass, perhaps in another process after a deploy. A value
that JSON silently drops or reshapes on that trip -- a tuple that comes back a
list, a datetime that comes back a string, an integer dict key that comes back
text, NaN that some readers refuse -- would let a run resume against something
other than what it was given, and nothing would say so. Such values are refused
here, naming the path, before anything is written.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from . import conf
from .exceptions import (
    InvalidPassResult,
    InvalidStepName,
    QueueUnsafe,
    StepResultUnstorable,
    TaskValueUnstorable,
    UndecodableRun,
)

_WHY = "a run carries ids and configuration: JSON's own values (dict, list, str, int, float, bool, None)"

#: Deepest nesting a payload or cursor may have (Q3): far more than ids and
#: configuration need, and well inside what every JSON reader and the admin's
#: rendering handle without running out of stack.
MAX_DEPTH = 64
#: Integers are carried exactly only within the signed 64-bit range (Q3):
#: beyond it, JSON readers in other languages, and JSON columns, round them.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def _describe(value: Any) -> str:
    if isinstance(value, float):
        return f"{value!r}, which JSON cannot represent"
    if isinstance(value, tuple):
        return "a tuple, which JSON stores as a list"
    if isinstance(value, (set, frozenset)):
        return f"a {type(value).__name__}, which JSON cannot store"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{type(value).__name__}, which JSON cannot store"
    kind = type(value)
    if isinstance(value, (dict, list, str, int, float)):
        base = next(t for t in (dict, list, str, int, float) if isinstance(value, t))
        name = f"{kind.__module__}.{kind.__qualname__}"
        return f"an instance of {name}, a subclass of {base.__name__} JSON would not keep"
    return f"an instance of {kind.__module__}.{kind.__qualname__}"


def check_queue_safe(value: Any, root: str) -> None:
    """Raise :class:`QueueUnsafe` unless ``value`` survives JSON unchanged.

    ``root`` names the value in the message (``"payload"``, ``"cursor"``); the
    path of the first offending value is appended with dots, list indexes as
    numbers: ``payload.items.3``.
    """
    on_path: set[int] = set()

    def refuse(path: str, what: str) -> None:
        raise QueueUnsafe(f"{root} is not queue-safe: {path} is {what}; {_WHY}", path=path)

    def walk(item: Any, path: str, depth: int) -> None:
        kind = type(item)
        if item is None or kind is bool or kind is str:
            return
        if kind is int:
            if not INT_MIN <= item <= INT_MAX:
                refuse(
                    path,
                    f"an integer of {item.bit_length()} bits, outside the signed 64-bit range "
                    "JSON readers carry exactly",
                )
            return
        if kind is float:
            if not math.isfinite(item):
                refuse(path, _describe(item))
            return
        if kind is not dict and kind is not list:
            refuse(path, _describe(item))
        if id(item) in on_path:
            refuse(path, "a cycle back to a value already on this path")
        if depth >= MAX_DEPTH:
            refuse(path, f"nested deeper than {MAX_DEPTH} levels")
        on_path.add(id(item))
        if kind is list:
            for index, element in enumerate(item):
                walk(element, f"{path}.{index}", depth + 1)
        else:
            for key, element in item.items():
                if type(key) is not str:
                    refuse(
                        f"{path}.{key!r:.100}", f"under a key of type {type(key).__name__}; JSON object keys are text"
                    )
                walk(element, f"{path}.{key}", depth + 1)
        on_path.discard(id(item))

    walk(value, root, 0)


def dump_queue_safe(value: Any, root: str) -> str:
    """Check ``value`` and return its JSON text, refusing it over ``JOBRUNS['PAYLOAD_MAX_BYTES']``."""
    check_queue_safe(value, root)
    return _within_cap(
        json.dumps(value, allow_nan=False, separators=(",", ":")),
        "PAYLOAD_MAX_BYTES",
        lambda size, cap: QueueUnsafe(
            f"{root} is not queue-safe: {root} is {size} bytes as JSON, over the cap of {cap} "
            "(JOBRUNS['PAYLOAD_MAX_BYTES']); a run carries ids and configuration, not the data itself",
            path=root,
        ),
    )


def dump_counters(counters: dict[str, int | float]) -> str:
    """A pass's counters as committed, refused over ``JOBRUNS['PAYLOAD_MAX_BYTES']``, the cap of the cursor
    committed beside them: one counter name per item would grow them past any write the database takes."""
    return _within_cap(
        json.dumps(counters, separators=(",", ":")),
        "PAYLOAD_MAX_BYTES",
        lambda size, cap: QueueUnsafe(
            f"counters are {size} bytes as JSON ({len(counters)} names), over the cap of {cap} "
            "(JOBRUNS['PAYLOAD_MAX_BYTES']); count totals, not one name per item",
            path="counters",
        ),
    )


def dump_result(value: Any) -> str:
    """Return a step result's stored form.

    Not held to queue safety: a step result is the handler's own value, read back
    by the handler. Dates, decimals and UUIDs become the text Django's encoder
    gives them, and the handler receives that text on the first run and on replay
    alike. Raises ``TypeError`` for a value with no JSON form at all.
    """
    return json.dumps(value, cls=DjangoJSONEncoder, separators=(",", ":"))


def decode(text: str | None, what: str) -> Any:
    """A run's stored JSON ``what`` (payload, cursor, counters) decoded, else :class:`UndecodableRun`."""
    try:
        return json.loads(text) if text is not None else None
    except (TypeError, ValueError) as exc:
        raise UndecodableRun(f"cannot decode the run's {what}: {exc}") from None
    except RecursionError:
        raise UndecodableRun(f"cannot decode the run's {what}: nested too deeply") from None


def decode_counters(text: str | None) -> dict[str, int | float]:
    """A run's counters decoded: a JSON object of finite numbers, else :class:`UndecodableRun`."""
    counters = decode(text, "counters")
    if not isinstance(counters, dict):
        raise UndecodableRun(f"the run's counters are not a JSON object: {text!r:.200}")
    for name, value in counters.items():
        if type(value) not in (int, float) or not math.isfinite(value):
            raise UndecodableRun(f"the run's counter {name!r} is not a finite number: {value!r:.100}")
    return counters


#: The keys a handler's result may have.
_RESULT_KEYS = ("cursor", "done")


@dataclass(frozen=True, slots=True)
class Stored:
    """A cursor already in its stored form, checked by the rules of what made it.

    A task's return value is the one: Django's rules, not a job cursor's (Q3),
    decide what it may hold, and its size is a stored result's.
    """

    text: str


def dump_task_value(value: Any) -> Stored:
    """A task's return value, in its JSON form already, as stored; refused past ``STEP_RESULT_MAX_BYTES``."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    refusal = "a result is stored: keep large data elsewhere and return its key"
    return Stored(
        _within_cap(
            text,
            "STEP_RESULT_MAX_BYTES",
            lambda size, cap: TaskValueUnstorable(
                f"the task's return value is {size} bytes as JSON, over the cap of {cap} "
                f"(JOBRUNS['STEP_RESULT_MAX_BYTES']); {refusal}"
            ),
        )
    )


def check_result_size(name: str, stored: str) -> None:
    """Refuse a step result over ``JOBRUNS["STEP_RESULT_MAX_BYTES"]``: every database must be able to store it."""
    _within_cap(
        stored,
        "STEP_RESULT_MAX_BYTES",
        lambda size, cap: StepResultUnstorable(
            f"step {name!r} returned {size} bytes as JSON, over the cap of {cap} (JOBRUNS['STEP_RESULT_MAX_BYTES']); "
            "a step's result is stored: keep large data elsewhere and return its key"
        ),
    )


def _within_cap(text: str, setting: str, refusal: Callable[[int, int], Exception]) -> str:
    """``text``, or ``refusal(size, cap)`` raised if it is larger in bytes than the cap ``JOBRUNS[setting]``."""
    cap = int(conf.get(setting))
    if len(text) * 4 > cap:  # UTF-8 takes at most four bytes a character: shorter text is not encoded
        size = len(text.encode())
        if size > cap:
            raise refusal(size, cap)
    return text


def unstorable(text: str) -> str | None:
    """Why a database cannot store ``text`` as it is (a NUL, a lone surrogate), or ``None``.

    Said after the value, as in ``f"step name {name!r} {why}"``. A lone
    surrogate is what Python makes of a byte that is not UTF-8 in the command
    line or the environment.
    """
    if "\x00" in text:
        return "contains NUL, which databases cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text (a lone surrogate: a byte that was not UTF-8?), which databases cannot store"
    return None


def check_step_name(name: Any) -> None:
    """Refuse, before the body runs, a step name the database cannot store."""
    if not isinstance(name, str) or not name or len(name) > 255:
        raise InvalidStepName(f"a step name is non-empty text of at most 255 characters, got {name!r:.300}")
    why = unstorable(name)
    if why is not None:
        raise InvalidStepName(f"step name {name!r:.300} {why}")


def interpret_result(result: Any, current_cursor: str | None) -> tuple[str | None, bool]:
    """Return ``(cursor text to store, done)`` for a handler's return value.

    A missing ``cursor`` key keeps the cursor; ``{"cursor": None}`` resets it
    (stored as JSON ``null``). Any other key is refused, so a typo cannot
    silently keep the cursor.
    """
    if result is None:
        return current_cursor, False
    if not isinstance(result, Mapping):
        raise InvalidPassResult(
            "a handler returns None or a mapping with 'cursor' and/or 'done', "
            f"got {type(result).__name__}: {result!r:.200}"
        )
    unknown = [key for key in result if key not in _RESULT_KEYS]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), _RESULT_KEYS, n=1)
            hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        raise InvalidPassResult(
            f"the handler's result has unknown key(s) {', '.join(hints)}; only 'cursor' and 'done' are allowed"
        )
    done = result.get("done", False)
    if type(done) is not bool:
        raise InvalidPassResult(f"the handler's 'done' must be True or False, got {done!r:.100}")
    if "cursor" not in result:
        return current_cursor, done
    cursor = result["cursor"]
    return (cursor.text if type(cursor) is Stored else dump_queue_safe(cursor, "cursor")), done
