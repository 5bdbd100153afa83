"""The JSONL file sink: ``AuditSink`` appends stamped rows under a lock file, rotates and signs checkpoints.

- ``write`` returns only once the row is in the file (flushed when ``durable``), else raises
  ``AuditUnavailable`` and the call is refused; locks are tried until ``lock_timeout``, never forever.
- Several processes append at once: each holds ``flock`` on ``<name>.lock`` (never renamed, so
  rotation cannot split the lock) and re-reads the tail when the file changed under it.
- Rotation starts each file with an ``audit_rotated`` row continuing the chain; retention never drops
  a file with rows younger than ``retain_seconds`` and logs each drop first.
- A torn last line (a crash mid-write) is torn, not tampering: the next append repairs it and records
  ``audit_repaired``.
- Group commit (``write_grouped``, for the rows of reads only): the row is in the file (written, its
  chain stamped) when the call returns, and reaches the disk in the next group's ``fdatasync``, made
  by a thread of the sink's own; see ``write_grouped`` for the exact promise.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.chain import (
    GENESIS,
    REPAIRED_PHASE,
    ROTATED_PHASE,
    format_ts,
    parse_row,
    parse_ts,
    prepare_event,
    row_line,
    stamp,
)
from gateway.audit.files import (
    checkpoint_path,
    close_quietly,
    forward_lines,
    last_line_in,
    last_row_in,
    last_row_of_file,
    lock_path,
    log_files,
    reverse_lines,
    rotated_path,
)
from gateway.audit.schedule import SigningSettings, signing_options
from gateway.audit.signing import (
    DEFAULT_CHECKPOINT_ROWS,
    DEFAULT_CHECKPOINT_SECONDS,
    load_or_create_signing_key,
    sign_checkpoint,
)
from gateway.audit.tree_file import FileTree
from gateway.audit.witness import DEFAULT_ORIGIN, CheckpointPublisher
from gateway.errors import AuditUnavailable
from gateway.private_files import make_private_dirs, open_private

log = logging.getLogger(__name__)

#: ``writable()`` wants at least this much free space on the log's filesystem
MIN_FREE_BYTES = 1024 * 1024
#: rotated files holding rows younger than this are never dropped by retention (7 days)
DEFAULT_RETAIN_SECONDS = 7 * 24 * 3600.0
_STAT_NAMES = ("rows_written", "rotations", "files_dropped", "rows_dropped", "files_kept_over_budget",
               "checkpoints", "checkpoint_failures", "lock_timeouts")
#: how long ``AuditSink.write`` waits for the log's lock (held by another writer) before giving up
DEFAULT_LOCK_TIMEOUT = 5.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Tail:
    """Where the chain stands: the last row's seq and hash, for the file identity it was read from."""

    seq: int
    hash: str
    key: tuple[int, int, int] = (0, 0, -1)


_START = _Tail(0, GENESIS)


_FIXES: dict[int, str] = {
    errno.ENOSPC: "free space on the filesystem holding it, or point GATEWAY_AUDIT_LOG at another one",
    errno.EDQUOT: "raise the disk quota of the gateway's user, or point GATEWAY_AUDIT_LOG elsewhere",
    errno.EACCES: "make the file and its directory writable by the gateway's user",
    errno.EPERM: "make the file and its directory writable by the gateway's user",
    errno.EROFS: "point GATEWAY_AUDIT_LOG at a file on a writable filesystem",
    errno.EISDIR: "point GATEWAY_AUDIT_LOG at a file, not a directory",
    errno.ENOTDIR: "point GATEWAY_AUDIT_LOG at a file inside a directory (a parent is not one)",
    errno.ENOENT: "point GATEWAY_AUDIT_LOG at a file inside an existing directory",
    errno.EEXIST: "a parent of GATEWAY_AUDIT_LOG is a file: point it inside a directory",
    errno.EFBIG: "raise the process's file size limit (ulimit -f) or lower GATEWAY_AUDIT_MAX_BYTES",
}
_DEFAULT_FIX = "check the file, its directory and its filesystem, then retry"


class _SinkSettings(SigningSettings, Protocol):
    """What ``AuditSink.for_settings`` reads of ``gateway.settings.Settings``."""

    @property
    def audit_log(self) -> Path: ...
    @property
    def audit_max_bytes(self) -> int: ...


