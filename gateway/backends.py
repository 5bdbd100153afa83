"""The one place that chooses SQLite or PostgreSQL: ``open_backends(settings)`` returns them all at once.

Every backend of one process (state store, audit sink and reader, slots, rate limits, the instance
lock, leadership) comes from this engine table; nothing else asks which engine runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.audit.file_sink import AuditSink
from gateway.audit.readers import AuditReader as AuditReader  # re-exported: the reader type of Backends
from gateway.audit.readers import FileAuditReader
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.private_files import make_private_dirs
from gateway.store.base import AuditWriter, StateStore
from gateway.store.idempotency_keys import KeyTable
from gateway.store.instance import Instance
from gateway.store.sqlite import SqliteStore
from gateway.store.task_records import TaskTable

if TYPE_CHECKING:
    from gateway.settings import Settings
    from gateway.store.slots import SlotLimiter


class InstanceLock(Protocol):
    """This process's claim id and whether the process behind another claim id is alive."""

    id: str

    def acquire(self) -> str: ...

    def alive(self, instance_id: str) -> bool: ...

    def close(self) -> None: ...


class Leader(Protocol):
    """Whether this process is the one replica that does a shared chore (the expiry sweep)."""

    def is_leader(self) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Engine:
    """One row of the engine table: how each backend is opened on that engine."""

    name: str
    #: the database as it may be shown, and the newest schema version this gateway knows for it
    describe: Callable[[Settings], tuple[str, int]]
    #: whether the state store exists already (opening creates it)
    exists: Callable[[Settings], bool]
    store: Callable[[Settings], StateStore]
    audit: Callable[[Settings, StateStore], AuditWriter]
    reader: Callable[[Settings, StateStore], AuditReader]
    #: the audit reader alone, opening just what it needs (``open_audit_reader``)
    reader_alone: Callable[[Settings], contextlib.AbstractContextManager[AuditReader]]
    instance: Callable[[Settings], InstanceLock]
    slots: Callable[[Settings], SlotLimiter | None]
    leader: Callable[[Settings, str], Leader | None]
    limits: Callable[[StateStore], tuple[RateLimiter, RunawayBreaker]]
    #: whether several replicas share this engine (the MCP transport then keeps no session)
    shared: bool
    #: the SQL placeholder of the engine's driver (the idempotency keys and tasks tables share their SQL)
    placeholder: str = "%s"


def _sqlite_describe(settings: Settings) -> tuple[str, int]:
    from gateway.store.sqlite import SCHEMA_VERSION

    return f"sqlite:{settings.state_db}", SCHEMA_VERSION


def _pg_describe(settings: Settings) -> tuple[str, int]:
    from gateway.store.postgres import SCHEMA_VERSION, display_url

    return display_url(_url(settings)), SCHEMA_VERSION


def _url(settings: Settings) -> str:
    assert settings.database_url is not None  # the engine table chose PostgreSQL for this reason
    return settings.database_url


def _pg_store(settings: Settings) -> StateStore:
    from gateway.store.postgres import PostgresStore  # psycopg is loaded only when used

    return PostgresStore(_url(settings))


def _pg_audit(settings: Settings, store: StateStore) -> AuditWriter:
    from gateway.audit.pg_sink import PgAuditSink
    from gateway.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    return PgAuditSink.for_settings(store, settings)


def _pg_reader(_settings: Settings, store: StateStore) -> AuditReader:
    from gateway.audit.pg_reader import PgAuditReader
    from gateway.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    return PgAuditReader(store)


@contextlib.contextmanager
def _file_reader_alone(settings: Settings) -> Iterator[AuditReader]:
    yield FileAuditReader(settings.audit_log)


@contextlib.contextmanager
def _pg_reader_alone(settings: Settings) -> Iterator[AuditReader]:
    from gateway.audit.pg_reader import PgAuditReader
    from gateway.store.postgres import PostgresStore

    store = PostgresStore(_url(settings), max_size=2)
    try:
        yield PgAuditReader(store)
    finally:
        store.close()


def _pg_instance(settings: Settings) -> InstanceLock:
    from gateway.store.slots import PgInstance

    return PgInstance(_url(settings))


def _pg_slots(settings: Settings) -> SlotLimiter:
    from gateway.store.slots import PgSlots

    return PgSlots(_url(settings))


