"""``SqliteStore``: the state store on one SQLite file under the gateway home.

Several processes at once: WAL, ``busy_timeout``, every write ``BEGIN IMMEDIATE``; one connection per
thread. Local filesystems only. Modes are set without opening a file SQLite may hold: closing any
descriptor of a file drops the process's POSIX locks on it (another process then rebuilds the
shared-memory index and the first dies of SIGBUS), so the file is created at 0600 before SQLite opens it.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gateway.errors import ConfigError, InvalidArgument, NotFound, StateUnavailable
from gateway.private_files import DIR_MODE, FILE_MODE, make_private_dirs
from gateway.proposals import Approval, Proposal
from gateway.store.base import (
    APPROVAL_COLUMNS,
    CALLER_KEYS_MIGRATION,
    JSON_COLUMNS,
    PROPOSAL_COLUMNS,
    TOKEN_COLUMNS,
    TOKEN_KIND_COLUMN,
    WEB_SESSION_COLUMNS,
    Migration,
    StateStore,
    TokenRecord,
    WebSessionRecord,
    approval_from_row,
    approval_values,
    approvals_migration,
    check_states,
    check_transition,
    name_refused,
    pending_migrations,
    proposal_from_row,
    proposal_values,
    taken_name,
    to_json,
    token_from_row,
    token_values,
    web_session_from_row,
    with_approvals,
)
from gateway.store.idempotency_keys import KEYS_MIGRATION
from gateway.store.request_states import REQUEST_STATES_MIGRATION
from gateway.store.task_records import FOLLOWS_MIGRATION, TASKS_MIGRATION
from gateway.vocabulary import Kind

__all__ = ["SqliteStore", "secure_directory"]

log = logging.getLogger(__name__)

_V1: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO meta (key, value) VALUES ('token_generation', 0)",
    """CREATE TABLE IF NOT EXISTS tokens (
    token_id   TEXT PRIMARY KEY,
    name       TEXT NOT NULL UNIQUE,
    role       TEXT NOT NULL,
    hash       TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    last_used  REAL,
    revoked    INTEGER NOT NULL DEFAULT 0
)""",
    """CREATE TABLE IF NOT EXISTS proposals (
    id                   TEXT PRIMARY KEY,
    token_hash           TEXT NOT NULL UNIQUE,
    caller               TEXT NOT NULL,
    role                 TEXT NOT NULL,
    surface              TEXT NOT NULL,
    target               TEXT NOT NULL,
    target_host          TEXT NOT NULL,
    tool                 TEXT NOT NULL,
    args                 TEXT NOT NULL,
    args_digest          TEXT NOT NULL,
    plan_summary         TEXT NOT NULL,
    affected             TEXT NOT NULL,
    plan_params          TEXT NOT NULL,
    created_at           REAL NOT NULL,
    expires_at           REAL NOT NULL,
    state                TEXT NOT NULL,
    require_web_approval INTEGER NOT NULL,
    approved_by          TEXT,
    decided_at           REAL,
    outcome              TEXT,
    result               TEXT,
    error                TEXT,
    correlation_id       TEXT
)""",
    "CREATE INDEX IF NOT EXISTS proposals_state ON proposals (state, expires_at)",
)
#: the executing claim names the process holding it (``Proposal.executor``)
_V2: Final = ("ALTER TABLE proposals ADD COLUMN executor TEXT",)
_V3: Final = (
    """CREATE TABLE web_sessions (
    key        TEXT PRIMARY KEY,
    token_id   TEXT NOT NULL,
    name       TEXT NOT NULL,
    csrf       TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    last_seen  REAL NOT NULL
)""",
    "CREATE INDEX web_sessions_created ON web_sessions (created_at)",
)
#: every token is a person's or an agent's (``TokenRecord.kind``); tokens made before are agents'
_V4: Final = (TOKEN_KIND_COLUMN,)
#: idempotency keys and MCP tasks, shared by every replica (gateway/store/idempotency_keys.py, tasks.py)
_V5: Final = (*KEYS_MIGRATION, *TASKS_MIGRATION)
#: nothing here: the PostgreSQL schema's audit tree (its version 6); the JSONL log keeps its tree in a file
_V6: Final[tuple[str, ...]] = ()
#: N of M: each proposal's approval rule, blast radius and digest as shown, and one row per approval
_V7: Final = approvals_migration("REAL")
#: every caller's stable key beside its display name (``gateway.auth.principal.CallerKey``)
_V8: Final = CALLER_KEYS_MIGRATION
#: 2026-07-28 confirmation rounds: the sealing secret every replica shares, and the spent states
_V9: Final = REQUEST_STATES_MIGRATION
#: the proposal a task follows (``TaskRecord.follows``), for a replica answering after its process died
_V10: Final = FOLLOWS_MIGRATION
#: the schema's history; the version is kept in ``PRAGMA user_version``. Append, never edit.
MIGRATIONS: Final[tuple[Migration, ...]] = (
    (1, _V1), (2, _V2), (3, _V3), (4, _V4), (5, _V5), (6, _V6), (7, _V7), (8, _V8), (9, _V9),
    (10, _V10),
)
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]
_TOKEN_COLUMNS: Final = ", ".join(TOKEN_COLUMNS)
_SESSION_COLUMNS: Final = ", ".join(WEB_SESSION_COLUMNS)


def secure_directory(directory: Path) -> None:
    """Create ``directory`` at mode 0700, or tighten it if this user owns it; refuse a directory other
    users can reach that this user cannot fix."""
    make_private_dirs(directory)
    st = directory.stat()
    if not st.st_mode & 0o077:
        return
    if st.st_uid != os.getuid():
        raise ConfigError(f"{directory}: the state directory is open to other users and owned by someone "
                          "else; point GATEWAY_HOME (--home) at a directory only the gateway's user can use")
    log.warning("%s: tightening permissions to 0700 (it holds token hashes and pending actions)", directory)
    os.chmod(directory, DIR_MODE)


#: one ``SqliteStore`` of this process at a time creates a database file (see ``_private_database``)
_CREATING: Final = threading.Lock()


def _private_database(path: Path) -> None:
    """The database file at 0600 before SQLite opens it, and its ``-wal`` and ``-shm`` no wider.

    A missing database is created empty (``O_EXCL``: no process can hold a lock on a file that did not
    exist) and its descriptor closed before SQLite opens it. Files already there are never opened:
    they are tightened by name. A symbolic link is refused."""
    with _CREATING:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            pass
        else:
            os.close(fd)
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        _tighten_by_name(file)


def _tighten_by_name(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "a symbolic link is not accepted as the state store", str(path))
    if st.st_mode & 0o077:
        os.chmod(path, FILE_MODE)  # by name: opening and closing it would drop SQLite's locks


class SqliteStore:
    """The ``StateStore`` on one SQLite file; see the module docstring for the concurrency model."""

    def __init__(self, path: Path, *, busy_timeout: float = 5.0) -> None:
        self.path = Path(path)
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[tuple[weakref.ref[threading.Thread], sqlite3.Connection]] = []
        self._closed = False
        try:
            secure_directory(self.path.parent)
            _private_database(self.path)
        except OSError as exc:
            raise StateUnavailable(f"cannot create the state store {self.path} ({exc.strerror}); check that "
                                   "GATEWAY_HOME is writable by the gateway's user") from exc
        self._migrate()

    # -- connections ---------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        self._enter_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _enter_wal(self, conn: sqlite3.Connection) -> None:
        """Switch to WAL, retrying while another process is switching the same new file.

        Changing the journal mode upgrades a shared lock to an exclusive one; when another
        connection is doing the same, SQLite answers "database is locked" at once instead of
        calling the busy handler (waiting could deadlock), so the retry has to be ours. Once
        the file is in WAL mode the pragma is a read and never contends.
        """
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.005
        while True:
            try:
                mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                mode = ""
            if mode == "wal":
                return
            if time.monotonic() >= deadline:
                raise sqlite3.OperationalError(
                    f"database is locked: could not switch to WAL journal mode (still {mode or 'locked'})")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not self._closed:
            return conn
        with self._lock:
            if self._closed:
                raise StateUnavailable("the state store is closed; the gateway is shutting down")
            self._prune_dead_threads()
            conn = self._open()
            self._connections.append((weakref.ref(threading.current_thread()), conn))
        self._local.conn = conn
        return conn

    def _prune_dead_threads(self) -> None:
        alive = []
        for ref, conn in self._connections:
            thread = ref()
            if thread is not None and thread.is_alive():
                alive.append((ref, conn))
            else:
                conn.close()
        self._connections = alive

    @contextmanager
    def _failing_as(self, what: str) -> Iterator[None]:
        """Translate storage failures at this one boundary; the details go to the log only."""
        try:
            yield
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            log.error("state store %s: cannot %s: %s", self.path, what, exc)
            raise StateUnavailable(
                f"the state store cannot {what} right now; retry, and if it persists see the gateway log "
                "(disk full, permissions, or a process holding a lock)") from exc

    def _read(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._failing_as(what):
            return self._conn().execute(sql, params).fetchall()

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._failing_as(what):
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _migrate(self) -> None:
        with self._write("initialise its schema") as db:
            current = int(db.execute("PRAGMA user_version").fetchone()[0])
            for version, statements in pending_migrations(current, MIGRATIONS, str(self.path)):
                for statement in statements:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version={int(version)}")
                log.info("state store %s: schema migrated to version %d", self.path, version)

    def schema_version(self) -> int:
        return int(self._read("read its schema version", "PRAGMA user_version")[0][0])

    def ping(self) -> bool:
        try:
            return bool(self._read("answer a ping", "SELECT 1")[0][0] == 1)
        except StateUnavailable:
            return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _, conn in self._connections:
                conn.close()
            self._connections = []

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tokens --------------------------------------------------------------------------------

    @staticmethod
    def _bump_generation(db: sqlite3.Connection) -> None:
        db.execute("UPDATE meta SET value = value + 1 WHERE key = 'token_generation'")

    def add_token(self, rec: TokenRecord) -> None:
        try:
            with self._write("add a token") as db:
                taken = taken_name([r["name"] for r in db.execute("SELECT name FROM tokens").fetchall()],
                                   rec.name)
                if taken is not None:
                    raise name_refused(rec.name, taken)
                marks = ", ".join("?" * len(TOKEN_COLUMNS))
                db.execute(f"INSERT INTO tokens ({_TOKEN_COLUMNS}) VALUES ({marks})", token_values(rec))
                self._bump_generation(db)
        except sqlite3.IntegrityError as exc:
            raise InvalidArgument("name", f"a token named {rec.name!r} already exists (names of revoked "
                                  "tokens stay taken, so sessions of a leaked token cannot be continued); "
                                  "pick a new name") from exc

    def token_by_id(self, token_id: str) -> TokenRecord | None:
        rows = self._read("read a token", f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE token_id = ?",
                          (token_id,))
        return token_from_row(rows[0]) if rows else None

    def token_by_name(self, name: str) -> TokenRecord | None:
        rows = self._read("read a token", f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE name = ?", (name,))
        return token_from_row(rows[0]) if rows else None

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._read("list tokens", f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY name")
        return [token_from_row(r) for r in rows]

    def update_token(self, name: str, *, role: str | None = None, revoked: bool | None = None,
                     kind: Kind | None = None) -> TokenRecord:
        with self._write("update a token") as db:
            row = db.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no token named {name!r}; `gateway token list` shows the names")
            current = token_from_row(row)
            if revoked is False and current.revoked:
                raise InvalidArgument("revoked", f"token {name!r} is revoked and cannot be reinstated; "
                                      "create a new token instead")
            new = replace(current, role=current.role if role is None else role,
                          revoked=current.revoked if revoked is None else revoked,
                          kind=current.kind if kind is None else Kind(kind))
            db.execute("UPDATE tokens SET role = ?, revoked = ?, kind = ? WHERE name = ?",
                       (new.role, int(new.revoked), new.kind.value, name))
            self._bump_generation(db)
        return new

    def touch_token(self, token_id: str, when: float) -> None:
        with self._write("record a token's use") as db:
            db.execute("UPDATE tokens SET last_used = ? "
                       "WHERE token_id = ? AND (last_used IS NULL OR last_used < ?)", (when, token_id, when))

    def token_generation(self) -> int:
        rows = self._read("read the token generation",
                          "SELECT value FROM meta WHERE key = 'token_generation'")
        return int(rows[0][0])

    # -- proposals -----------------------------------------------------------------------------

    def add_proposal(self, p: Proposal) -> None:
        marks = ", ".join("?" * len(PROPOSAL_COLUMNS))
        try:
            with self._write("record a proposal") as db:
                db.execute(f"INSERT INTO proposals ({', '.join(PROPOSAL_COLUMNS)}) VALUES ({marks})",
                           proposal_values(p))
        except sqlite3.IntegrityError as exc:
            raise InvalidArgument("id", f"proposal {p.id!r} or its token hash already exists") from exc

    def _proposals(self, where: str, params: Sequence[Any]) -> list[Proposal]:
        sql = f"SELECT {', '.join(PROPOSAL_COLUMNS)} FROM proposals {where}"
        found = [proposal_from_row(r) for r in self._read("read proposals", sql, params)]
        if not found:
            return found
        ids = [p.id for p in found]
        rows = self._read("read approvals", f"SELECT {', '.join(APPROVAL_COLUMNS)} FROM approvals WHERE "
                          f"proposal_id IN ({', '.join('?' * len(ids))}) ORDER BY at, approver", ids)
        return with_approvals(found, [approval_from_row(r) for r in rows])

    def add_approval(self, a: Approval) -> bool:
        marks = ", ".join("?" * len(APPROVAL_COLUMNS))
        with self._write("record an approval") as db:
            cursor = db.execute(
                f"INSERT OR IGNORE INTO approvals ({', '.join(APPROVAL_COLUMNS)}) SELECT {marks} "
                "WHERE EXISTS (SELECT 1 FROM proposals WHERE id = ? AND state = 'pending') AND NOT EXISTS "
                "(SELECT 1 FROM approvals WHERE proposal_id = ? AND approver_key = ?)",
                (*approval_values(a), a.proposal_id, a.proposal_id, a.approver_key))
            return cursor.rowcount == 1

    def get_proposal(self, proposal_id: str) -> Proposal | None:
        found = self._proposals("WHERE id = ?", (proposal_id,))
        return found[0] if found else None

    def proposal_by_token_hash(self, token_hash: str) -> Proposal | None:
        found = self._proposals("WHERE token_hash = ?", (token_hash,))
        return found[0] if found else None

    def list_proposals(
        self, states: Sequence[str] | None = None, limit: int = 200, *, due_before: float | None = None
    ) -> list[Proposal]:
        clauses: list[str] = []
        params: list[Any] = []
        if states is not None:
            check_states(states)
            clauses.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(states)
        if due_before is not None:
            clauses.append("expires_at <= ?")
            params.append(due_before)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        order = "expires_at ASC" if due_before is not None else "created_at DESC"
        return self._proposals(f"{where}ORDER BY {order}, id LIMIT ?", [*params, int(limit)])

    def transition(self, proposal_id: str, from_states: Sequence[str], to_state: str, **fields: Any) -> bool:
        from_states = check_transition(from_states, to_state, fields)
        sets = ["state = ?", *(f"{k} = ?" for k in fields)]
        values = [to_state, *(to_json(v) if k in JSON_COLUMNS else v for k, v in fields.items())]
        marks = ", ".join("?" * len(from_states))
        with self._write("update a proposal") as db:
            cursor = db.execute(f"UPDATE proposals SET {', '.join(sets)} WHERE id = ? AND state IN ({marks})",
                                [*values, proposal_id, *from_states])
            return cursor.rowcount == 1

    # -- web sessions --------------------------------------------------------------------------

    def add_web_session(self, rec: WebSessionRecord, *, idle: float, max_sessions: int) -> None:
        marks = ", ".join("?" * len(WEB_SESSION_COLUMNS))
        with self._write("record a sign-in") as db:
            db.execute("DELETE FROM web_sessions WHERE expires_at <= ? OR last_seen <= ?",
                       (rec.created_at, rec.created_at - idle))
            db.execute("DELETE FROM web_sessions WHERE key IN (SELECT key FROM web_sessions "
                       "ORDER BY created_at DESC, key LIMIT -1 OFFSET ?)", (max(0, max_sessions - 1),))
            db.execute(f"INSERT INTO web_sessions ({_SESSION_COLUMNS}) VALUES ({marks})",
                       tuple(getattr(rec, c) for c in WEB_SESSION_COLUMNS))

    def touch_web_session(self, key: str, now: float, idle: float) -> WebSessionRecord | None:
        with self._write("read a sign-in") as db:
            row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM web_sessions WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            found = web_session_from_row(row)
            if now >= found.expires_at or now - found.last_seen >= idle:
                db.execute("DELETE FROM web_sessions WHERE key = ?", (key,))
                return None
            db.execute("UPDATE web_sessions SET last_seen = MAX(last_seen, ?) WHERE key = ?", (now, key))
            return replace(found, last_seen=max(found.last_seen, now))

    def end_web_session(self, key: str) -> WebSessionRecord | None:
        with self._write("end a sign-in") as db:
            row = db.execute(f"DELETE FROM web_sessions WHERE key = ? RETURNING {_SESSION_COLUMNS}",
                             (key,)).fetchone()
            return None if row is None else web_session_from_row(row)

    def count_web_sessions(self) -> int:
        return int(self._read("count sign-ins", "SELECT count(*) FROM web_sessions")[0][0])



if TYPE_CHECKING:
    def _implements(store: SqliteStore) -> StateStore:
        return store
