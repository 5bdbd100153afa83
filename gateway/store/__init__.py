"""State shared by the server, the CLI and the approval page: tokens, proposals, web sessions.

Code against ``StateStore``; ``gateway.backends`` chooses the engine.
"""

from __future__ import annotations

from gateway.store.base import AuditWriter, StateStore, TokenRecord, WebSessionRecord
from gateway.store.sqlite import SqliteStore

__all__ = ["AuditWriter", "SqliteStore", "StateStore", "TokenRecord", "WebSessionRecord"]
