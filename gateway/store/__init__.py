"""State shared by the server, the CLI and the approval page: tokens, proposals, web sessions.

Code against ``StateStore`` and open it with ``gateway.backends.open_store(settings)``; a server opens
all its backends at once with ``gateway.backends.open_backends``, the one place that chooses ``PostgresStore``
(``Settings.database_url`` set: several replicas share one database) or ``SqliteStore`` (one file under
the gateway home, ``Settings.state_db``).
"""

from __future__ import annotations

from gateway.store.base import AuditWriter, StateStore, TokenRecord, WebSessionRecord
from gateway.store.sqlite import SqliteStore

__all__ = ["AuditWriter", "SqliteStore", "StateStore", "TokenRecord", "WebSessionRecord"]
