"""``PostgresStore``: the state store on a PostgreSQL database shared by several gateway replicas.

``transition`` is one ``UPDATE ... WHERE state = ANY(...)``: under READ COMMITTED of two replicas
confirming at once exactly one wins. Statement and lock timeouts make a stuck database
``StateUnavailable``, not a hung call. Migrations run once under an advisory lock. The URL's password
stays in the pool's connection string; errors name the database by ``display_url``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from gateway.errors import ConfigError, InvalidArgument, NotFound, StateUnavailable
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

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresStore", "display_url", "is_postgres_url"]

log = logging.getLogger(__name__)

#: key of the transaction-scoped advisory lock that serialises schema migrations across replicas
MIGRATION_LOCK: Final = 0x67_61_74_65_77_61_79  # "gateway"

_V1: Final = (
    "CREATE TABLE meta (key text PRIMARY KEY, value bigint NOT NULL)",
    "INSERT INTO meta (key, value) VALUES ('token_generation', 0)",
    """CREATE TABLE tokens (
    token_id   text PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    role       text NOT NULL,
    hash       text NOT NULL,
    created_at double precision NOT NULL,
    expires_at double precision,
    last_used  double precision,
    revoked    boolean NOT NULL DEFAULT false
)""",
    """CREATE TABLE proposals (
    id                   text PRIMARY KEY,
    token_hash           text NOT NULL UNIQUE,
    caller               text NOT NULL,
    role                 text NOT NULL,
    surface              text NOT NULL,
    target               text NOT NULL,
    target_host          text NOT NULL,
    tool                 text NOT NULL,
    args                 text NOT NULL,
    args_digest          text NOT NULL,
    plan_summary         text NOT NULL,
    affected             text NOT NULL,
    plan_params          text NOT NULL,
    created_at           double precision NOT NULL,
    expires_at           double precision NOT NULL,
    state                text NOT NULL,
    require_web_approval boolean NOT NULL,
    approved_by          text,
    decided_at           double precision,
    outcome              text,
    result               text,
    error                text,
    correlation_id       text,
    executor             text
)""",
    "CREATE INDEX proposals_state ON proposals (state, expires_at)",
    """CREATE TABLE web_sessions (
    key        text PRIMARY KEY,
    token_id   text NOT NULL,
    name       text NOT NULL,
    csrf       text NOT NULL,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    last_seen  double precision NOT NULL
)""",
    "CREATE INDEX web_sessions_created ON web_sessions (created_at)",
    # The audit chain of every replica (gateway.audit.pg_sink): ``body`` is the row exactly as
    # stamped; the other columns copy fields of it for filtering.
    """CREATE TABLE audit_rows (
    seq            bigint PRIMARY KEY,
    ts             text NOT NULL,
    phase          text,
    tool           text,
    target         text,
    caller         text,
    correlation_id text,
    hash           text NOT NULL,
    body           text NOT NULL
)""",
    "CREATE INDEX audit_rows_ts ON audit_rows (ts)",
)
_V2: Final = (
    # rate limits and the runaway breaker counted across replicas (gateway.store.limits_pg)
    "CREATE TABLE rate_events (key text NOT NULL, at double precision NOT NULL)",
    "CREATE INDEX rate_events_key_at ON rate_events (key, at)",
    """CREATE TABLE breaker_state (
    key           text PRIMARY KEY,
    times         double precision[] NOT NULL,
    tripped_until double precision NOT NULL DEFAULT 0
)""",
)
_V3: Final = (
    # signed heads of the audit chain (gateway.audit.pg_sink): ``body`` is the checkpoint exactly as
    # signed (``gateway.audit.signing.sign_checkpoint``), ``seq`` copies its seq for reading in order.
    """CREATE TABLE audit_checkpoints (
    id   bigserial PRIMARY KEY,
    seq  bigint NOT NULL,
    body text NOT NULL
)""",
)
#: every token is a person's or an agent's (``TokenRecord.kind``); tokens made before are agents'
_V4: Final = (TOKEN_KIND_COLUMN,)
#: idempotency keys and MCP tasks, shared by every replica (gateway/store/idempotency_keys.py, tasks.py)
_V5: Final = (*KEYS_MIGRATION, *TASKS_MIGRATION)
#: the Merkle tree over ``audit_rows`` (gateway.audit.pg_tree): every complete subtree's hash once, at its
#: position in ``gateway.audit.merkle.stored_hash_index``; written in the row's own transaction
_V6: Final = (
    "CREATE TABLE audit_tree (idx bigint PRIMARY KEY, hash bytea NOT NULL)",
    # the oldest seq kept after retention pruned older rows (gateway.audit.pg_retention); one row at most
    """CREATE TABLE audit_retention (
    id        smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    first_seq bigint NOT NULL
)""",
)
#: N of M: each proposal's approval rule, blast radius and digest as shown, and one row per approval
_V7: Final = approvals_migration("double precision")
#: every caller's stable key beside its display name (``gateway.auth.principal.CallerKey``)
_V8: Final = CALLER_KEYS_MIGRATION
#: 2026-07-28 confirmation rounds: the sealing secret every replica shares, and the spent states
_V9: Final = REQUEST_STATES_MIGRATION
#: the proposal a task follows (``TaskRecord.follows``), for a replica answering after its process died
_V10: Final = FOLLOWS_MIGRATION
#: the schema's history, kept in ``schema_version``. Append, never edit.
MIGRATIONS: Final[tuple[Migration, ...]] = (
    (1, _V1), (2, _V2), (3, _V3), (4, _V4), (5, _V5), (6, _V6), (7, _V7), (8, _V8), (9, _V9),
    (10, _V10),
)
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]

#: how long a readiness probe waits for a connection
PROBE_SECONDS: Final = 1.5
_TOKENS: Final = ", ".join(TOKEN_COLUMNS)
_PROPOSALS: Final = ", ".join(PROPOSAL_COLUMNS)
_SESSIONS: Final = ", ".join(WEB_SESSION_COLUMNS)
_SCHEMES: Final = ("postgresql://", "postgres://")


def is_postgres_url(url: str) -> bool:
    return url.strip().lower().startswith(_SCHEMES)


def display_url(url: str) -> str:
    """The database as errors and logs may name it: ``postgresql://user@host:port/dbname``, never the
    password (wherever the URL carried it)."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://(unparseable URL)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host') or 'localhost'}{port}/{parts.get('dbname') or ''}"


