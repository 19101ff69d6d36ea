"""PgBouncer in transaction mode, started by the tests in front of the test database (Debian's ``pgbouncer``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager


def available() -> bool:
    return shutil.which("pgbouncer") is not None or os.path.exists("/usr/sbin/pgbouncer")


@contextmanager
def pgbouncer(host: str, port: int, database: str, pool_size: int = 2) -> Iterator[int]:
    """Run PgBouncer (transaction pooling) for ``database``; yield the port it listens on."""
    folder = tempfile.mkdtemp(prefix="jobruns-pgbouncer-")
    os.chmod(folder, 0o777)
    with socket.create_server(("127.0.0.1", 0)) as probe:
        listen = probe.getsockname()[1]
    config = os.path.join(folder, "pgbouncer.ini")
    users = os.path.join(folder, "users.txt")
    with open(users, "w") as out:
        out.write('"postgres" ""\n')
    with open(config, "w") as out:
        out.write(
            "[databases]\n"
            f"{database} = host={host} port={port} dbname={database}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {listen}\n"
            f"unix_socket_dir = {folder}\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n"
        )
    for path in (config, users):
        os.chmod(path, 0o644)
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    command = [binary, config] if os.geteuid() != 0 else [binary, "-u", "postgres", config]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", listen), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    said = process.stdout.read() if process.stdout else ""
                    raise RuntimeError(f"pgbouncer did not start: {said}") from None
                time.sleep(0.05)
        yield listen
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
