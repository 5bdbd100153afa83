"""State shared by the server, the CLI and the approval page: tokens, proposals, web sessions.

Code against ``StateStore`` and open it with ``open_store(settings)``: ``PostgresStore`` when
``Settings.database_url`` is set (``GATEWAY_DATABASE_URL``, ``--database-url``: several replicas share
one database), else ``SqliteStore`` on one file under the gateway home (``Settings.state_db``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.audit.file_sink import AuditSink
from gateway.store.base import AuditWriter, StateStore, TokenRecord, WebSessionRecord
from gateway.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from gateway.settings import Settings

__all__ = [
    "AuditWriter", "SqliteStore", "StateStore", "TokenRecord", "WebSessionRecord", "open_audit", "open_store",
]


def open_store(settings: Settings) -> StateStore:
    """The state store ``settings`` name, its schema migrated to this code's version.

    Raises ``StateUnavailable`` when it cannot be reached and ``ConfigError`` when its schema is newer
    than this gateway knows."""
    if settings.database_url:
        from gateway.store.postgres import PostgresStore  # psycopg is loaded only when used

        return PostgresStore(settings.database_url)
    return SqliteStore(settings.state_db)


def open_audit(settings: Settings, store: StateStore) -> AuditWriter:
    """Where audit rows go: the audit table next to the shared state when ``store`` is on PostgreSQL
    (one chain for every replica), else the JSONL file ``Settings.audit_log``."""
    if settings.database_url:
        from gateway.audit.pg_sink import PgAuditSink
        from gateway.store.postgres import PostgresStore

        if isinstance(store, PostgresStore):
            return PgAuditSink(store, key_file=settings.signing_key_file)
    return AuditSink.for_settings(settings)
