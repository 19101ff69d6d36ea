"""Jobs the benchmarks drive."""

from __future__ import annotations

import time
from typing import Any

from django_jobruns import job


@job()
def five_steps(p: Any) -> dict[str, Any]:
    """One pass of five trivial steps."""
    for index in range(5):
        p.step(f"s{index}", lambda index=index: index)
    return {"done": True}


@job()
def io_steps(p: Any) -> dict[str, Any]:
    """``passes`` passes of ``steps`` steps, each waiting ``wait`` seconds on (simulated) I/O."""
    position = p.cursor or 0
    for index in range(p.payload["steps"]):
        p.step(f"p{position}-s{index}", lambda: time.sleep(p.payload["wait"]))
    p.count("passes")
    following = position + 1
    return {"cursor": following, "done": following >= p.payload["passes"]}


@job()
def stamp(p: Any) -> dict[str, Any]:
    """One step that records when its body started, kept in a counter (the latency bench's evidence)."""
    p.count("body_at", p.step("stamp", time.time))
    return {"done": True}


@job()
def chunked(p: Any) -> dict[str, Any]:
    """``passes`` passes of one trivial step each (the backlog bench)."""
    position = p.cursor or 0
    p.step(f"s{position}", lambda: position)
    p.count("passes")
    following = position + 1
    return {"cursor": following, "done": following >= p.payload["passes"]}
