"""The audit chain in PostgreSQL: one table, one hash chain for every replica.

Rows are the file sink's, so one verifier's rules hold for both. Each append takes a
transaction-scoped advisory lock (``AUDIT_LOCK``) before reading the head, so replicas never fork the
chain; ``write`` returns after the commit or raises ``AuditUnavailable`` (fail closed). A checkpoint
is signed once across replicas (``CHECKPOINT_LOCK`` and a conditional insert); a failed one is logged
and counted, never failing the row. No rotation (``pg_retention`` prunes) and no torn lines.
``write_grouped`` (the rows of reads) commits without waiting for the WAL flush, which PostgreSQL then
makes for a group of them (``synchronous_commit = off`` for that transaction alone).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import psycopg

from gateway.audit.chain import GENESIS, format_ts, prepare_event, row_line, stamp
from gateway.audit.pg_tree import PgTree, stored_frontier
from gateway.audit.schedule import SigningSettings, signing_options
from gateway.audit.signing import (
    DEFAULT_CHECKPOINT_ROWS,
    DEFAULT_CHECKPOINT_SECONDS,
    load_or_create_signing_key,
    sign_checkpoint,
)
from gateway.audit.witness import DEFAULT_ORIGIN, CheckpointPublisher
from gateway.errors import AuditUnavailable, StateUnavailable
from gateway.store.postgres import PROBE_SECONDS, PostgresStore

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gateway.store.base import AuditWriter

__all__ = ["AUDIT_LOCK", "CHECKPOINT_LOCK", "FILTER_COLUMNS", "PgAuditSink"]

log = logging.getLogger(__name__)

#: key of the transaction-scoped advisory lock held while a row is appended
AUDIT_LOCK: Final = 0x61_75_64_69_74  # "audit"
#: key of the transaction-scoped advisory lock held while a checkpoint is signed (one per tree size)
CHECKPOINT_LOCK: Final = 0x63_6B_70_6E_74  # "ckpnt"
#: columns copied out of a row for filtering (the row itself is ``body``)
FILTER_COLUMNS: Final = ("phase", "tool", "target", "caller", "correlation_id")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _column(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class PgAuditSink:
    """Appends stamped rows to ``audit_rows``; thread-safe, and safe across replicas."""

    def __init__(self, store: PostgresStore, *, timeout: float = 10.0,
                 clock: Callable[[], datetime] = _utcnow, key_file: Path | None = None,
                 checkpoint_rows: int = DEFAULT_CHECKPOINT_ROWS,
                 checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS, origin: str = DEFAULT_ORIGIN,
                 witness_dir: Path | None = None) -> None:
        if checkpoint_rows < 1:
            raise ValueError("checkpoint_rows must be positive")
        self.store = store
        self.where = f"the audit table of {store.where}"
        self.timeout = timeout
        self.key_file = key_file
        self.checkpoint_rows = checkpoint_rows
        self.checkpoint_seconds = float(checkpoint_seconds)
        self._clock = clock
        self._closed = False
        self._lock = threading.Lock()
        self._stats: Counter[str] = Counter()
        self._signer: Ed25519PrivateKey | None = None
        self._checkpointed: tuple[int, float] = (0, time.monotonic())  # (seq, when) of the last one
        self._last_written = 0  # the highest seq this process appended
        self._tree = PgTree()
        self._tree_lock = threading.Lock()  # one append of this process at a time (the tree's cache)
        #: where each signed checkpoint note goes besides the table (``gateway.audit.witness``)
        self.publisher = CheckpointPublisher(origin, witness_dir)

    @classmethod
    def for_settings(cls, store: PostgresStore, settings: SigningSettings, **options: Any) -> PgAuditSink:
        """The sink a gateway process uses on PostgreSQL, signing as ``signing_options`` says."""
        return cls(store, **signing_options(settings, **options))

    def __enter__(self) -> PgAuditSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Redact, stamp and append one row in one transaction; return the row as written (committed,
        its WAL on the server's disk)."""
        return self._write(event, timeout, sync=True)

    def write_grouped(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """``write`` for the row of a read: committed without waiting for its WAL flush.

        The promise: when this returns the row is committed (every replica sees it, and every later
        row chains after it); it is on the server's disk once PostgreSQL's WAL writer flushes it
        (``wal_writer_delay``, 200 ms by default; at most three of them) or any later synchronous
        commit does, a change's row among them: the WAL is flushed in order, so a change's row
        never reaches the disk without the rows before it. A crash of the database server itself may
        lose such rows of the last moments, the chain's tail only. Refusals are ``write``'s."""
        return self._write(event, timeout, sync=False)

    def _write(self, event: Mapping[str, Any], timeout: float | None, *, sync: bool) -> dict[str, Any]:
        body = prepare_event(event)
        limit = self.timeout if timeout is None else timeout
        if self._closed:
            raise AuditUnavailable(f"{self.where} was closed; the gateway is shutting down")
        if not self._tree_lock.acquire(timeout=limit):
            raise AuditUnavailable(f"cannot append to {self.where}: other writes of this process held it for "
                                   f"{limit:g} s; the row was not written. fix: check PostgreSQL")
        try:
            row = self._append(body, limit, sync=sync)
        finally:
            self._tree_lock.release()
        with self._lock:
            self._stats["rows_written"] += 1
            self._last_written = max(self._last_written, row["seq"])
        if self.key_file is not None and self._checkpoint_due(row["seq"]):
            self._try_checkpoint(row["seq"], row["hash"], limit)
        return row

    def _append(self, body: Mapping[str, Any], limit: float, *, sync: bool = True) -> dict[str, Any]:
        """One row and its tree hashes in one transaction (called under ``_tree_lock``); without
        ``sync`` its commit does not wait for the WAL flush."""
        try:
            with self.store.pool.connection(timeout=limit) as conn, conn.transaction():
                ms = max(1, int(limit * 1000))
                conn.execute(f"SET LOCAL lock_timeout = {ms}")
                conn.execute(f"SET LOCAL statement_timeout = {ms}")
                if not sync:
                    conn.execute("SET LOCAL synchronous_commit = off")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK,))
                found = conn.execute("SELECT seq, hash FROM audit_rows ORDER BY seq DESC LIMIT 1").fetchone()
                head = cast("dict[str, Any] | None", found)  # the pool's rows are dicts (dict_row)
                seq, prev = (int(head["seq"]), str(head["hash"])) if head else (0, GENESIS)
                row = stamp(body, seq + 1, prev, self._clock())
                line = row_line(row)
                conn.execute(
                    "INSERT INTO audit_rows (seq, ts, phase, tool, target, caller, correlation_id, hash, "
                    "body) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (row["seq"], row["ts"], *(_column(row.get(c)) for c in FILTER_COLUMNS), row["hash"],
                     line.decode("utf-8")))
                self._tree.append(conn, seq, prev, row, line)
            self._tree.committed()
        except (psycopg.Error, StateUnavailable) as exc:
            self._tree.rolled_back()
            if isinstance(exc, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
                with self._lock:
                    self._stats["lock_timeouts"] += 1
            log.error("audit: cannot append to %s: %s", self.where, exc)
            raise AuditUnavailable(f"cannot append to {self.where} (the database does not answer or "
                                   "refuses the write); the row was not written. fix: check PostgreSQL and "
                                   "the gateway log") from None
        return row

    # -- checkpoints (signed as the file sink signs them: ``gateway.audit.signing.sign_checkpoint``) -------

    def _checkpoint_due(self, seq: int) -> bool:
        with self._lock:
            last_seq, when = self._checkpointed
        return (seq - last_seq >= self.checkpoint_rows
                or (seq > last_seq and time.monotonic() - when >= self.checkpoint_seconds))

    def _try_checkpoint(self, seq: int, hash_: str, limit: float) -> None:
        """A checkpoint after a row already committed: its failure is logged and counted, never raised
        (the row stands; the next attempt comes after the usual interval)."""
        try:
            self._write_checkpoint(seq, hash_, limit)
        except (OSError, ValueError, AuditUnavailable, psycopg.Error, StateUnavailable) as exc:
            with self._lock:
                self._checkpointed = (seq, time.monotonic())
                self._stats["checkpoint_failures"] += 1
            log.warning("could not write a signed checkpoint of %s (seq %d): %s", self.where, seq, exc)

    def _write_checkpoint(self, seq: int | None, hash_: str, limit: float) -> dict[str, Any] | None:
        """Sign row ``seq`` (None: the table's head now) unless a checkpoint of that tree size exists;
        the checkpoint written, or None. Replicas' checkpoints are serialised by ``CHECKPOINT_LOCK`` and
        the insert is conditional, so one tree size is signed once whoever asks."""
        assert self.key_file is not None
        if self._signer is None:
            self._signer = load_or_create_signing_key(self.key_file)
        with self.store.pool.connection(timeout=limit) as conn, conn.transaction():
            ms = max(1, int(limit * 1000))
            conn.execute(f"SET LOCAL lock_timeout = {ms}")
            conn.execute(f"SET LOCAL statement_timeout = {ms}")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (CHECKPOINT_LOCK,))
            if seq is None:
                found = conn.execute("SELECT seq, hash FROM audit_rows ORDER BY seq DESC LIMIT 1").fetchone()
                if found is None:
                    return None
                head_row = cast("dict[str, Any]", found)
                seq, hash_ = int(head_row["seq"]), str(head_row["hash"])
            signed = conn.execute("SELECT 1 FROM audit_checkpoints WHERE seq = %s LIMIT 1", (seq,)).fetchone()
            if signed is not None:
                with self._lock:
                    self._checkpointed = (max(seq, self._checkpointed[0]), time.monotonic())
                return None
            head: dict[str, Any] = {"seq": seq, "hash": hash_, "ts": format_ts(self._clock()),
                                    "log": "audit_rows"}
            frontier = stored_frontier(conn, seq)  # stored hashes never change: no lock needed
            if frontier is not None:
                head.update(self.publisher.note_fields(seq, frontier.root(), self._signer))
            entry = sign_checkpoint(self._signer, head)
            conn.execute("INSERT INTO audit_checkpoints (seq, body) SELECT %s, %s WHERE NOT EXISTS "
                         "(SELECT 1 FROM audit_checkpoints WHERE seq = %s)",
                         (seq, json.dumps(entry, separators=(",", ":"), sort_keys=True), seq))
        with self._lock:
            self._checkpointed = (max(seq, self._checkpointed[0]), time.monotonic())
            self._stats["checkpoints"] += 1
        self.publisher.publish(entry)
        return entry

    def checkpoint(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Sign the chain's head as it stands in the table now (whichever replica wrote it) unless a
        checkpoint of that tree size exists (any replica's); the checkpoint written, or None (no
        ``key_file``, no rows, signed already). The timer (``gateway.audit.schedule``) calls it on
        every replica. Raises ``AuditUnavailable`` when it cannot be written."""
        limit = self.timeout if timeout is None else timeout
        if self.key_file is None:
            return None
        try:
            return self._write_checkpoint(None, "", limit)
        except (psycopg.Error, StateUnavailable, OSError, ValueError) as exc:
            raise AuditUnavailable(f"cannot checkpoint {self.where}: {exc}; fix: check PostgreSQL, the "
                                   "signing key file and the gateway log") from None

    def stats(self) -> dict[str, int]:
        """Counters since this sink was made, as ``AuditSink.stats`` names them (for /metrics):
        ``rows_written`` by this process, ``lock_timeouts`` (appends refused because the chain's
        lock or the statement outlived the deadline), ``checkpoints`` and ``checkpoint_failures``.
        No ``bytes``: a table has no file size. Reads nothing from the database."""
        with self._lock:
            return {name: self._stats[name] for name in ("rows_written", "lock_timeouts", "checkpoints",
                                                          "checkpoint_failures")}

    def writable(self) -> bool:
        """Whether an append could succeed now (for readiness): the database answers and lets this
        user insert into the table. A point-in-time check; ``write`` remains the authority."""
        if self._closed:
            return False
        try:
            with self.store.pool.connection(timeout=PROBE_SECONDS) as conn:
                row = conn.execute("SELECT has_table_privilege('audit_rows', 'INSERT')").fetchone()
        except psycopg.Error:
            return False
        return bool(row and next(iter(cast("dict[str, Any]", row).values())))

    def close(self) -> None:
        """Sign a last checkpoint when this process wrote rows since its previous one (a failure is
        logged and counted); later writes raise ``AuditUnavailable``. The pool belongs to the store."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            pending = self._stats["rows_written"] > 0 and self._checkpointed[0] < self._last_written
        if self.key_file is not None and pending:
            try:
                self.checkpoint()
            except AuditUnavailable as exc:
                with self._lock:
                    self._stats["checkpoint_failures"] += 1
                log.warning("could not write a closing checkpoint of %s: %s", self.where, exc)


if TYPE_CHECKING:
    def _implements(sink: PgAuditSink) -> AuditWriter:
        return sink
