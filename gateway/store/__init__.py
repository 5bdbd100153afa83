"""State shared by the server, the CLI and the approval page: tokens, proposals, web sessions.

Code against ``StateStore`` and open it with ``open_store(settings)``; a server opens all its backends
at once with ``gateway.store.backends.open_backends``, the one place that chooses ``PostgresStore``
(``Settings.database_url`` set: several replicas share one database) or ``SqliteStore`` (one file under
the gateway home, ``Settings.state_db``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.store.base import AuditWriter, StateStore, TokenRecord, WebSessionRecord
from gateway.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from gateway.settings import Settings

__all__ = ["AuditWriter", "SqliteStore", "StateStore", "TokenRecord", "WebSessionRecord", "open_store"]


def open_store(settings: Settings) -> StateStore:
    """The state store ``settings`` name (the engine table of ``gateway.store.backends``), its schema
    migrated to this code's version.

    Raises ``StateUnavailable`` when it cannot be reached and ``ConfigError`` when its schema is newer
    than this gateway knows."""
    from gateway.store.backends import engine_of

    return engine_of(settings).store(settings)
