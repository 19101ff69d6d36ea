"""What a database error means, decided here once: a deadlock, a read-only database, a statement too large.

Each database says these things in its own words -- an SQLSTATE on
PostgreSQL, an error number on MariaDB/MySQL, a message on SQLite -- and
Django wraps each driver's error in its own classes, with the driver's
error as the cause. This module imports nothing of the package.
"""

from __future__ import annotations

from typing import Any

from django.db import OperationalError

#: PostgreSQL's deadlock_detected and serialization_failure.
_DEADLOCK_STATES = {"40P01", "40001"}
#: MariaDB/MySQL's ER_LOCK_DEADLOCK.
_DEADLOCK_CODE = 1213
#: PostgreSQL's read_only_sql_transaction (a standby, default_transaction_read_only).
_READ_ONLY_STATE = "25006"
#: MariaDB/MySQL's --read-only server (1290) and read-only transaction (1792).
_READ_ONLY_CODES = (1290, 1792)
#: How each database says it refuses writes, in words: SQLite's read-only file,
#: PostgreSQL's read-only transaction, MariaDB's and MySQL's --read-only server.
_READ_ONLY_WORDS = ("attempt to write a readonly database", "read-only transaction", "--read-only option")
#: MariaDB/MySQL error numbers of a statement too large for the server (``max_allowed_packet``).
_TOO_LARGE_CODES = (1153, 1301)
#: MariaDB/MySQL's "server has gone away" (2006) and "lost connection" (2013): also what
#: a statement over ``max_allowed_packet`` gets, the server closing the connection on it.
_GONE_CODES = (2006, 2013)


def _code(exc: BaseException) -> Any:
    """The driver's error number (MariaDB/MySQL), from the driver's error or Django's wrapping of it."""
    args: Any = getattr(exc.__cause__ or exc, "args", None)
    return args[0] if args else None


def _state(exc: BaseException) -> Any:
    """The driver's SQLSTATE (psycopg), if the cause carries one."""
    return getattr(getattr(exc, "__cause__", None), "sqlstate", None)


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` is a deadlock (or serialization failure) the database rolled back."""
    if not isinstance(exc, OperationalError):
        return False
    return _state(exc) in _DEADLOCK_STATES or _code(exc) == _DEADLOCK_CODE


def refuses_writes(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is read-only (not a passing failure: every write will fail alike)."""
    if _state(exc) == _READ_ONLY_STATE:
        return True
    args = getattr(exc, "args", ())
    if args and args[0] in _READ_ONLY_CODES:
        return True
    text = str(exc)
    return any(words in text for words in _READ_ONLY_WORDS)


def too_large(exc: BaseException) -> bool:
    """Whether the database refused a statement for its size: no retry makes it fit."""
    return _code(exc) in _TOO_LARGE_CODES


def gone_away(exc: BaseException) -> bool:
    """Whether MariaDB/MySQL dropped the connection under the statement (or refused it so, for its size)."""
    return _code(exc) in _GONE_CODES
