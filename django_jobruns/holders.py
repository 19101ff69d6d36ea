"""Who holds a claim: the holder's name a drive claims as (D6).

The holder tells a renewal from a theft (:mod:`.claims`), so it is per
process: two workers sharing one would take claims from each other.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from typing import Any

from .exceptions import InvalidDriveOptions
from .queue_safety import unstorable

_holder_lock = threading.Lock()
_holder: tuple[int, str] | None = None


def default_holder() -> str:
    """Return this process's holder name: host, pid and a random suffix.

    Per process, never per deployment: the holder is what tells a renewal from
    a theft, so two workers sharing one would take claims from each other.
    Recomputed after a fork, since the child is another worker.
    """
    global _holder
    pid = os.getpid()
    with _holder_lock:
        if _holder is None or _holder[0] != pid:
            _holder = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}")
        return _holder[1]


def holder_name(value: Any) -> str:
    """The holder a drive claims as: ``value`` checked (D6), or :func:`default_holder` for ``None``."""
    if value is None:
        return default_holder()
    if not isinstance(value, str) or not value.strip():
        raise InvalidDriveOptions(
            f"holder must be non-empty text, got {value!r}: it tells a renewal from a theft, "
            "so use something per process, such as a pod name plus a pid"
        )
    if len(value) > 255:
        raise InvalidDriveOptions(f"holder must be at most 255 characters, got {len(value)}")
    why = unstorable(value)
    if why is not None:
        raise InvalidDriveOptions(f"holder {value!r:.300} {why}")
    return value