def _unavailable(path: Path, exc: OSError) -> AuditUnavailable:
    name = errno.errorcode.get(exc.errno or 0, "error")
    fix = _FIXES.get(exc.errno or 0, _DEFAULT_FIX)
    reason = exc.strerror or str(exc)
    return AuditUnavailable(f"cannot append to the audit log {path}: {reason} ({name}); fix: {fix}")


class AuditSink:
    """Appends stamped, redacted rows to one audit log; thread- and multi-process safe.

    Opening is lazy (the first ``write``); ``close`` releases the file descriptors and later writes
    raise ``AuditUnavailable``. ``durable`` flushes every row to disk before ``write`` returns.
    """

    def __init__(self, path: Path, *, max_bytes: int = 50 * 1024 * 1024, durable: bool = True,
                 keep: int = 10, clock: Callable[[], datetime] = _utcnow,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT, max_total_bytes: int | None = None,
                 retain_seconds: float = DEFAULT_RETAIN_SECONDS, max_age_seconds: float | None = None,
                 key_file: Path | None = None, checkpoint_rows: int = DEFAULT_CHECKPOINT_ROWS,
                 checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS, origin: str = DEFAULT_ORIGIN,
                 witness_dir: Path | None = None) -> None:
        if max_bytes < 1 or keep < 1 or not lock_timeout > 0 or checkpoint_rows < 1:
            raise ValueError("max_bytes, keep, lock_timeout and checkpoint_rows must be positive")
        if retain_seconds < 0 or (max_age_seconds is not None and max_age_seconds <= retain_seconds):
            raise ValueError("retain_seconds must be >= 0 and max_age_seconds above it")
        self.lock_timeout = float(lock_timeout)
        self.max_total_bytes = max_total_bytes if max_total_bytes is not None else max_bytes * (keep + 1)
        self.retain_seconds = float(retain_seconds)
        self.max_age_seconds = max_age_seconds
        self.key_file = Path(key_file) if key_file is not None else None
        self.checkpoint_file = checkpoint_path(Path(path))
        self.checkpoint_rows = checkpoint_rows
        self.checkpoint_seconds = float(checkpoint_seconds)
        self._signer: Ed25519PrivateKey | None = None
        self._tree = FileTree(Path(path))
        #: where each signed checkpoint note goes besides the checkpoint file (``gateway.audit.witness``)
        self.publisher = CheckpointPublisher(origin, witness_dir)
        self._checkpointed: tuple[int, float] = (0, time.monotonic())  # (seq, when) of the last one
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.durable = durable
        self.keep = keep
        self._clock = clock
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._ident = (0, 0)  # (st_dev, st_ino) of self._fd
        self._pid = 0
        self._tail: _Tail | None = None
        self._closed = False
        self._stats: Counter[str] = Counter()
        self._stats_lock = threading.Lock()
        self._rotated_bytes = 0
        #: rows in the file whose fdatasync is still to come (``write_grouped``): the group's size
        self._unsynced = 0
        #: set when rows wait for their group's fdatasync; the syncer thread waits on it
        self._sync_wanted = threading.Event()
        self._syncer: threading.Thread | None = None
        self._syncer_pid = 0
        self._syncer_lock = threading.Lock()
        #: rows whose group's fdatasync failed (logged); the next durable write or group retries
        self.group_sync_failures = 0

    @classmethod
    def for_settings(cls, settings: _SinkSettings, **options: Any) -> AuditSink:
        """The sink a gateway process uses: ``settings.audit_log`` rotated at ``audit_max_bytes``,
        checkpoints signed with ``settings.signing_key_file`` (GATEWAY_AUDIT_SIGNING_KEY_FILE; default
        ``<home>/audit-signing.key``) at least every ``audit_checkpoint_seconds`` (``ConfigError`` when
        that is not a sane interval: ``gateway.audit.schedule.checkpoint_interval``)."""
        return cls(settings.audit_log, max_bytes=settings.audit_max_bytes,
                   **signing_options(settings, **options))

    def __enter__(self) -> AuditSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Redact, bound, stamp and append one row; return the row as written (on the disk when
        ``durable``).

        Raises ``AuditUnavailable`` (naming the path, the OS error and the fix) when the row could not
        be appended; nothing of it is left in the file then. Waiting is bounded: the sink's own lock
        and the ``<name>.lock`` file lock are tried until ``timeout`` seconds (default
        ``lock_timeout``) have passed, and a row is not appended once they have. The disk flush itself
        cannot be interrupted: callers on an event loop run this in a worker thread under their own
        deadline (``asyncio.wait_for``).
        """
        return self._write(event, timeout, sync=True)

    def write_grouped(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """``write`` with the disk flush left to the next group commit: for the row of a read, whose
        answer changes nothing.

        The promise: when this returns, the row is in the file (``write(2)`` done, stamped into the
        chain, so a crash of this process loses nothing and every later row chains after it), and it
        is on the disk (``fdatasync``) once the sink's syncer thread has flushed its group: at once
        when idle, else right after the flush in progress, one flush for every row written meanwhile.
        Any ``write`` (a change's row) returns only after its own flush, which takes every grouped row
        before it to the disk too; a checkpoint signs only rows on the disk; ``close`` flushes what
        is left. What a crash of the machine itself (power, kernel) may lose is the grouped rows of
        the last flush interval, the tail of the chain (never a row in its middle). Refusals are the
        same as ``write``'s. Without ``durable`` it is ``write``."""
        return self._write(event, timeout, sync=not self.durable)

    def _write(self, event: Mapping[str, Any], timeout: float | None, *, sync: bool) -> dict[str, Any]:
        limit = self.lock_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        body = prepare_event(event)
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise AuditUnavailable(
                f"cannot append to the audit log {self.path}: other writes of this process held it for "
                f"{limit:g} s (a slow disk?); the row was not written. fix: check the disk holding it")
        try:
            if self._closed:
                raise AuditUnavailable(f"the audit log {self.path} was closed; the gateway is shutting down")
            try:
                lock_fd = self._ensure_lock_fd()
                self._flock(lock_fd, deadline, limit)
                try:
                    row = self._append_locked(body, deadline, limit, sync=sync)
                finally:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
            except OSError as exc:
                self._drop_fd()
                raise _unavailable(self.path, exc) from exc
            self._count("rows_written")
        finally:
            self._lock.release()
        if not sync:
            self._wake_syncer()
        return row

    # -- group commit ----------------------------------------------------------------------------------

    def unsynced(self) -> int:
        """Rows in the file whose group's fdatasync has not been made yet (0: all on the disk)."""
        with self._lock:
            return self._unsynced

    def _wake_syncer(self) -> None:
        """Ask the syncer thread for a flush (started on first use, again after a fork)."""
        if self._syncer is None or self._syncer_pid != os.getpid() or not self._syncer.is_alive():
            with self._syncer_lock:
                if self._syncer is None or self._syncer_pid != os.getpid() or not self._syncer.is_alive():
                    self._syncer_pid = os.getpid()
                    self._syncer = threading.Thread(target=self._sync_groups, name="audit-group-commit",
                                                    daemon=True)
                    self._syncer.start()
        self._sync_wanted.set()

    def _sync_groups(self) -> None:
        """The syncer thread: one fdatasync for every row grouped since the last one, outside the
        sink's lock (on a duplicate of the log's descriptor, so appends go on meanwhile)."""
        while True:
            self._sync_wanted.wait()
            self._sync_wanted.clear()
            with self._lock:
                if self._closed:
                    return
                if not self._unsynced or self._fd is None:
                    continue
                fd, group = os.dup(self._fd), self._unsynced
                self._unsynced = 0
            try:
                os.fdatasync(fd)
            except OSError as exc:
                with self._lock:
                    self._unsynced += group  # the next durable write or group tries again
                    self.group_sync_failures += group
                log.error("audit log %s: the disk flush of %d read rows failed (%s); they are in the file "
                          "and the next flush tries again", self.path, group, exc)
            finally:
                os.close(fd)

    def _sync_unsynced(self) -> None:
        """Flush the grouped rows now (called with the lock, before a checkpoint signs them and before
        the descriptor holding them is closed)."""
        if self._unsynced and self._fd is not None:
            os.fdatasync(self._fd)
            self._unsynced = 0

    def _flock(self, lock_fd: int, deadline: float, limit: float) -> None:
        """Take the file lock exclusively, trying without blocking until ``deadline``."""
        pause = 0.001
        while True:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                self._count("lock_timeouts")
                lock = lock_path(self.path)
                raise AuditUnavailable(
                    f"cannot append to the audit log {self.path}: its lock file {lock} has been held by "
                    f"another process for more than {limit:g} s; the row was not written. fix: find the "
                    f"process holding it (`fuser {lock}`) and let it finish or stop it")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)

    def writable(self) -> bool:
        """Whether an append could succeed now (for readiness probes): the file opens for appending
        (it and its directory are created if missing), is a regular file, and its filesystem has at
        least ``MIN_FREE_BYTES`` free. A point-in-time check; ``write`` remains the authority."""
        if self._closed:
            return False
        try:
            make_private_dirs(self.path.parent)
            fd = open_private(self.path, os.O_RDWR | os.O_APPEND)
            try:
                regular = stat.S_ISREG(os.fstat(fd).st_mode)
                fs = os.fstatvfs(fd)
            finally:
                os.close(fd)
        except OSError:
            return False
        return regular and fs.f_bavail * fs.f_frsize >= MIN_FREE_BYTES

    def stats(self) -> dict[str, int]:
        """Counters since this sink was made (for metrics): ``rows_written``, ``rotations``,
        ``files_dropped`` and ``rows_dropped`` (by retention), ``files_kept_over_budget`` (retention
        kept them: too young to drop), ``checkpoints`` and ``checkpoint_failures``, ``lock_timeouts``,
        and ``bytes``, the size of the log and its rotated files as this process last saw them.
        Reads no file."""
        with self._stats_lock:
            counters = {name: self._stats[name] for name in _STAT_NAMES}
        counters["bytes"] = self._rotated_bytes + (self._tail.key[2] if self._tail is not None else 0)
        return counters

    def checkpoint(self, *, timeout: float | None = None) -> dict[str, Any] | None:
        """Sign the chain's head now unless the newest checkpoint (of any process) signs it already;
        return the checkpoint written, or None (no ``key_file``, no rows, the head signed already).
        The timer (``gateway.audit.schedule``) calls it on schedule; the file lock makes two
        processes' calls sign one head once."""
        if self.key_file is None:
            return None
        limit = self.lock_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        if not self._lock.acquire(timeout=limit):
            raise AuditUnavailable(f"cannot checkpoint the audit log {self.path}: its writers are busy")
        try:
            lock_fd = self._ensure_lock_fd()
            self._flock(lock_fd, deadline, limit)
            try:
                fd, size = self._open_log()
                tail, size, _ = self._current_tail(fd, size)
                if not tail.seq or self._signed_head() == (tail.seq, tail.hash):
                    self._checkpointed = (tail.seq, time.monotonic())
                    return None
                self._tree.sync(tail.seq, lambda: last_line_in(fd, size))
                return self._write_checkpoint(tail)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
        except OSError as exc:
            raise _unavailable(self.checkpoint_file, exc) from exc
        finally:
            self._lock.release()

    def close(self) -> None:
        """Sign a last checkpoint when rows were written since the previous one, then release the file
        descriptors; idempotent."""
        if not self._closed and self.key_file is not None and self._tail is not None \
                and self._tail.seq > self._checkpointed[0]:
            try:
                self.checkpoint()
            except (AuditUnavailable, OSError) as exc:
                log.warning("could not write a closing checkpoint of the audit log %s: %s", self.path, exc)
        with self._lock:
            self._closed = True
            try:
                self._drop_fd()
            finally:
                self._sync_wanted.set()  # the syncer thread ends
            self._tree.forget()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # -- internals (called with self._lock held) -------------------------------------------------

    def _ensure_lock_fd(self) -> int:
        if self._pid != os.getpid():
            # A forked child shares the parent's open files, and with them the flock: start afresh.
            for fd in (self._lock_fd, self._fd):
                if fd is not None:
                    close_quietly(fd)
            self._lock_fd = self._fd = None
            self._tail = None
            self._tree.forget()
            self._pid = os.getpid()
        if self._lock_fd is None:
            make_private_dirs(self.path.parent)
            self._lock_fd = open_private(lock_path(self.path), os.O_RDWR)
        return self._lock_fd

    def _drop_fd(self) -> None:
        if self._fd is not None:
            try:
                self._sync_unsynced()
            except OSError as exc:
                log.error("audit log %s: the disk flush of %d read rows failed (%s) before its descriptor "
                          "was closed", self.path, self._unsynced, exc)
                self._unsynced = 0
            fd, self._fd = self._fd, None
            close_quietly(fd)

    def _open_log(self) -> tuple[int, int]:
        """The descriptor and size of the file now at ``path``; reopened when it is not the file this
        sink holds (another process rotated it, or it was removed)."""
        if self._fd is not None:
            try:
                current = os.stat(self.path)
                if (current.st_dev, current.st_ino) == self._ident:
                    return self._fd, current.st_size
            except FileNotFoundError:
                pass
            self._drop_fd()
        existed = self.path.exists()
        fd = open_private(self.path, os.O_RDWR | os.O_APPEND)
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            os.close(fd)
            # A device or pipe would swallow rows (think /dev/null) and cannot carry a chain.
            raise AuditUnavailable(f"cannot append to the audit log {self.path}: it is not a regular file; "
                                   "fix: point GATEWAY_AUDIT_LOG at a regular file")
        self._fd, self._ident = fd, (opened.st_dev, opened.st_ino)
        if not existed:
            self._sync_dir()
        return fd, opened.st_size

    def _sync_dir(self) -> None:
        if not self.durable:
            return
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _append_locked(self, body: dict[str, Any], deadline: float, limit: float, *,
                       sync: bool = True) -> dict[str, Any]:
        fd, size = self._open_log()
        tail, size, pending = self._current_tail(fd, size)
        self._tree.sync(tail.seq, lambda: last_line_in(fd, size))
        for extra in pending:
            tail, size = self._emit(fd, size, tail, extra)
        if time.monotonic() > deadline:
            raise AuditUnavailable(
                f"cannot append to the audit log {self.path}: the append took longer than {limit:g} s "
                "(a slow or stalled disk?); the row was not written. fix: check the disk holding it")
        row, line = self._stamp(body, tail)
        if size > 0 and size + len(line) > self.max_bytes:
            fd, size, dropped = self._rotate(tail)
            tail, size = self._emit(fd, size, tail, self._rotation_marker(dropped))
            row, line = self._stamp(body, tail)
        self._append_line(fd, size, line, flush=sync and self.durable)
        if sync:
            self._unsynced = 0  # this row's fdatasync took the grouped rows before it too
        else:
            self._unsynced += 1
        self._tree.add(line[:-1])
        self._tail = _Tail(row["seq"], row["hash"], (*self._ident, size + len(line)))
        if self.key_file is not None and self._checkpoint_due(row["seq"]):
            self._try_checkpoint(self._tail)
        return row

    def _rotation_marker(self, dropped: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        marker: dict[str, Any] = {"phase": ROTATED_PHASE, "max_bytes": self.max_bytes}
        if dropped:
            marker["dropped"] = list(dropped)
        return marker

    # -- checkpoints ---------------------------------------------------------------------------------

    def _checkpoint_due(self, seq: int) -> bool:
        last_seq, when = self._checkpointed
        return (seq - last_seq >= self.checkpoint_rows
                or (seq > last_seq and time.monotonic() - when >= self.checkpoint_seconds))

    def _try_checkpoint(self, tail: _Tail) -> None:
        """A checkpoint after a row already in the log: its failure is logged and counted, never
        raised (the row was written; failing the write would make the caller think it was not)."""
        try:
            self._write_checkpoint(tail)
        except (OSError, ValueError, AuditUnavailable) as exc:
            self._checkpointed = (tail.seq, time.monotonic())  # next attempt after the usual interval
            self._count("checkpoint_failures")
            log.warning("could not write a signed checkpoint of the audit log %s (seq %d): %s",
                        self.path, tail.seq, exc)

    def _signed_head(self) -> tuple[int, str] | None:
        """(seq, hash) of the newest entry in the checkpoint file (under the file lock), or None."""
        try:
            fd = os.open(self.checkpoint_file, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            for _, line in reverse_lines(fd, os.fstat(fd).st_size):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and type(entry.get("seq")) is int:
                    return entry["seq"], str(entry.get("hash"))
            return None
        finally:
            os.close(fd)

    def _write_checkpoint(self, tail: _Tail) -> dict[str, Any]:
        """Append a signed (seq, hash) of the chain's head to the checkpoint file (under the file lock)."""
        assert self.key_file is not None
        if self._signer is None:
            self._signer = load_or_create_signing_key(self.key_file)
        self._sync_unsynced()  # a checkpoint signs only rows on the disk
        head: dict[str, Any] = {"seq": tail.seq, "hash": tail.hash, "ts": format_ts(self._clock()),
                                "log": self.path.name}
        frontier = self._tree.frontier
        if frontier is not None and frontier.size == tail.seq:
            self._tree.flush()  # the hashes a proof against this checkpoint reads are on disk first
            head.update(self.publisher.note_fields(frontier.size, frontier.root(), self._signer))
        entry = sign_checkpoint(self._signer, head)
        line = (json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n").encode("ascii")
        fd = open_private(self.checkpoint_file, os.O_WRONLY | os.O_APPEND)
        try:
            _write_all(fd, line, flush=self.durable)
        finally:
            os.close(fd)
        self._checkpointed = (tail.seq, time.monotonic())
        self._count("checkpoints")
        self.publisher.publish(entry)
        return entry

    def _count(self, name: str, amount: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += amount

    def _current_tail(self, fd: int, size: int) -> tuple[_Tail, int, list[dict[str, Any]]]:
        """The chain's last (seq, hash), the file's size, and any bookkeeping rows to write first (the
        rotation marker after a crash mid-rotation, the record of a removed torn line).

        The cached tail is trusted only while the file is the one this process last appended to, at
        the size it left it; any other append shows as a different size and the tail is re-read."""
        if self._tail is not None and self._tail.key == (*self._ident, size):
            return self._tail, size, []
        pending: list[dict[str, Any]] = []
        if size:
            size, repair = self._repair_torn_tail(fd, size)
            pending.extend([repair] if repair else [])
        disk = self._tail_on_disk(fd, size, pending)
        if self._tail is not None and self._tail.seq > disk.seq:
            log.warning("audit log %s holds fewer rows (seq %d) than this process wrote (seq %d): it was "
                        "truncated or replaced; continuing the chain so `gateway audit verify` shows the gap",
                        self.path, disk.seq, self._tail.seq)
            return self._tail, size, pending
        return disk, size, pending

    def _tail_on_disk(self, fd: int, size: int, pending: list[dict[str, Any]]) -> _Tail:
        if size == 0:
            row = last_row_of_file(rotated_path(self.path, 1))
            if row is not None:
                # The previous file was rotated away but this one never got its marker (a crash).
                pending.insert(0, self._rotation_marker())
        elif (row := last_row_in(fd, size)) is None:
            log.warning("audit log %s holds no valid row to chain from; starting a new chain after its "
                        "content (`gateway audit verify` will flag it)", self.path)
        return _Tail(row["seq"], row["hash"]) if row is not None else _START

    def _repair_torn_tail(self, fd: int, size: int) -> tuple[int, dict[str, Any] | None]:
        """Complete or cut a last line lacking its newline: the new size, and the record of a cut."""
        offset, fragment = next(reverse_lines(fd, size))
        if fragment.endswith(b"\n"):
            return size, None
        if parse_row(fragment) is not None:
            self._append_line(fd, size, b"\n")
            return size + 1, None
        os.ftruncate(fd, offset)
        log.warning("audit log %s ended with a torn line (%d bytes, an interrupted write); removed it",
                    self.path, len(fragment))
        return offset, {"phase": REPAIRED_PHASE, "torn_bytes": len(fragment),
                        "torn_sha256": hashlib.sha256(fragment).hexdigest()}

    def _stamp(self, body: Mapping[str, Any], tail: _Tail) -> tuple[dict[str, Any], bytes]:
        row = stamp(body, tail.seq + 1, tail.hash, self._clock())
        return row, row_line(row) + b"\n"

    def _emit(self, fd: int, size: int, tail: _Tail, body: Mapping[str, Any]) -> tuple[_Tail, int]:
        """Append a bookkeeping row; return the new tail and file size."""
        row, line = self._stamp(prepare_event(body), tail)
        self._append_line(fd, size, line)
        self._tree.add(line[:-1])
        return _Tail(row["seq"], row["hash"]), size + len(line)

    def _append_line(self, fd: int, size: int, line: bytes, *, flush: bool | None = None) -> None:
        """Append all of ``line`` and flush it (``flush``, by default ``durable``), or cut the file back
        to ``size`` bytes and raise."""
        try:
            _write_all(fd, line, flush=self.durable if flush is None else flush)
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError as exc:
                log.warning("could not remove a partial line from the audit log %s: %s", self.path, exc)
            raise

    def _rotate(self, tail: _Tail) -> tuple[int, int, list[dict[str, Any]]]:
        """Sign the head (the end of the file being rotated), apply retention, shift ``.k`` to ``.k+1``
        and the log to ``.1``, open a new log. Returns its descriptor, size and what retention dropped."""
        if self.key_file is not None and tail.seq > self._checkpointed[0]:
            self._try_checkpoint(tail)
        dropped = self._apply_retention()
        rotated = log_files(self.path)[:-1]
        for old in rotated:  # oldest (highest index) first, so no rename lands on an existing file
            index = int(old.name.rsplit(".", 1)[1])
            old.rename(rotated_path(self.path, index + 1))
        self.path.rename(rotated_path(self.path, 1))
        self._drop_fd()
        self._count("rotations")
        self._rotated_bytes = sum(_size_of(f) for f in log_files(self.path))  # the log itself is gone now
        fd, size = self._open_log()
        return fd, size, dropped

    def _apply_retention(self) -> list[dict[str, Any]]:
        """Drop the oldest rotated files beyond the budget (``keep`` files after this rotation, and
        ``max_total_bytes`` in all) or older than ``max_age_seconds``, but never one holding rows
        younger than ``retain_seconds``: that one is kept over budget, loudly. Every drop is logged
        (file, seq range, rows) before the file goes."""
        rotated = log_files(self.path)[:-1]  # oldest first
        current = _size_of(self.path)
        sizes = [_size_of(f) for f in rotated]
        now = self._clock()
        dropped: list[dict[str, Any]] = []
        over_budget_kept = 0
        for position, file in enumerate(rotated):
            remaining = rotated[position:]
            total = current + sum(sizes[position:])
            summary = _file_summary(file)
            age = (now - summary["last_ts"]).total_seconds() if summary["last_ts"] else None
            too_many = len(remaining) >= self.keep  # after rotation the current log becomes one more
            too_big = total > self.max_total_bytes
            too_old = self.max_age_seconds is not None and age is not None and age > self.max_age_seconds
            if not (too_many or too_big or too_old):
                break
            if age is not None and age < self.retain_seconds and not too_old:
                over_budget_kept += 1
                continue
            record = {"file": file.name, "first_seq": summary["first_seq"], "last_seq": summary["last_seq"],
                      "rows": summary["rows"], "bytes": sizes[position],
                      "last_ts": format_ts(summary["last_ts"]) if summary["last_ts"] else None}
            log.warning("AUDIT RETENTION: dropping %s (rows seq %s..%s, %s rows, last %s): beyond the "
                        "retention budget (keep=%d files, %d bytes, max age %s s); ship the log elsewhere "
                        "before rotation if these rows must be kept", file, record["first_seq"],
                        record["last_seq"], record["rows"], record["last_ts"], self.keep,
                        self.max_total_bytes, self.max_age_seconds)
            file.unlink()
            dropped.append(record)
            self._count("files_dropped")
            self._count("rows_dropped", int(summary["rows"]))
        if over_budget_kept:
            self._count("files_kept_over_budget", over_budget_kept)
            log.warning("AUDIT RETENTION: keeping %d rotated audit file(s) of %s beyond the budget (keep=%d, "
                        "%d bytes): they hold rows younger than retain_seconds=%g; free disk space or ship "
                        "and remove them by hand", over_budget_kept, self.path, self.keep,
                        self.max_total_bytes, self.retain_seconds)
        return dropped


def _write_all(fd: int, data: bytes, *, flush: bool) -> None:
    """Write all of ``data`` (continuing after a short write); with ``flush``, to the disk itself."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if flush:
        os.fdatasync(fd)


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _file_summary(path: Path) -> dict[str, Any]:
    """First and last seq, row count and the last row's time of one log file, read from its two ends
    (seqs are consecutive within a file, so the count needs no full scan)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {"first_seq": None, "last_seq": None, "rows": 0, "last_ts": None}
    try:
        size = os.fstat(fd).st_size
        first = next((row for raw in forward_lines(fd, size) if (row := parse_row(raw)) is not None), None)
        last = last_row_in(fd, size)
    finally:
        os.close(fd)
    if first is None or last is None:
        return {"first_seq": None, "last_seq": None, "rows": 0, "last_ts": None}
    rows = max(0, last["seq"] - first["seq"] + 1)
    return {"first_seq": first["seq"], "last_seq": last["seq"], "rows": rows,
            "last_ts": parse_ts(last.get("ts"))}
