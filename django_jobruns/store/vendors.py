"""What the engine knows of each database, as facts: the one place that names a vendor's traits.

The modules that act on these facts -- the clock (:mod:`django_jobruns.db`),
the statement bound (:mod:`.watchdog`), the wake-ups (:mod:`.notify`) -- ask
:func:`of` instead of testing ``connection.vendor`` themselves. This module
imports nothing of the package, so any of them may import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Vendor:
    """One database's traits, as far as the engine acts on them."""

    #: The statement that reads the server's clock (D12); ``None``: the host's clock is the database's.
    clock: str | None = None
    #: Reached over a network: its statements are bounded, its connects get a timeout (D15).
    networked: bool = False
    #: Its driver may wait on the network holding the interpreter's lock (mysqlclient).
    holds_the_lock: bool = False
    #: It sends wake-ups to waiting drives (LISTEN/NOTIFY).
    notifies: bool = False
    #: Whether a transaction is open on its driver's connection, as the driver knows without asking the
    #: server (a ``BEGIN`` sent as text, which Django does not see); ``None``: the driver does not say.
    in_transaction: Callable[[Any], bool] | None = None


#: Each database the engine knows; another gets :data:`OTHER`.
VENDORS: dict[str, Vendor] = {
    "postgresql": Vendor(
        clock="SELECT clock_timestamp()",
        networked=True,
        notifies=True,
        # libpq's INTRANS or INERROR; not UNKNOWN, a connection gone bad, which holds nothing open.
        in_transaction=lambda raw: raw.pgconn.transaction_status in (2, 3),
    ),
    "mysql": Vendor(clock="SELECT UTC_TIMESTAMP(6)", networked=True, holds_the_lock=True),
    "sqlite": Vendor(in_transaction=lambda raw: bool(raw.in_transaction)),
}
OTHER = Vendor()


def of(wrapper: Any) -> Vendor:
    """The traits of the database behind Django's connection ``wrapper``."""
    return VENDORS.get(wrapper.vendor, OTHER)
