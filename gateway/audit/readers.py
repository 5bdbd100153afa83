"""Reading the audit chain wherever it lives: ``open_audit_reader(settings, store)`` gives the JSONL
file's reader (embedded mode) or the PostgreSQL table's (``PgAuditReader``), with one interface for
the approval page (and anything else that shows or verifies rows)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from gateway.audit.query import read_rows, stats
from gateway.audit.verify import VerifyReport, verify
from gateway.settings import Settings
from gateway.store.base import StateStore


class AuditReader(Protocol):
    where: str

    def rows(self, *, last: int | None = None, since: datetime | None = None,
             until: datetime | None = None, target: str | None = None, tool: str | None = None,
             phase: str | None = None, caller: str | None = None,
             correlation_id: str | None = None) -> list[dict[str, Any]]: ...

    def stats(self, *, since: datetime | None = None) -> dict[str, Any]: ...

    def verify(self) -> VerifyReport: ...


class FileAuditReader:
    """The JSONL log and its rotated files (``gateway.audit.query``, ``gateway.audit.verify``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    def rows(self, *, last: int | None = None, since: datetime | None = None,
             until: datetime | None = None, target: str | None = None, tool: str | None = None,
             phase: str | None = None, caller: str | None = None,
             correlation_id: str | None = None) -> list[dict[str, Any]]:
        return read_rows(self.path, last=last, since=since, until=until, target=target, tool=tool,
                               phase=phase, caller=caller, correlation_id=correlation_id)

    def stats(self, *, since: datetime | None = None) -> dict[str, Any]:
        return stats(self.path, since=since)

    def verify(self) -> VerifyReport:
        return verify(self.path)


def open_audit_reader(settings: Settings, store: StateStore) -> AuditReader:
    """The table's reader when ``store`` is the PostgreSQL one of ``settings``, else the file's."""
    if settings.database_url:
        from gateway.audit.pg_reader import PgAuditReader
        from gateway.store.postgres import PostgresStore

        if isinstance(store, PostgresStore):
            return PgAuditReader(store)
    return FileAuditReader(settings.audit_log)
