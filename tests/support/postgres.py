"""A private PostgreSQL cluster for tests and the bench: Debian's binaries, a throw-away
data folder, a free loopback port, trust authentication, stopped by its PID.

`initdb` and `postgres` refuse to run as root, so as root they run as the `postgres` system
user, on a folder that user owns (made under the system temp folder, whose parents anyone
may traverse; pytest's own temp folder is private to root). Only the standard library here
(psycopg only where a database is made), so the bench can use it as it is.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

# Newest first; PG_BIN names another folder.
CANDIDATES = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)


class PostgresUnavailable(Exception):
    """No PostgreSQL here (binaries, the postgres user) or it would not start: the reason."""


def binaries() -> str:
    folder = os.environ.get("PG_BIN") or next((c for c in CANDIDATES if os.access(f"{c}/initdb", os.X_OK)), "")
    if not folder or not all(os.access(f"{folder}/{tool}", os.X_OK) for tool in ("initdb", "postgres")):
        raise PostgresUnavailable(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; run scripts/install-test-services.sh)"
        )
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresCluster:
    """One cluster: `start()`, then `args(dbname)` for libpq, `create_database`, `stop()`."""

    def __init__(self, folder: str | None = None) -> None:
        """`folder`: where the cluster lives (made; its parents must be traversable by the
        postgres user); by default a new one under the system temp folder."""
        self.bin = binaries()
        self.run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root, and there is no postgres user to run PostgreSQL as") from None
            self.run_as = {"user": account.pw_uid, "group": account.pw_gid}
        if folder is None:
            folder = tempfile.mkdtemp(prefix="homeserver-pg-")
        else:
            os.makedirs(folder, mode=0o700)
        self.folder = folder
        if self.run_as:
            os.chown(self.folder, self.run_as["user"], self.run_as["group"])
        self.data = os.path.join(self.folder, "data")
        self.log_path = os.path.join(self.folder, "postgres.log")
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def _run(self, *args: str) -> None:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=120, **self.run_as)
        if done.returncode:
            raise PostgresUnavailable(f"{os.path.basename(args[0])} failed: {done.stderr.strip()[-800:]}")

    def start(self) -> None:
        self._run(f"{self.bin}/initdb", "-D", self.data, "--auth=trust", "--username=postgres",
                  "--encoding=UTF8", "--locale=C", "--no-instructions")
        for _ in range(3):  # a lost race for the port: another one
            self.port = free_port()
            log = open(self.log_path, "ab")
            self.process = subprocess.Popen(
                [f"{self.bin}/postgres", "-D", self.data, "-p", str(self.port), "-k", self.folder,
                 "-c", "listen_addresses=127.0.0.1",
                 # A test cluster: nothing here must survive a crash of the machine.
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                **self.run_as,
            )
            log.close()
            if self._wait_ready():
                return
            self.stop()
        raise PostgresUnavailable(f"postgres did not start: {self.log()[-1500:]}")

    def _wait_ready(self, limit: float = 30) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            if self._accepts():
                return True
            time.sleep(0.1)
        return False

    def _accepts(self) -> bool:
        """pg_isready says the server takes connections (not just that the port is open)."""
        ready = subprocess.run(
            [f"{self.bin}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True
        )
        return ready.returncode == 0

    def args(self, dbname: str = "postgres") -> dict[str, Any]:
        """Synapse's `database.args` for `dbname` (psycopg2's names; also libpq's)."""
        return {"user": "postgres", "host": "127.0.0.1", "port": self.port, "database": dbname}

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def sql(self, statement: str, dbname: str = "postgres") -> None:
        """One statement outside a transaction (CREATE DATABASE needs that)."""
        import psycopg

        with psycopg.connect(self.conninfo(dbname), autocommit=True) as conn:
            conn.execute(statement.encode())

    def create_database(self, name: str, template: str | None = None) -> None:
        """A database as Synapse wants one (UTF8, C collation: the cluster's own)."""
        if template is None:
            self.sql(f'CREATE DATABASE "{name}"')
            return
        import psycopg

        try:  # a file copy is several times faster for a template of Synapse's 200 tables (15+)
            self.sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        except psycopg.errors.SyntaxError:
            self.sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def drop_database(self, name: str) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log(self) -> str:
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as fh:
            return fh.read()
        return ""

    def stop(self) -> None:
        """A fast shutdown (SIGINT) by PID; SIGKILL to its process group if it hangs."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()
