"""MCP tasks in the state store, on either engine, so any replica answers for a task another one runs.

Only a task's caller sees it. Blocking: call from a worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from gateway.store.idempotency_keys import SqlStore

TASKS_MIGRATION: Final = (
    """CREATE TABLE mcp_tasks (
    task_id        TEXT PRIMARY KEY,
    caller         TEXT NOT NULL,
    tool           TEXT NOT NULL,
    target         TEXT,
    status         TEXT NOT NULL,
    status_message TEXT,
    progress       DOUBLE PRECISION,
    result         TEXT,
    failed         INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at     DOUBLE PRECISION NOT NULL,
    updated_at     DOUBLE PRECISION NOT NULL,
    keep_until     DOUBLE PRECISION NOT NULL,
    owner          TEXT,
    idempotency_key TEXT,
    digest         TEXT
)""",
    "CREATE INDEX mcp_tasks_caller ON mcp_tasks (caller, created_at)",
    "CREATE INDEX mcp_tasks_key ON mcp_tasks (caller, idempotency_key)",
)
#: the schema step of both engines naming the proposal a task follows (``TaskRecord.follows``)
FOLLOWS_MIGRATION: Final = ("ALTER TABLE mcp_tasks ADD COLUMN follows TEXT",)
#: the states of a task (the protocol's ``TaskStatus``; input_required is never used here)
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class TaskRecord:
    task_id: str
    caller: str
    tool: str
    target: str | None
    status: str
    created_at: float
    updated_at: float
    keep_until: float
    status_message: str | None = None
    progress: float | None = None
    result: str | None = None  # the tool's answer text (a result, or ``{"error": ...}``)
    failed: bool = False
    cancel_requested: bool = False
    owner: str | None = None
    #: the sha256 of the call's idempotency key and the call's digest: a retry with them gets this task
    idempotency_key: str | None = None
    digest: str | None = None
    #: the caller's ``CallerKey`` text: only that caller sees the task (None: written before keys were
    #: kept: nobody's; ``caller`` is the display name rows show)
    caller_key: str | None = None
    #: the gated proposal this task follows until a human decides it (it runs no vSphere work of its own:
    #: whoever answers for it after its process died reads the proposal), or None
    follows: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


_COLUMNS: Final = ("task_id, caller, tool, target, status, created_at, updated_at, keep_until, "
                   "status_message, progress, result, failed, cancel_requested, owner, idempotency_key, "
                   "digest, caller_key, follows")


def _record(row: Any) -> TaskRecord:
    return TaskRecord(row["task_id"], row["caller"], row["tool"], row["target"], row["status"],
                      float(row["created_at"]), float(row["updated_at"]), float(row["keep_until"]),
                      row["status_message"], None if row["progress"] is None else float(row["progress"]),
                      row["result"], bool(row["failed"]), bool(row["cancel_requested"]), row["owner"],
                      row["idempotency_key"], row["digest"], row["caller_key"], row["follows"])


class TaskTable:
    """The ``mcp_tasks`` table of one store."""

    def __init__(self, store: SqlStore, *, placeholder: str = "%s") -> None:
        self.store = store
        self._mark = placeholder

    def _sql(self, sql: str) -> str:
        return sql if self._mark == "%s" else sql.replace("%s", self._mark)

    def add(self, rec: TaskRecord) -> None:
        with self.store._write("record a task") as db:
            db.execute(self._sql(f"INSERT INTO mcp_tasks ({_COLUMNS}) VALUES "
                                 "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"),
                       (rec.task_id, rec.caller, rec.tool, rec.target, rec.status, rec.created_at,
                        rec.updated_at, rec.keep_until, rec.status_message, rec.progress, rec.result,
                        int(rec.failed), int(rec.cancel_requested), rec.owner, rec.idempotency_key,
                        rec.digest, rec.caller_key, rec.follows))

    def by_key(self, caller_key: str, key: str, digest: str, now: float) -> TaskRecord | None:
        """The kept task the caller with key text ``caller_key`` started with idempotency key ``key`` for
        the call ``digest``."""
        rows = self.store._read("read a task by its key", self._sql(
            f"SELECT {_COLUMNS} FROM mcp_tasks WHERE caller_key = %s AND idempotency_key = %s "
            "AND digest = %s AND keep_until > %s ORDER BY created_at LIMIT 1"),
            (caller_key, key, digest, now))
        return _record(rows[0]) if rows else None

    def get(self, task_id: str, now: float) -> TaskRecord | None:
        """The task, unless its results are past the time they are kept."""
        rows = self.store._read("read a task", self._sql(
            f"SELECT {_COLUMNS} FROM mcp_tasks WHERE task_id = %s AND keep_until > %s"), (task_id, now))
        return _record(rows[0]) if rows else None

    def of_caller(self, caller_key: str, now: float, limit: int = 100) -> list[TaskRecord]:
        """The kept tasks of the caller with key text ``caller_key`` (a row without a key is nobody's)."""
        rows = self.store._read("list tasks", self._sql(
            f"SELECT {_COLUMNS} FROM mcp_tasks WHERE caller_key = %s AND keep_until > %s "
            "ORDER BY created_at DESC LIMIT %s"), (caller_key, now, limit))
        return [_record(r) for r in rows]

    def progress(self, task_id: str, fraction: float, message: str, now: float) -> None:
        with self.store._write("record a task's progress") as db:
            db.execute(self._sql("UPDATE mcp_tasks SET progress = %s, status_message = %s, updated_at = %s "
                                 "WHERE task_id = %s AND status = 'working'"),
                       (fraction, message, now, task_id))

    def finish(self, task_id: str, status: str, result: str, *, failed: bool, message: str | None,
               now: float) -> None:
        """Settle a working task (a task already settled stays as it is)."""
        assert status in TERMINAL
        with self.store._write("record a task's outcome") as db:
            db.execute(self._sql("UPDATE mcp_tasks SET status = %s, result = %s, failed = %s, "
                                 "status_message = %s, updated_at = %s "
                                 "WHERE task_id = %s AND status = 'working'"),
                       (status, result, int(failed), message, now, task_id))

    def request_cancel(self, task_id: str, now: float) -> None:
        with self.store._write("ask a task to cancel") as db:
            db.execute(self._sql("UPDATE mcp_tasks SET cancel_requested = 1, updated_at = %s "
                                 "WHERE task_id = %s AND status = 'working'"), (now, task_id))

    def sweep(self, now: float) -> int:
        """Forget tasks whose results are past the time they are kept."""
        with self.store._write("sweep tasks") as db:
            return int(db.execute(self._sql("DELETE FROM mcp_tasks WHERE keep_until <= %s"), (now,)).rowcount)
