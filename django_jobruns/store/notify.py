"""Waking drives that wait for work: NOTIFY on PostgreSQL, polling elsewhere."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import DatabaseError, connections, transaction

from .. import db
from ..outcomes import summary
from . import vendors, watchdog

logger = logging.getLogger("django_jobruns")

CHANNEL = "django_jobruns"


def notify() -> None:
    """Send a NOTIFY on PostgreSQL when the current transaction commits (at once outside one)."""
    wrapper = db.connection()
    if not vendors.of(wrapper).notifies:
        return

    def send() -> None:
        try:
            with wrapper.cursor() as cur:
                cur.execute("SELECT pg_notify(%s, '')", [CHANNEL])
        except DatabaseError:
            # Only a wake-up: waiting drives poll as well, so a lost one costs latency, not work.
            logger.warning("could not notify waiting drives", exc_info=True)

    transaction.on_commit(send, using=wrapper.alias)


#: How long a waiting drive sleeps between looks at the due runs where nothing wakes
#: it (SQLite, MariaDB), and, on PostgreSQL, between looks while no NOTIFY came
#: (for backoffs ending and leases lapsing, which send none).
POLL_SECONDS = 0.2
LISTEN_POLL_SECONDS = 1.0
#: How long a drive waits for its own probe NOTIFY before it concludes wake-ups cannot arrive.
PROBE_SECONDS = 1.0
#: The longest a wait goes without looking at the stop signal.
_SLICE = 0.1


class Waiter:
    """Waits, within a drive's time budget, until work may have arrived or the stop signal is set."""

    def __init__(self, stop: Any, bound: float | None = None) -> None:
        self.stop = stop
        #: The drive's bound on one statement: the LISTEN and the probe are cut past it (D15).
        self.bound = bound
        self.woken = threading.Event()
        self.raw: Any = None
        #: The connection whose LISTEN was checked to hear a NOTIFY.
        self.probed: Any = None
        #: Wake-ups cannot arrive on this database's connections: poll.
        self.deaf = False

    def __enter__(self) -> Waiter:
        self._listen()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.raw is not None:
            try:
                wrapper = db.connection()
                if wrapper.connection is self.raw:
                    # Bounded as the LISTEN was: a partition here would hold the drive's end.
                    with watchdog.bounding(self.bound), watchdog.guarded(wrapper), wrapper.cursor() as cur:
                        cur.execute(f"UNLISTEN {CHANNEL}")
            except Exception:
                logger.debug("UNLISTEN failed", exc_info=True)
            self.raw = None

    def _listen(self) -> None:
        """LISTEN on PostgreSQL, on the drive's own connection.

        Issued again as each wait begins (idempotent, and only when idle): it
        re-establishes a connection that was replaced, and shows an operator
        in ``pg_stat_activity`` which drives are waiting for work.
        """
        wrapper = db.connection()
        if not vendors.of(wrapper).notifies or self.deaf:
            return
        try:
            with watchdog.bounding(self.bound):
                self._listen_on(wrapper)
        except DatabaseError as exc:
            logger.warning("could not LISTEN for new work (%s); polling instead", summary(exc))
            logger.debug("the LISTEN's error", exc_info=True)
            self.raw = None
        except Exception:
            # The driver's own error (psycopg's, not Django's): the connection
            # broke under the probe. Poll; the next statement replaces it.
            logger.warning("lost the LISTEN connection; polling instead", exc_info=True)
            self.raw = None
            if not wrapper.in_atomic_block:
                wrapper.close()

    def _listen_on(self, wrapper: Any) -> None:
        with watchdog.guarded(wrapper), wrapper.cursor() as cur:  # the cursor opens a connection where none is
            cur.execute(f"LISTEN {CHANNEL}")
        # psycopg 3.2+: notifications that arrive while the drive works
        # wait in the connection's backlog. Other drivers: poll.
        self.raw = wrapper.connection if hasattr(wrapper.connection, "notifies") else None
        if self.raw is not None and self.raw is not self.probed:
            self._probe(wrapper)

    def _probe(self, wrapper: Any) -> None:
        """Check, once per connection, that a NOTIFY reaches this LISTEN; else poll at the SQLite rate.

        Behind a pooler in transaction mode (PgBouncer's ``pool_mode =
        transaction``) the LISTEN succeeds on whichever server connection ran
        it, which then serves other clients: no wake-up ever arrives. The probe
        tells, at the cost of one short-lived second connection and one
        statement per drive connection (and a second of waiting where it fails).
        """
        token = f"probe:{id(self)}:{time.monotonic_ns()}"
        # Sent from another connection, as a start would be: behind a pooler the
        # drive's own statement could share its server connection and be heard.
        other = connections.create_connection(wrapper.alias)
        try:
            with watchdog.guarded(other), other.cursor() as cur:
                cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, token])
        finally:
            other.close()
        heard = False
        for note in self.raw.notifies(timeout=PROBE_SECONDS):
            if note.payload == token:
                heard = True
                break
            self.woken.set()  # real work announced meanwhile
        self.probed = self.raw
        if not heard:
            logger.warning(
                "a NOTIFY from another connection never reached its LISTEN (a pooler in transaction mode, such "
                "as PgBouncer's?): waking for new work by polling every %.1f s instead",
                POLL_SECONDS,
            )
            self.deaf = True
            self.raw = None

    def stopped(self) -> bool:
        return self.stop is not None and bool(self.stop.is_set())

    def listening(self) -> bool:
        """Whether a NOTIFY can reach this drive (PostgreSQL's LISTEN, heard by its probe)."""
        return self.raw is not None

    def heard(self) -> bool:
        """Whether a NOTIFY arrived since the last look, without waiting (all of them taken: one look answers all)."""
        if self.raw is None:
            return False
        try:
            return bool(list(self.raw.notifies(timeout=0)))
        except Exception:  # the driver's own error: the connection broke; poll from here on
            logger.warning("lost the LISTEN connection; polling instead", exc_info=True)
            self.raw = None
            return False

    def wait(self, deadline: float) -> None:
        """Return when work may have arrived, the stop signal is set, a poll interval passed, or ``deadline``."""
        self._listen()
        interval = LISTEN_POLL_SECONDS if self.raw is not None else POLL_SECONDS
        end = min(deadline, time.monotonic() + interval)
        if self.heard():
            return  # what arrived while the drive worked
        while not self.woken.is_set() and not self.stopped():
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            step = min(remaining, _SLICE)
            if self.raw is not None:
                try:
                    for _ in self.raw.notifies(timeout=step, stop_after=1):
                        self.woken.set()
                except Exception:  # the driver's own error: the connection broke; poll from here on
                    logger.warning("lost the LISTEN connection; polling instead", exc_info=True)
                    self.raw = None
            elif hasattr(self.stop, "wait"):
                self.stop.wait(step)  # returns at once when the stop signal is set
            else:
                time.sleep(step)
        self.woken.clear()
