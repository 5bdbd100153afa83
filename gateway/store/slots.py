"""Coordination of the replicas on one PostgreSQL: per-target call slots, claim liveness, a leader.

A slot is a session-scoped advisory lock held on its own connection for the call, so a dead replica
frees its slots with nothing to clean up; waiting queues in PostgreSQL's lock queue (first come, first
served). A connection lost mid-call loses its slot while the call goes on: the bound can be exceeded
by the calls in flight at that moment. Blocking: call from a worker thread.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import psycopg
import psycopg.errors

from gateway.errors import QueueTimeout, StateUnavailable
from gateway.store.postgres import display_url

__all__ = ["PgInstance", "PgLeader", "PgSlots", "Slot", "SlotLimiter", "lock_key"]

log = logging.getLogger(__name__)

#: first key of every instance lock (two-key advisory locks: this space, then the instance's key)
INSTANCE_SPACE: Final = 0x696E  # "in"
#: how long one round queues on a slot before trying all of them again
QUEUE_ROUND_SECONDS: Final = 0.25


def lock_key(namespace: str, name: str) -> int:
    """A stable signed 32-bit advisory-lock key for ``name`` in ``namespace``."""
    digest = hashlib.sha256(f"{namespace}\0{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


@dataclass
class Slot:
    """One held slot; give it back with ``release``."""

    target: str
    index: int
    conn: psycopg.Connection[Any] = field(repr=False)


class SlotLimiter(Protocol):
    """What the scheduler calls around a vSphere call when replicas share a database."""

    def acquire(self, target: str, capacity: int, timeout: float) -> Slot:
        """A slot of ``target`` (``capacity`` slots across all replicas) within ``timeout`` seconds;
        ``QueueTimeout`` otherwise, ``StateUnavailable`` when the database cannot be reached."""
        ...

    def release(self, slot: Slot) -> None: ...

    def close(self) -> None: ...


class _LockConnections:
    """Connections that hold session-scoped advisory locks, one lock holder per connection at a time."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self._url = url
        self.where = display_url(url)
        self._connect_timeout = connect_timeout
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connection(self) -> psycopg.Connection[Any]:
        """An idle connection that still answers (one the server dropped, e.g. across a PostgreSQL
        restart, is closed and skipped), or a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            try:
                conn.execute("SELECT 1")
                return conn
            except psycopg.Error:
                conn.close()
        try:
            return psycopg.connect(self._url, autocommit=True,
                                   connect_timeout=max(1, int(self._connect_timeout)),
                                   application_name="vsphere-mcp-gateway-slots")
        except psycopg.Error as exc:
            log.error("slots: cannot connect to %s: %s", self.where, exc)
            raise StateUnavailable("the shared call slots cannot be reached: the database does not answer; "
                                   "retry, and if it persists see the gateway log") from None

    def _give_back(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            if not self._closed and not conn.closed:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class PgSlots(_LockConnections):
    """Per-target slots as session-scoped advisory locks; see the module docstring."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        super().__init__(url, connect_timeout=connect_timeout)
        self._turn = itertools.count()

    def acquire(self, target: str, capacity: int, timeout: float) -> Slot:
        if capacity < 1:
            raise ValueError("a target needs at least one slot")
        key = lock_key("slot", target)
        deadline = time.monotonic() + timeout
        conn = self._connection()
        try:
            while True:
                for index in random.sample(range(capacity), capacity):
                    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (key, index)).fetchone()
                    if row is not None and row[0]:
                        return Slot(target, index, conn)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise QueueTimeout(f"target '{target}' has all {capacity} of its calls running across "
                                       "the replicas; retry later or raise its 'pool_size'", target=target)
                index = next(self._turn) % capacity  # spread this replica's waiters over the slots
                wait_ms = max(1, int(min(remaining, QUEUE_ROUND_SECONDS) * 1000))
                try:
                    conn.execute(f"SET lock_timeout = {wait_ms}")
                    conn.execute("SELECT pg_advisory_lock(%s, %s)", (key, index))
                    conn.execute("SET lock_timeout = 0")
                    return Slot(target, index, conn)
                except psycopg.errors.LockNotAvailable:
                    conn.execute("SET lock_timeout = 0")
        except psycopg.Error as exc:
            conn.close()
            log.error("slots: %s: %s", self.where, exc)
            raise StateUnavailable("the shared call slots cannot be reached: the database does not answer; "
                                   "retry, and if it persists see the gateway log") from None
        except BaseException:
            self._give_back(conn)
            raise

    def release(self, slot: Slot) -> None:
        try:
            slot.conn.execute("SELECT pg_advisory_unlock(%s, %s)",
                              (lock_key("slot", slot.target), slot.index))
        except psycopg.Error as exc:  # the connection is gone, and with it the lock
            log.warning("slots: releasing a slot of %r: %s", slot.target, exc)
            slot.conn.close()
            return
        self._give_back(slot.conn)


class PgLeader:
    """One leader among the replicas for ``name``: ``is_leader()`` is True in exactly one live process
    (the first to ask after the previous leader died). Call from a worker thread."""

    def __init__(self, url: str, name: str) -> None:
        self._url = url
        self.where = display_url(url)
        self._key = lock_key("leader", name)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def is_leader(self) -> bool:
        with self._lock:
            try:
                if self._conn is not None and not self._conn.closed:
                    self._conn.execute("SELECT 1")  # still connected, so still holding the lock
                    return True
                conn = psycopg.connect(self._url, autocommit=True, connect_timeout=5,
                                       application_name="vsphere-mcp-gateway-leader")
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
                if row is not None and row[0]:
                    self._conn = conn
                    return True
                conn.close()
                return False
            except psycopg.Error as exc:
                log.warning("leader election on %s: %s", self.where, exc)
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                return False

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class PgInstance(_LockConnections):
    """``gateway.store.instance.Instance`` for replicas on several hosts: this process's claim id is
    alive while it holds a session-scoped advisory lock on its own connection, so any replica can tell
    a dead claim (``kill -9``, a lost host: the server drops the connection and the lock) from a live
    one on another machine. Same interface as ``Instance``; blocking, call from a worker thread."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.id = f"{os.getpid()}-{secrets.token_hex(6)}"
        self._held: psycopg.Connection[Any] | None = None
        self._holding = threading.Lock()

    def acquire(self) -> str:
        with self._holding:
            if self._held is None or self._held.closed:
                conn = self._connection()
                row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                   (INSTANCE_SPACE, lock_key("instance", self.id))).fetchone()
                if row is None or not row[0]:
                    conn.close()
                    raise StateUnavailable("this gateway's instance lock is held elsewhere; restart it")
                self._held = conn
        return self.id

    def alive(self, instance_id: str) -> bool:
        if instance_id == self.id:
            return True
        key = (INSTANCE_SPACE, lock_key("instance", instance_id))
        conn = self._connection()
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", key).fetchone()
            if row is not None and row[0]:
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", key)
                return False
            return True
        except psycopg.Error:
            conn.close()
            return True  # cannot tell: never settle a claim that may be live
        finally:
            self._give_back(conn)

    def close(self) -> None:
        with self._holding:
            if self._held is not None:
                self._held.close()
                self._held = None
        super().close()
