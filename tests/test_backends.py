"""``gateway.backends``: one table chooses every backend of a process (SQLite + JSONL file, or
PostgreSQL shared by replicas), opened together by ``open_backends``."""

from __future__ import annotations

from pathlib import Path

from gateway.audit.file_sink import AuditSink
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.readers import FileAuditReader
from gateway.backends import ENGINES, engine_of, open_backends
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.settings import Settings
from gateway.store.instance import Instance
from gateway.store.limits_pg import PgRateLimiter, PgRunawayBreaker
from gateway.store.postgres import PostgresStore
from gateway.store.slots import PgInstance, PgLeader, PgSlots
from gateway.store.sqlite import SqliteStore


def test_embedded_backends_are_one_file_each_and_local_limits(tmp_path: Path) -> None:
    settings = Settings.from_env({"GATEWAY_HOME": str(tmp_path)})
    backends = open_backends(settings)
    try:
        assert backends.engine is ENGINES["sqlite"] and not backends.engine.shared
        assert isinstance(backends.store, SqliteStore) and isinstance(backends.audit, AuditSink)
        assert isinstance(backends.reader, FileAuditReader) and isinstance(backends.instance, Instance)
        assert backends.slots is None and backends.sweep_leader is None
        assert type(backends.rate_limiter) is RateLimiter and type(backends.breaker) is RunawayBreaker
    finally:
        backends.close()


def test_shared_backends_all_live_in_postgres(tmp_path: Path, pg_url: str) -> None:
    settings = Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url})
    backends = open_backends(settings)
    try:
        assert backends.engine is engine_of(settings) is ENGINES["postgresql"] and backends.engine.shared
        assert isinstance(backends.store, PostgresStore) and isinstance(backends.audit, PgAuditSink)
        assert isinstance(backends.reader, PgAuditReader) and isinstance(backends.instance, PgInstance)
        assert isinstance(backends.slots, PgSlots) and isinstance(backends.sweep_leader, PgLeader)
        assert isinstance(backends.rate_limiter, PgRateLimiter)
        assert isinstance(backends.breaker, PgRunawayBreaker)
    finally:
        assert backends.slots is not None
        backends.slots.close()
        backends.close()