def _pg_leader(settings: Settings, name: str) -> Leader:
    from gateway.store.slots import PgLeader

    return PgLeader(_url(settings), name)


def _pg_limits(store: StateStore) -> tuple[RateLimiter, RunawayBreaker]:
    from gateway.store.limits_pg import PgRateLimiter, PgRunawayBreaker
    from gateway.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    return PgRateLimiter(store), PgRunawayBreaker(store)  # replicas count rate limits and repeats together


#: the engine table: every difference between one process on a file and replicas on a database
ENGINES: dict[str, Engine] = {
    "sqlite": Engine(
        name="sqlite",
        describe=_sqlite_describe,
        exists=lambda s: s.state_db.exists(),
        store=lambda s: SqliteStore(s.state_db),
        audit=lambda s, _store: AuditSink.for_settings(s),
        reader=lambda s, _store: FileAuditReader(s.audit_log),
        reader_alone=_file_reader_alone,
        instance=lambda s: Instance(s.home),
        slots=lambda _s: None,
        leader=lambda _s, _name: None,
        limits=lambda _store: (RateLimiter(), RunawayBreaker()),
        shared=False,
        placeholder="?",
    ),
    "postgresql": Engine(
        name="postgresql",
        describe=_pg_describe,
        exists=lambda _s: True,
        store=_pg_store,
        audit=_pg_audit,
        reader=_pg_reader,
        reader_alone=_pg_reader_alone,
        instance=_pg_instance,
        slots=_pg_slots,
        leader=_pg_leader,
        limits=_pg_limits,
        shared=True,
    ),
}


def open_audit_reader(settings: Settings) -> contextlib.AbstractContextManager[AuditReader]:
    """The audit reader of the engine ``settings`` name with only what it needs (the CLI's ``gateway
    audit``): the JSONL file's, or the table's on a small pool of its own, closed on exit."""
    return engine_of(settings).reader_alone(settings)


def engine_of(settings: Settings) -> Engine:
    """The row of the engine table ``settings`` name: PostgreSQL when ``Settings.database_url`` is set
    (``GATEWAY_DATABASE_URL``, ``--database-url``), else SQLite and the JSONL file under the home."""
    return ENGINES["postgresql" if settings.database_url else "sqlite"]


@dataclass
class Backends:
    """Every backend of one gateway process, opened from one row of the engine table."""

    engine: Engine
    store: StateStore
    audit: AuditWriter
    reader: AuditReader
    instance: InstanceLock
    slots: SlotLimiter | None
    sweep_leader: Leader | None
    rate_limiter: RateLimiter
    breaker: RunawayBreaker
    keys: KeyTable
    tasks: TaskTable

    def close(self) -> None:
        """Close what ``open_backends`` opened except the slots (the scheduler that uses them closes them):
        the audit first (its closing checkpoint may need the store's pool), then the store and locks."""
        self.audit.close()
        self.store.close()
        self.instance.close()
        if self.sweep_leader is not None:
            self.sweep_leader.close()


def open_store(settings: Settings) -> StateStore:
    """The state store ``settings`` name (the engine table above), its schema migrated to this code's
    version. Raises ``StateUnavailable`` when it cannot be reached and ``ConfigError`` when its schema is
    newer than this gateway knows."""
    return engine_of(settings).store(settings)


def open_backends(settings: Settings) -> Backends:
    """Open every backend ``settings`` name (one engine, chosen here once).

    Raises ``StateUnavailable`` when the store cannot be reached and ``ConfigError`` when its schema is
    newer than this gateway knows."""
    make_private_dirs(settings.home)  # the file backends and the instance locks live under the home
    engine = engine_of(settings)
    store = engine.store(settings)
    try:
        audit = engine.audit(settings, store)
    except BaseException:
        with contextlib.suppress(Exception):
            store.close()
        raise
    rate_limiter, breaker = engine.limits(store)
    return Backends(
        engine=engine,
        store=store,
        audit=audit,
        reader=engine.reader(settings, store),
        instance=engine.instance(settings),
        slots=engine.slots(settings),
        sweep_leader=engine.leader(settings, "expiry-sweeper"),
        rate_limiter=rate_limiter,
        breaker=breaker,
        keys=KeyTable(store, placeholder=engine.placeholder),  # type: ignore[arg-type]
        tasks=TaskTable(store, placeholder=engine.placeholder),  # type: ignore[arg-type]
    )
