"""A TCP forwarder of the tests' own between a worker and the database, which delays what crosses it.

It keeps both sockets open and never resets them: what a busy pooler, a stuck
load balancer or a half-dead NAT does to a connection. A rule sees each chunk
of bytes with its direction (``"up"``: worker to database, ``"down"``: back) and
returns how many seconds to hold it; the chunks behind it wait too, in order.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Rule = Callable[[str, bytes], float]


class Forwarder:
    def __init__(self, host: str, port: int, rule: Rule) -> None:
        self.target = (host, port)
        self.rule = rule
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = []
        #: How many chunks the rule held, by direction: evidence the fault was injected.
        self.held = {"up": 0, "down": 0}
        #: Set: a partition. Nothing crosses any more, both ways, and nothing is closed.
        self.partitioned = threading.Event()
        #: Cleared: a held partition. Nothing crosses until it is set again, then
        #: everything held crosses, in order: a link that stalls and then recovers.
        self.flowing = threading.Event()
        self.flowing.set()
        #: New connections accepted while partitioned (a worker trying to reconnect).
        self.accepted_while_partitioned = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.partitioned.is_set():
                self.accepted_while_partitioned += 1
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        # PostgreSQL's statements prepared on this connection, by name: what a chunk that only names
        # one (Bind) carries is shown to the rule with the statement's text, as if sent with it.
        prepared: dict[bytes, bytes] = {}
        while True:
            try:
                chunk = source.recv(65536)
            except OSError:
                return
            if not chunk:
                try:
                    sink.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if self.partitioned.is_set():
                continue  # dropped: read (so the sender's kernel sees it taken) and never passed on
            self.flowing.wait()  # held: this chunk and those behind it wait for the link to recover
            delay = self.rule(direction, with_prepared_text(chunk, prepared) if direction == "up" else chunk)
            if delay > 0:
                self.held[direction] += 1
                # The held chunk's own delay; a close of the forwarder ends it early.
                self.closed.wait(delay)
            try:
                sink.sendall(chunk)
            except OSError:
                return

    def hold(self) -> None:
        """Hold all traffic both ways (sockets open) until :meth:`deliver`."""
        self.flowing.clear()

    def deliver(self) -> None:
        """Let what was held cross, in order, and traffic flow again."""
        self.flowing.set()

    def close(self) -> None:
        self.closed.set()
        self.flowing.set()
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.close()
            except OSError:
                pass


#: psycopg's prepared statements on the wire (the extended protocol): a Parse that names the
#: statement it prepares, and a Bind that runs one by its name.
_PARSE_NAMED = re.compile(rb"P.{4}(_pg3_\d+)\x00(.*?)\x00", re.S)
_BIND_NAMED = re.compile(rb"B.{4}[^\x00]*\x00(_pg3_\d+)\x00", re.S)


def with_prepared_text(chunk: bytes, prepared: dict[bytes, bytes]) -> bytes:
    """``chunk``, followed by the text of each prepared statement it runs by name (learnt from its Parse)."""
    for name, text in _PARSE_NAMED.findall(chunk):
        prepared[name] = text
    texts = [prepared[name] for name in _BIND_NAMED.findall(chunk) if name in prepared]
    return chunk + b"\x00".join([b"", *texts]) if texts else chunk


@contextmanager
def forwarding(host: str, port: int, rule: Rule | None = None) -> Iterator[Forwarder]:
    forwarder = Forwarder(host, port, rule or (lambda leg, chunk: 0.0))
    try:
        yield forwarder
    finally:
        forwarder.close()


#: What the engine's reading of the database's clock looks like on the wire: the
#: statement going up, the column name of its answer coming down.
CLOCK_READING = {
    "up": (b"SELECT clock_timestamp()", b"SELECT UTC_TIMESTAMP(6)"),
    "down": (b"clock_timestamp", b"UTC_TIMESTAMP(6)"),
}


def delay_clock_reading(direction: str, seconds: float) -> Rule:
    """Hold the clock reading on one leg only (``"up"`` or ``"down"``) for ``seconds``."""

    def rule(leg: str, chunk: bytes) -> float:
        return seconds if leg == direction and any(mark in chunk for mark in CLOCK_READING[leg]) else 0.0

    return rule


#: The engine's statements as they cross the wire (client-side parameters, as
#: Django sends them), by what each does in a drive. Quoting differs by vendor.
_Q = rb"[`\"]"
STATEMENT_KINDS: dict[str, Any] = {
    "due": re.compile(rb"ORDER BY COALESCE\("),
    "claim": re.compile(
        rb"UPDATE " + _Q + rb"django_jobruns_jobrun" + _Q + rb" SET .*lease_expires_at" + _Q + rb" (IS NULL OR|<=)",
        re.S,
    ),
    "commit": re.compile(rb"SET " + _Q + rb"cursor" + _Q + rb" = "),
    "step": re.compile(rb"(INSERT INTO|UPDATE) " + _Q + rb"django_jobruns_jobstep" + _Q),
    "release": re.compile(
        rb"SET " + _Q + rb"lease_holder" + _Q + rb" = NULL, " + _Q + rb"lease_expires_at" + _Q + rb" = NULL WHERE"
    ),
    "renew": re.compile(
        rb"UPDATE " + _Q + rb"django_jobruns_jobrun" + _Q + rb" SET " + _Q + rb"lease_expires_at" + _Q + rb" = "
    ),
    "ledger": re.compile(rb"(SELECT|DELETE) .*FROM " + _Q + rb"django_jobruns_jobstep" + _Q, re.S),
}
#: The statement that opens MariaDB's two-statement writes' second half: the
#: run's row is locked by the first (the heartbeat or the commit's UPDATE).
SECOND_OF_A_FENCED_WRITE = re.compile(rb"(INSERT INTO|UPDATE|DELETE FROM) `django_jobruns_jobstep`")
_RUN_ID = re.compile(rb"'([0-9A-HJKMNP-TV-Z]{26})'")


def statement_kind(chunk: bytes) -> str | None:
    """Which of the engine's statements ``chunk`` (going up) carries, if any; the first match wins."""
    for kind, pattern in STATEMENT_KINDS.items():
        if pattern.search(chunk):
            return kind
    return None


def run_id_in(chunk: bytes) -> str | None:
    """The first run id a statement names (a ULID in quotes), if any."""
    found = _RUN_ID.search(chunk)
    return found.group(1).decode() if found else None
