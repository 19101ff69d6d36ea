"""The store: the engine's reads and writes of runs and step records, one module per database.

The claim (:mod:`django_jobruns.claims`) and the drive ask the store to read
what is due, claim a run, record a step (with its heartbeat), commit a pass and
write a fenced transition; they never name a database. Each database gets the
statements that suit it:

- :mod:`.base` -- the portable store: one transaction per fenced write, the
  heartbeat (which takes the run's row lock and checks the fence) and then the
  write;
- :mod:`.mysql` -- MariaDB and MySQL: the portable store, deadlocks retried;
- :mod:`.sqlite` -- ``RETURNING`` on the claim and, under ``IMMEDIATE``
  transactions, a read of the fence instead of a heartbeat while more than half
  the lease is left;
- :mod:`.postgresql` -- every fenced write ONE statement (a data-modifying CTE),
  and a plain claim returns the step ledger with the run;
- :mod:`.estimates` -- the admin's row estimates, per database;
- :mod:`.vendors` and :mod:`.errors` -- each database's traits, and what its
  errors mean (a deadlock, a read-only database, a statement too large);
- :mod:`.watchdog` -- a bound on each statement over a network (D15);
- :mod:`.deadlocks` -- whole transactions retried when the database picked them as a deadlock victim;
- :mod:`.notify` -- waking waiting drives: LISTEN/NOTIFY on PostgreSQL, polling elsewhere;
- :mod:`.search_index` -- the admin's search index on each database, opened on each new connection.

A pass of k fresh steps issues 2k+5 statements (k+3 on PostgreSQL), the drive's
due read included. Built by the ORM, each would cost 100-250 µs of Python before
it reached the database -- more, on a fast disk, than the commits the pass pays
for -- so the statements a pass repeats are written once (:mod:`.statements`),
with the tables' and columns' names taken from the models, and executed through
Django's cursor (its transactions, execute wrappers and query logging still
apply).

Every statement goes to the database the project's router names for ``JobRun``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connections

if TYPE_CHECKING:
    from .base import Store

# Nothing of the package is imported here, at the top: the vendor facts
# (vendors, errors) and the statement bound (watchdog) sit below the database
# alias (``django_jobruns.db``), which the stores themselves stand on.

_built: dict[tuple[str, str], Store] = {}
#: ``django_jobruns.db``, imported at the first call (it imports the vendor facts of this package).
_db: list[Any] = []


def store() -> Store:
    """The store of the database the router names for ``JobRun`` (the portable one for a database not below)."""
    if not _db:  # not an import statement on every call: the hot path asks for the store per statement
        from .. import db

        _db.append(db)
    alias = _db[0].alias()
    vendor = connections[alias].vendor
    found = _built.get((alias, vendor))
    if found is None:
        from .base import Store
        from .mysql import MySQLStore
        from .postgresql import PostgresStore
        from .sqlite import SQLiteStore

        stores: dict[str, type[Store]] = {"postgresql": PostgresStore, "sqlite": SQLiteStore, "mysql": MySQLStore}
        found = _built[(alias, vendor)] = stores.get(vendor, Store)(alias)
    return found
