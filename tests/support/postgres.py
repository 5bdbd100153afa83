"""A real PostgreSQL server for tests, from Debian's ``postgresql`` package.

``start_postgres(directory)`` runs ``initdb`` into ``directory`` and ``pg_ctl start`` on a free loopback
port (password authentication, scram-sha-256), as the ``postgres`` OS user when the tests run as root
(PostgreSQL refuses to run as root). ``PgServer.create_database()`` gives each test its own database.
Durability is switched off (fsync) because the data directory is thrown away.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from gateway.store import SqliteStore, StateStore
from gateway.store.postgres import PostgresStore
from support import tier

BIN_DIRS = (Path("/usr/lib/postgresql/15/bin"), Path("/usr/lib/postgresql/16/bin"),
            Path("/usr/lib/postgresql/17/bin"))
SUPERUSER = "gwtest"
START_SECONDS = 60.0


class PostgresError(RuntimeError):
    """PostgreSQL could not be found or started."""


def bin_dir() -> Path:
    for candidate in BIN_DIRS:
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise PostgresError("initdb not found; install Debian's postgresql package (apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class PgServer:
    """One running server; ``url(dbname)`` connects as the superuser with a password."""

    directory: Path
    port: int
    password: str = field(repr=False)
    user: str | None  # the OS user the server runs as (None: this one)
    bin: Path
    _counter: int = 0

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        self._counter += 1
        name = f"t{os.getpid()}_{self._counter}_{secrets.token_hex(3)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.url(name)

    def pg_ctl(self, *args: str, timeout: float = START_SECONDS) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), *args],
                              user=self.user, capture_output=True, text=True, timeout=timeout, check=False)

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("stop", "-m", mode, "-w")

    def start(self) -> None:
        log = self.directory / "server.log"
        done = self.pg_ctl("start", "-w", "-t", str(int(START_SECONDS)), "-l", str(log),
                           "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 "
                                 f"-c unix_socket_directories={self.directory} -c fsync=off "
                                 "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise PostgresError(f"pg_ctl start failed ({done.returncode}): {done.stderr.strip()} {tail}")


def start_postgres() -> PgServer:
    """initdb + pg_ctl start in a new temporary directory (given to the postgres user when root);
    ``discard`` stops the server and removes the directory."""
    tier.start("postgres")
    binaries = bin_dir()
    user: str | None = None
    top = Path(tempfile.mkdtemp(prefix="gw-pg-"))
    os.chmod(top, 0o711)  # the server's user passes through; only root lists it
    directory = top / "pg"
    directory.mkdir(mode=0o700)
    if os.getuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresError("running as root and no postgres user to run the server as") from None
        user = "postgres"
        os.chown(directory, owner.pw_uid, owner.pw_gid)  # its parents must let that user through (/tmp)
    password = secrets.token_urlsafe(16)
    pwfile = directory / "pw"
    pwfile.write_text(password)
    if user is not None:
        shutil.chown(pwfile, user)
    done = subprocess.run([str(binaries / "initdb"), "-D", str(directory / "data"), "-U", SUPERUSER,
                           "--pwfile", str(pwfile), "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
                           "--no-sync"],
                          user=user, capture_output=True, text=True, timeout=120, check=False)
    pwfile.unlink()
    if done.returncode != 0:
        shutil.rmtree(top, ignore_errors=True)
        raise PostgresError(f"initdb failed: {done.stderr.strip()[-2000:]}")
    last: Exception | None = None
    for _ in range(3):  # the free port may be taken between choosing and binding it
        server = PgServer(directory, _free_port(), password, user, binaries)
        try:
            server.start()
            wait_until_accepting(server)
            return server
        except PostgresError as exc:
            last = exc
    shutil.rmtree(top, ignore_errors=True)
    raise PostgresError(str(last))


def wait_until_accepting(server: PgServer, deadline_seconds: float = START_SECONDS) -> None:
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            with psycopg.connect(server.url(), connect_timeout=2):
                return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise PostgresError(f"the server never accepted connections: {exc}") from None
            time.sleep(0.05)


def discard(server: PgServer) -> None:
    """Stop the server at once and remove its directory."""
    with contextlib.suppress(Exception):
        server.stop("immediate")
    shutil.rmtree(server.directory.parent, ignore_errors=True)


def open_store_at(location: str) -> StateStore:
    """The store at ``location``: a ``postgresql://`` URL or the path of a SQLite file."""
    if location.startswith("postgresql://"):
        return PostgresStore(location)
    return SqliteStore(Path(location))


def wait_for(condition: Callable[[], bool], what: str, deadline_seconds: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {deadline_seconds:g} s")
        time.sleep(0.1)