class PostgresStore:
    """The ``StateStore`` on PostgreSQL; see the module docstring for the concurrency model."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 5.0,
                 statement_timeout: float = 15.0, name: str = "gateway") -> None:
        if not is_postgres_url(url):
            raise ConfigError("the database URL must start with postgresql:// (GATEWAY_DATABASE_URL)")
        self.where = display_url(url)
        try:
            conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            raise ConfigError(f"GATEWAY_DATABASE_URL is not a valid PostgreSQL URL ({self.where}); use "
                              "postgresql://USER@HOST:PORT/DBNAME with the password in PGPASSFILE") from None
        ms = int(statement_timeout * 1000)
        self.pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, timeout=timeout, open=False, name=name,
            check=ConnectionPool.check_connection,
            kwargs={"autocommit": True, "row_factory": dict_row, "connect_timeout": max(1, int(timeout)),
                    "application_name": "vsphere-mcp-gateway",
                    "options": f"-c statement_timeout={ms} -c lock_timeout={ms} "
                               f"-c idle_in_transaction_session_timeout={ms}"},
        )
        try:
            self.pool.open(wait=True, timeout=timeout)
        except psycopg.Error as exc:
            self.pool.close()
            log.error("state store %s: cannot connect: %s", self.where, exc)
            raise StateUnavailable(f"cannot reach the database {self.where}; check that PostgreSQL runs and "
                                   "the URL, user and password (PGPASSFILE) are right; details are in the "
                                   "gateway log") from None
        self._closed = False
        try:
            self.migrate()
        except BaseException:
            self.pool.close()
            raise

    # -- connections ---------------------------------------------------------------------------

    @contextmanager
    def _failing_as(self, what: str) -> Iterator[None]:
        """Translate database failures at this one boundary; the details go to the log only."""
        if self._closed:
            raise StateUnavailable("the state store is closed; the gateway is shutting down")
        try:
            yield
        except psycopg.errors.UniqueViolation:
            raise
        except psycopg.Error as exc:
            log.error("state store %s: cannot %s: %s", self.where, what, exc)
            raise StateUnavailable(
                f"the state store cannot {what} right now: its database does not answer; retry, and if it "
                "persists see the gateway log") from None

    def _read(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._failing_as(what), self.pool.connection() as conn:
            return conn.execute(sql, params).fetchall()  # type: ignore[return-value]

    @contextmanager
    def _write(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        with self._failing_as(what), self.pool.connection() as conn, conn.transaction():
            yield conn

    def migrate(self) -> list[int]:
        """Run the migrations this database lacks (all replicas serialise on an advisory lock);
        return the versions applied. ``ConfigError`` if the schema is newer than this code."""
        applied = []
        with self._write("initialise its schema") as db:
            db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (one boolean PRIMARY KEY DEFAULT true "
                       "CHECK (one), version integer NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            current = int(row["version"]) if row else 0
            for version, statements in pending_migrations(current, MIGRATIONS, self.where):
                for statement in statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_version (one, version) VALUES (true, %s) "
                           "ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version", (version,))
                applied.append(version)
                log.info("state store %s: schema migrated to version %d", self.where, version)
        return applied

    def schema_version(self) -> int:
        return int(self._read("read its schema version", "SELECT version FROM schema_version")[0]["version"])

    def ping(self, timeout: float = PROBE_SECONDS) -> bool:
        """Whether the database answers within ``timeout`` seconds (readiness probes are short)."""
        if self._closed:
            return False
        try:
            with self.pool.connection(timeout=timeout) as conn:
                conn.execute("SELECT 1")
                return True
        except psycopg.Error:
            return False

    def close(self) -> None:
        self._closed = True
        self.pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tokens --------------------------------------------------------------------------------

    @staticmethod
    def _bump_generation(db: psycopg.Connection[Any]) -> None:
        db.execute("UPDATE meta SET value = value + 1 WHERE key = 'token_generation'")

    def add_token(self, rec: TokenRecord) -> None:
        try:
            with self._write("add a token") as db:
                db.execute("LOCK TABLE tokens IN SHARE ROW EXCLUSIVE MODE")
                taken = taken_name([r["name"] for r in db.execute("SELECT name FROM tokens").fetchall()],
                                   rec.name)
                if taken is not None:
                    raise name_refused(rec.name, taken)
                marks = ", ".join(["%s"] * len(TOKEN_COLUMNS))
                db.execute(f"INSERT INTO tokens ({_TOKENS}) VALUES ({marks})", token_values(rec))
                self._bump_generation(db)
        except psycopg.errors.UniqueViolation:
            raise InvalidArgument("name", f"a token named {rec.name!r} already exists (names of revoked "
                                  "tokens stay taken, so sessions of a leaked token cannot be continued); "
                                  "pick a new name") from None

    def token_by_id(self, token_id: str) -> TokenRecord | None:
        rows = self._read("read a token", f"SELECT {_TOKENS} FROM tokens WHERE token_id = %s", (token_id,))
        return token_from_row(rows[0]) if rows else None

    def token_by_name(self, name: str) -> TokenRecord | None:
        rows = self._read("read a token", f"SELECT {_TOKENS} FROM tokens WHERE name = %s", (name,))
        return token_from_row(rows[0]) if rows else None

    def list_tokens(self) -> list[TokenRecord]:
        rows = self._read("list tokens", f'SELECT {_TOKENS} FROM tokens ORDER BY name COLLATE "C"')
        return [token_from_row(r) for r in rows]

    def update_token(self, name: str, *, role: str | None = None, revoked: bool | None = None,
                     kind: Kind | None = None) -> TokenRecord:
        with self._write("update a token") as db:
            row = db.execute(f"SELECT {_TOKENS} FROM tokens WHERE name = %s FOR UPDATE",
                             (name,)).fetchone()
            if row is None:
                raise NotFound(f"no token named {name!r}; `gateway token list` shows the names")
            current = token_from_row(row)
            if revoked is False and current.revoked:
                raise InvalidArgument("revoked", f"token {name!r} is revoked and cannot be reinstated; "
                                      "create a new token instead")
            new = replace(current, role=current.role if role is None else role,
                          revoked=current.revoked if revoked is None else revoked,
                          kind=current.kind if kind is None else Kind(kind))
            db.execute("UPDATE tokens SET role = %s, revoked = %s, kind = %s WHERE name = %s",
                       (new.role, new.revoked, new.kind.value, name))
            self._bump_generation(db)
        return new

    def touch_token(self, token_id: str, when: float) -> None:
        with self._write("record a token's use") as db:
            db.execute("UPDATE tokens SET last_used = %s "
                       "WHERE token_id = %s AND (last_used IS NULL OR last_used < %s)",
                       (when, token_id, when))

    def token_generation(self) -> int:
        rows = self._read("read the token generation",
                          "SELECT value FROM meta WHERE key = 'token_generation'")
        return int(rows[0]["value"])

    # -- proposals -----------------------------------------------------------------------------

    def add_proposal(self, p: Proposal) -> None:
        marks = ", ".join(["%s"] * len(PROPOSAL_COLUMNS))
        try:
            with self._write("record a proposal") as db:
                db.execute(f"INSERT INTO proposals ({_PROPOSALS}) VALUES ({marks})", proposal_values(p))
        except psycopg.errors.UniqueViolation:
            raise InvalidArgument("id", f"proposal {p.id!r} or its token hash already exists") from None

    def _proposals(self, where: str, params: Sequence[Any]) -> list[Proposal]:
        rows = self._read("read proposals", f"SELECT {_PROPOSALS} FROM proposals {where}", params)
        found = [proposal_from_row(r) for r in rows]
        if not found:
            return found
        rows = self._read("read approvals", f"SELECT {', '.join(APPROVAL_COLUMNS)} FROM approvals WHERE "
                          "proposal_id = ANY(%s) ORDER BY at, approver COLLATE \"C\"",
                          ([p.id for p in found],))
        return with_approvals(found, [approval_from_row(r) for r in rows])

    def add_approval(self, a: Approval) -> bool:
        marks = ", ".join(["%s"] * len(APPROVAL_COLUMNS))
        with self._write("record an approval") as db:
            cursor = db.execute(
                f"INSERT INTO approvals ({', '.join(APPROVAL_COLUMNS)}) SELECT {marks} WHERE EXISTS "
                "(SELECT 1 FROM proposals WHERE id = %s AND state = 'pending') AND NOT EXISTS "
                "(SELECT 1 FROM approvals WHERE proposal_id = %s AND approver_key = %s) "
                "ON CONFLICT DO NOTHING",
                (*approval_values(a), a.proposal_id, a.proposal_id, a.approver_key))
            return cursor.rowcount == 1

    def get_proposal(self, proposal_id: str) -> Proposal | None:
        found = self._proposals("WHERE id = %s", (proposal_id,))
        return found[0] if found else None

    def proposal_by_token_hash(self, token_hash: str) -> Proposal | None:
        found = self._proposals("WHERE token_hash = %s", (token_hash,))
        return found[0] if found else None

    def list_proposals(
        self, states: Sequence[str] | None = None, limit: int = 200, *, due_before: float | None = None
    ) -> list[Proposal]:
        clauses: list[str] = []
        params: list[Any] = []
        if states is not None:
            check_states(states)
            clauses.append("state = ANY(%s)")
            params.append(list(states))
        if due_before is not None:
            clauses.append("expires_at <= %s")
            params.append(due_before)
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        order = "expires_at ASC" if due_before is not None else "created_at DESC"
        return self._proposals(f"{where}ORDER BY {order}, id COLLATE \"C\" LIMIT %s", [*params, int(limit)])

    def transition(self, proposal_id: str, from_states: Sequence[str], to_state: str, **fields: Any) -> bool:
        from_states = check_transition(from_states, to_state, fields)
        sets = ["state = %s", *(f"{k} = %s" for k in fields)]
        values = [to_state, *(to_json(v) if k in JSON_COLUMNS else v for k, v in fields.items())]
        with self._write("update a proposal") as db:
            cursor = db.execute(f"UPDATE proposals SET {', '.join(sets)} WHERE id = %s AND state = ANY(%s)",
                                [*values, proposal_id, list(from_states)])
            return cursor.rowcount == 1

    # -- web sessions --------------------------------------------------------------------------

    def add_web_session(self, rec: WebSessionRecord, *, idle: float, max_sessions: int) -> None:
        marks = ", ".join(["%s"] * len(WEB_SESSION_COLUMNS))
        with self._write("record a sign-in") as db:
            db.execute("DELETE FROM web_sessions WHERE expires_at <= %s OR last_seen <= %s",
                       (rec.created_at, rec.created_at - idle))
            db.execute("DELETE FROM web_sessions WHERE key IN (SELECT key FROM web_sessions "
                       "ORDER BY created_at DESC, key OFFSET %s)", (max(0, max_sessions - 1),))
            db.execute(f"INSERT INTO web_sessions ({_SESSIONS}) VALUES ({marks})",
                       tuple(getattr(rec, c) for c in WEB_SESSION_COLUMNS))

    def touch_web_session(self, key: str, now: float, idle: float) -> WebSessionRecord | None:
        with self._write("read a sign-in") as db:
            row = db.execute(f"UPDATE web_sessions SET last_seen = GREATEST(last_seen, %s) WHERE key = %s "
                             f"AND expires_at > %s AND last_seen > %s RETURNING {_SESSIONS}",
                             (now, key, now, now - idle)).fetchone()
            if row is None:
                db.execute("DELETE FROM web_sessions WHERE key = %s", (key,))
                return None
            return web_session_from_row(row)

    def end_web_session(self, key: str) -> WebSessionRecord | None:
        with self._write("end a sign-in") as db:
            row = db.execute(f"DELETE FROM web_sessions WHERE key = %s RETURNING {_SESSIONS}",
                             (key,)).fetchone()
            return None if row is None else web_session_from_row(row)

    def count_web_sessions(self) -> int:
        return int(self._read("count sign-ins", "SELECT count(*) AS n FROM web_sessions")[0]["n"])


if TYPE_CHECKING:
    def _implements(store: PostgresStore) -> StateStore:
        return store
