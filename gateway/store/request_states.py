"""The state store's part in 2026-07-28 confirmation rounds: the sealing secret and the spent states.

A round's ``requestState`` (``gateway.server.proposals.request_state``) is sealed under a key derived
from one secret every replica reads here (made by the first process that needs it), and is spent once:
its id is a row here, so a replay is refused on any replica. Rows go once their state has expired.
Blocking: call from a worker thread.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

#: the migration both engines append (``MIGRATIONS`` in gateway/store/sqlite.py and postgres.py)
REQUEST_STATES_MIGRATION: Final = (
    """CREATE TABLE request_state_secrets (
    kid        TEXT PRIMARY KEY,
    secret     TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
)""",
    """CREATE TABLE spent_request_states (
    id          TEXT PRIMARY KEY,
    caller      TEXT NOT NULL,
    proposal_id TEXT NOT NULL,
    spent_at    DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL
)""",
    "CREATE INDEX spent_request_states_expires ON spent_request_states (expires_at)",
)
#: the one secret's row (a second row, for a rotation, would sit beside it)
CURRENT: Final = "current"


class SqlStore(Protocol):
    """What ``SqliteStore`` and ``PostgresStore`` both offer: a read and a write transaction."""

    def _read(self, what: str, sql: str, params: Sequence[Any] = ()) -> Sequence[Any]: ...

    def _write(self, what: str) -> AbstractContextManager[Any]: ...


class RequestStates:
    """The ``request_state_secrets`` and ``spent_request_states`` tables of one store."""

    def __init__(self, store: SqlStore, *, placeholder: str = "%s") -> None:
        self.store = store
        self._mark = placeholder

    def _sql(self, sql: str) -> str:
        return sql if self._mark == "%s" else sql.replace("%s", self._mark)

    def secret(self, now: float) -> bytes:
        """The sealing secret every replica shares: the stored one, or a fresh one stored now (the first
        process to store it wins; every other reads that one)."""
        with self.store._write("keep the request-state secret") as db:
            db.execute(self._sql("INSERT INTO request_state_secrets (kid, secret, created_at) "
                                 "VALUES (%s, %s, %s) ON CONFLICT (kid) DO NOTHING"),
                       (CURRENT, secrets.token_hex(32), now))
        rows = self.store._read("read the request-state secret", self._sql(
            "SELECT secret FROM request_state_secrets WHERE kid = %s"), (CURRENT,))
        return bytes.fromhex(str(rows[0]["secret"]))

    def spend(self, state_id: str, caller: str, proposal_id: str, now: float, expires_at: float) -> bool:
        """Spend a state once: True the first time, False for any replay (on any replica)."""
        with self.store._write("spend a request state") as db:
            cur = db.execute(self._sql(
                "INSERT INTO spent_request_states (id, caller, proposal_id, spent_at, expires_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING"),
                (state_id, caller, proposal_id, now, expires_at))
            return bool(cur.rowcount == 1)

    def sweep(self, now: float) -> int:
        """Forget spent states past their expiry (an expired state is refused before it is looked up)."""
        with self.store._write("sweep spent request states") as db:
            cur = db.execute(self._sql("DELETE FROM spent_request_states WHERE expires_at < %s"), (now,))
            return int(cur.rowcount)
