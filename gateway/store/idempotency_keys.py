"""Idempotency keys in the state store: one row per (caller key, key), claimed atomically, on either engine.

What a row means is ``gateway.guard.idempotency_rules``; this only keeps rows. Blocking: call from a
worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Protocol

from gateway.guard.idempotency_rules import Seen

#: the migration both engines append (``MIGRATIONS`` in gateway/store/sqlite.py and postgres.py)
KEYS_MIGRATION: Final = (
    """CREATE TABLE idempotency_keys (
    caller     TEXT NOT NULL,
    key        TEXT NOT NULL,
    tool       TEXT NOT NULL,
    digest     TEXT NOT NULL,
    running    INTEGER NOT NULL,
    outcome    TEXT,
    failed     INTEGER NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    correlation_id TEXT,
    owner      TEXT,
    PRIMARY KEY (caller, key)
)""",
    "CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at)",
)


class SqlStore(Protocol):
    """What ``SqliteStore`` and ``PostgresStore`` both offer: a read and a write transaction."""

    def _read(self, what: str, sql: str, params: Sequence[Any] = ()) -> Sequence[Any]: ...

    def _write(self, what: str) -> AbstractContextManager[Any]: ...


@dataclass(frozen=True)
class KeyRecord:
    """One key as stored: who used it (``caller``: the caller's ``CallerKey`` text) for which call, and
    the outcome once it finished."""

    caller: str
    key: str
    tool: str
    digest: str
    running: bool
    created_at: float
    outcome: str | None = None  # the answer's text as sent (a result, or ``{"error": ...}``)
    failed: bool = False
    correlation_id: str | None = None
    #: the process running the first call (``InstanceLock.id``)
    owner: str | None = None

    def seen(self, owner_alive: bool = True) -> Seen:
        return Seen(self.tool, self.digest, self.running, self.created_at, owner_alive)


_COLUMNS: Final = "caller, key, tool, digest, running, outcome, failed, created_at, correlation_id, owner"


def _record(row: Any) -> KeyRecord:
    return KeyRecord(row["caller"], row["key"], row["tool"], row["digest"], bool(row["running"]),
                     float(row["created_at"]), row["outcome"], bool(row["failed"]), row["correlation_id"],
                     row["owner"])


class KeyTable:
    """The ``idempotency_keys`` table of one store."""

    def __init__(self, store: SqlStore, *, placeholder: str = "%s") -> None:
        self.store = store
        self._mark = placeholder

    def _sql(self, sql: str) -> str:
        return sql if self._mark == "%s" else sql.replace("%s", self._mark)

    def get(self, caller: str, key: str) -> KeyRecord | None:
        rows = self.store._read("read an idempotency key", self._sql(
            f"SELECT {_COLUMNS} FROM idempotency_keys WHERE caller = %s AND key = %s"), (caller, key))
        return _record(rows[0]) if rows else None

    def claim(self, rec: KeyRecord, *, replacing: float | None = None) -> bool:
        """Claim ``rec``'s key for a new run: insert it, or (``replacing`` the ``created_at`` of an
        expired row) take that row over. False when another call holds the key (read it again)."""
        with self.store._write("claim an idempotency key") as db:
            if replacing is None:
                cur = db.execute(self._sql(
                    f"INSERT INTO idempotency_keys ({_COLUMNS}) "
                    "VALUES (%s, %s, %s, %s, 1, NULL, 0, %s, %s, %s) ON CONFLICT (caller, key) DO NOTHING"),
                    (rec.caller, rec.key, rec.tool, rec.digest, rec.created_at, rec.correlation_id,
                     rec.owner))
            else:
                cur = db.execute(self._sql(
                    "UPDATE idempotency_keys SET tool = %s, digest = %s, running = 1, outcome = NULL, "
                    "failed = 0, created_at = %s, finished_at = NULL, correlation_id = %s, owner = %s "
                    "WHERE caller = %s AND key = %s AND created_at = %s"),
                    (rec.tool, rec.digest, rec.created_at, rec.correlation_id, rec.owner, rec.caller,
                     rec.key, replacing))
            return bool(cur.rowcount == 1)

    def finish(self, caller: str, key: str, created_at: float, outcome: str, *, failed: bool,
               now: float) -> None:
        """Keep the outcome of the run that claimed the key at ``created_at``."""
        with self.store._write("keep an idempotency key's outcome") as db:
            db.execute(self._sql(
                "UPDATE idempotency_keys SET running = 0, outcome = %s, failed = %s, finished_at = %s "
                "WHERE caller = %s AND key = %s AND created_at = %s"),
                (outcome, int(failed), now, caller, key, created_at))

    def release(self, caller: str, key: str, created_at: float) -> None:
        """Forget the claim of a run that surely changed nothing (a retry with the key runs anew)."""
        with self.store._write("release an idempotency key") as db:
            db.execute(self._sql("DELETE FROM idempotency_keys WHERE caller = %s AND key = %s AND "
                                 "created_at = %s"), (caller, key, created_at))

    def sweep(self, older_than: float) -> int:
        """Drop finished keys created before ``older_than``; how many went."""
        with self.store._write("sweep idempotency keys") as db:
            cur = db.execute(self._sql("DELETE FROM idempotency_keys WHERE running = 0 AND created_at < %s"),
                             (older_than,))
            return int(cur.rowcount)

