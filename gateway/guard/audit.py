"""The tamper-evident audit log: append-only, hash-chained JSON lines with secret redaction.

One line per tool call and per lifecycle event. Every row is stamped with ``ts`` (UTC, ms), ``seq``
(1, 2, 3, ... across rotated files), ``prev`` (the previous row's hash; ``GENESIS`` for the first)
and ``hash``: the SHA-256 of the row's canonical JSON (sorted keys, compact, ASCII) without ``hash``.
Editing, deleting, reordering or inserting a line breaks the chain at that line, which ``verify``
names. The chain is unkeyed: it proves the file is internally consistent, not who wrote it. Someone
able to rewrite the whole file from the edit onwards can forge a consistent one, so ship the lines
off the host (any log pipeline can tail the file) when that matters.

Contracts:
- ``AuditSink.write`` returns only once the row is in the file (and flushed to disk when
  ``durable``); otherwise it raises ``AuditUnavailable`` and the caller must refuse the call. It never
  waits forever: the sink's thread lock and the file lock are tried until ``lock_timeout`` (5 s by
  default) and a held lock fails the write naming the lock file. The flush itself cannot be
  interrupted, so callers on an event loop run ``write`` in a worker thread under their own deadline.
- Several processes (server, CLI) may append to the same file at once: each append holds an
  exclusive ``flock`` on the sidecar ``<name>.lock`` (never renamed, so rotation cannot split the
  lock) and re-reads the tail when the file changed since this process last wrote.
- Rows are bounded (``gateway.audit.bounds.bounded``): long strings are cut to a prefix with their
  size and digest, containers to ``MAX_ITEMS`` items and ``MAX_BOUNDED_DEPTH`` levels, so no caller
  can write a big row.
- Rotation by size renames ``<name>`` to ``<name>.1`` (older files shift up) and starts the new file
  with an ``audit_rotated`` row continuing ``seq`` and ``prev``, so the chain verifies across files.
  Retention keeps ``keep`` files and ``max_total_bytes`` (and drops files older than
  ``max_age_seconds`` when set) but never drops a file holding rows younger than ``retain_seconds``;
  each drop is logged loudly first, counted in ``stats()`` and listed in the next rotation marker.
  Pruned files show as a chain starting at such a marker.
- With a ``key_file``, the chain's head is signed (Ed25519) into ``<name>.checkpoints`` every
  ``checkpoint_rows`` rows or ``checkpoint_seconds``, on rotation and on close; ``verify(...,
  checkpoints=True)`` then detects a cut tail and a consistently rewritten history, which the chain
  alone cannot.
- A torn last line (a write interrupted by a crash) is reported by ``verify`` as torn, not as
  tampering; the next append removes it and records an ``audit_repaired`` row with its digest.
- Secrets never reach the file: ``gateway.audit.redact`` masks values under credential-like keys and
  credential-shaped text (well-known secret formats wherever they appear); correlation ids are never
  masked (unless one is a token of such a format); a ``result`` is stored only as ``result_digest`` +
  ``result_size``: SHA-256 and length of the answer text the caller was sent (``gateway.answer``).
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gateway.answer import Answer, answer_bytes, encode_json
from gateway.audit.bounds import bounded
from gateway.errors import AuditUnavailable
from gateway.private_files import make_private_dirs, open_private

log = logging.getLogger(__name__)

GENESIS = "0" * 64
#: phase of the row that opens a file after rotation
ROTATED_PHASE = "audit_rotated"
#: phase of the row recording that a torn (crash-interrupted) last line was removed
REPAIRED_PHASE = "audit_repaired"
#: fields the sink stamps; callers cannot set them
STAMPED = ("ts", "seq", "prev", "hash")
#: ``writable()`` wants at least this much free space on the log's filesystem
MIN_FREE_BYTES = 1024 * 1024
#: rotated files holding rows younger than this are never dropped by retention (7 days)
DEFAULT_RETAIN_SECONDS = 7 * 24 * 3600.0
#: a signed checkpoint of the chain's head is written after this many rows ...
DEFAULT_CHECKPOINT_ROWS = 1000
#: ... or on the first write this long after the previous one (and on rotation and close)
DEFAULT_CHECKPOINT_SECONDS = 300.0
_STAT_NAMES = ("rows_written", "rotations", "files_dropped", "rows_dropped", "files_kept_over_budget",
               "checkpoints", "checkpoint_failures", "lock_timeouts")
#: how long ``AuditSink.write`` waits for the log's lock (held by another writer) before giving up
DEFAULT_LOCK_TIMEOUT = 5.0

# ---------------------------------------------------------------------------------------------------
# Rows and the chain
# ---------------------------------------------------------------------------------------------------

def canonical_json(value: Any) -> bytes:
    """Sorted keys, compact separators, ASCII: the bytes a row's hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def row_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the row's canonical JSON without its own ``hash`` field (``prev`` included)."""
    return hashlib.sha256(canonical_json({k: v for k, v in row.items() if k != "hash"})).hexdigest()


def result_fingerprint(result: Any) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a tool result's answer text (``gateway.answer``): what the log
    keeps of it. ``result`` may be the ``Answer`` the caller was sent, or its bytes."""
    if isinstance(result, bytes | bytearray):
        data = bytes(result)
    elif isinstance(result, Answer):
        data = result.data
    else:
        try:
            data = answer_bytes(encode_json(result)[0])
        except (TypeError, ValueError):
            data = repr(result).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest(), len(data)


def prepare_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's event as it will be logged, before stamping: stamp fields dropped, ``result``
    replaced by its digest and size, everything else redacted and bounded (see ``bounded``)."""
    body = {k: v for k, v in event.items() if k not in STAMPED and k != "result"}
    if "result" in event:
        body["result_digest"], body["result_size"] = result_fingerprint(event["result"])
    prepared: dict[str, Any] = bounded(body)
    return prepared


def format_ts(moment: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: ``2026-08-20T14:02:11.204Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_ts(text: Any) -> datetime | None:
    """A row's ``ts`` as an aware datetime, or None when missing or malformed."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _parse_row(raw: bytes) -> dict[str, Any] | None:
    """A stamped row from one line, or None when the line is not one."""
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(row, dict) and type(row.get("seq")) is int and isinstance(row.get("hash"), str)
            and isinstance(row.get("prev"), str)):
        return None
    return row


def log_files(path: Path) -> list[Path]:
    """The log and its rotated predecessors that exist, oldest first (``.N`` ... ``.1``, then ``path``)."""
    rotated: list[tuple[int, Path]] = []
    if path.parent.is_dir():
        prefix = path.name + "."
        for entry in path.parent.iterdir():
            suffix = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
            if suffix.isascii() and suffix.isdigit() and not suffix.startswith("0"):
                rotated.append((int(suffix), entry))
    files = [p for _, p in sorted(rotated, reverse=True)]
    return [*files, path] if path.exists() else files


def _rotated(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


# ---------------------------------------------------------------------------------------------------
# Tail reading (raw file descriptors: the sink reads under its lock)
# ---------------------------------------------------------------------------------------------------

_CHUNK = 64 * 1024


def _reverse_lines(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) from the end of the file backwards; lines keep their newline (the last may lack it)."""
    position = size
    pending = b""
    while position > 0:
        step = min(_CHUNK, position)
        position -= step
        pending = os.pread(fd, step, position) + pending
        end = len(pending)
        cut = pending.rfind(b"\n", 0, end - 1)
        while cut >= 0:
            yield position + cut + 1, pending[cut + 1:end]
            end = cut + 1
            cut = pending.rfind(b"\n", 0, end - 1)
        pending = pending[:end]
    if pending:
        yield 0, pending


def _forward_lines(fd: int, size: int) -> Iterator[bytes]:
    """The first ``size`` bytes as lines keeping their newline (the last may lack it)."""
    offset, pending = 0, b""
    while offset < size:
        chunk = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not chunk:
            break
        offset += len(chunk)
        *complete, pending = (pending + chunk).split(b"\n")
        for line in complete:
            yield line + b"\n"
    if pending:
        yield pending


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def _shared_lock(path: Path) -> Iterator[None]:
    """Hold the writers' lock shared (writers wait; readers do not wait for each other). Without
    access to the lock file (another user, or no writer yet) proceed unlocked."""
    try:
        lock_fd = os.open(_lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(lock_fd)


@contextlib.contextmanager
def _snapshot(path: Path, also: list[bytes | None] | None = None) -> Iterator[list[tuple[Path, int, int]]]:
    """The log's files, oldest first, as (path, open descriptor, size). Listed and opened under the
    shared lock, so no rotation falls in between and every size ends on a whole line; reading up to
    those sizes afterwards (unlocked) gives a consistent view that later appends do not disturb.
    With ``also``, the checkpoint file's content (None when missing) is appended to it, read under
    the same lock so it matches the rows seen."""
    opened: list[tuple[Path, int, int]] = []
    try:
        with _shared_lock(path):
            for file in log_files(path):
                with contextlib.suppress(FileNotFoundError):
                    fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
                    opened.append((file, fd, os.fstat(fd).st_size))
            if also is not None:
                try:
                    also.append(checkpoint_path(path).read_bytes())
                except FileNotFoundError:
                    also.append(None)
        yield opened
    finally:
        for _, fd, _ in opened:
            _close_quietly(fd)


@dataclass(frozen=True)
class _Tail:
    """Where the chain stands: the last row's seq and hash, for the file identity it was read from."""

    seq: int
    hash: str
    key: tuple[int, int, int] = (0, 0, -1)


_START = _Tail(0, GENESIS)


def _last_row_in(fd: int, size: int) -> dict[str, Any] | None:
    """The last complete line that is a stamped row (garbage lines after it are skipped)."""
    for _, line in _reverse_lines(fd, size):
        if line.endswith(b"\n") and (row := _parse_row(line)) is not None:
            return row
    return None


def _last_row_of_file(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return _last_row_in(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# Checkpoints: the chain's head signed with Ed25519
# ---------------------------------------------------------------------------------------------------

#: the signing key's file name in the state directory (GATEWAY_HOME)
SIGNING_KEY_NAME = "audit-signing.key"


def checkpoint_path(path: Path) -> Path:
    """The checkpoint file beside a log: ``<name>.checkpoints`` (JSON lines, one signed head each)."""
    return Path(path).with_name(Path(path).name + ".checkpoints")


def load_or_create_signing_key(key_file: Path) -> Ed25519PrivateKey:
    """The Ed25519 key in ``key_file`` (PEM, PKCS#8), generated (mode 0600) when the file is missing.

    Creation is exclusive (two processes starting at once end up with one key) and flushed to disk.
    A key file readable by group or others is refused: anyone who can read it can forge checkpoints.
    """
    key_file = Path(key_file)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    make_private_dirs(key_file.parent)
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return _read_signing_key(key_file)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    log.info("created the audit signing key %s; its public key (pin it off this host): %s",
                key_file, public_key_text(key.public_key()))
    return key


def _read_signing_key(key_file: Path) -> Ed25519PrivateKey:
    mode = key_file.stat().st_mode
    if mode & 0o077:
        raise AuditUnavailable(f"the audit signing key {key_file} is readable by others (mode "
                               f"{stat.S_IMODE(mode):o}); fix: chmod 600 {key_file}")
    try:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise AuditUnavailable(f"the audit signing key {key_file} cannot be read as a private key ({exc}); "
                               "fix: restore it from a backup, or move it away and let the gateway create "
                               "a new one (then pin the new public key)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditUnavailable(f"the audit signing key {key_file} is not an Ed25519 key; fix: move it "
                               "away and let the gateway create a new one")
    return key


def public_key_text(key: Ed25519PublicKey) -> str:
    """A public key as ``ed25519:<hex of its 32 raw bytes>``: what checkpoints carry and operators pin."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"ed25519:{raw.hex()}"


def parse_public_key(text: str) -> Ed25519PublicKey:
    """The key ``public_key_text`` printed; ``ValueError`` naming the expected form otherwise."""
    body = text.strip().removeprefix("ed25519:")
    try:
        raw = bytes.fromhex(body)
        if len(raw) != 32:
            raise ValueError
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a public key; expected ed25519:<64 hex digits> as printed by "
                         "`gateway audit key`") from None


def sign_checkpoint(key: Ed25519PrivateKey, head: Mapping[str, Any]) -> dict[str, Any]:
    """``head`` plus the signer's public key and an Ed25519 signature over their canonical JSON."""
    entry = {**head, "public_key": public_key_text(key.public_key())}
    entry["sig"] = key.sign(canonical_json(entry)).hex()
    return entry


def checkpoint_signature_ok(entry: Mapping[str, Any], key: Ed25519PublicKey) -> bool:
    """Whether ``entry`` (a checkpoint line) was signed by ``key`` exactly as it stands."""
    try:
        signature = bytes.fromhex(str(entry["sig"]))
        key.verify(signature, canonical_json({k: v for k, v in entry.items() if k != "sig"}))
    except (KeyError, ValueError, TypeError, InvalidSignature):
        return False
    return True


# ---------------------------------------------------------------------------------------------------
# The sink
# ---------------------------------------------------------------------------------------------------

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


class _SinkSettings(Protocol):
    """What ``AuditSink.for_settings`` reads of ``gateway.settings.Settings``."""

    @property
    def audit_log(self) -> Path: ...
    @property
    def audit_max_bytes(self) -> int: ...
    @property
    def signing_key_file(self) -> Path: ...


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
                 checkpoint_seconds: float = DEFAULT_CHECKPOINT_SECONDS) -> None:
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

    @classmethod
    def for_settings(cls, settings: _SinkSettings, **options: Any) -> AuditSink:
        """The sink a gateway process uses: ``settings.audit_log`` rotated at ``audit_max_bytes``,
        checkpoints signed with ``settings.signing_key_file`` (GATEWAY_AUDIT_SIGNING_KEY_FILE; default
        ``<home>/audit-signing.key``)."""
        return cls(settings.audit_log, max_bytes=settings.audit_max_bytes,
                   key_file=settings.signing_key_file, **options)

    def __enter__(self) -> AuditSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Redact, bound, stamp and append one row; return the row as written.

        Raises ``AuditUnavailable`` (naming the path, the OS error and the fix) when the row could not
        be appended; nothing of it is left in the file then. Waiting is bounded: the sink's own lock
        and the ``<name>.lock`` file lock are tried until ``timeout`` seconds (default
        ``lock_timeout``) have passed, and a row is not appended once they have. The disk flush itself
        cannot be interrupted: callers on an event loop run this in a worker thread under their own
        deadline (``asyncio.wait_for``).
        """
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
                    row = self._append_locked(body, deadline, limit)
                finally:
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
            except OSError as exc:
                self._drop_fd()
                raise _unavailable(self.path, exc) from exc
            self._count("rows_written")
            return row
        finally:
            self._lock.release()

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
                lock = _lock_path(self.path)
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
        """Sign the chain's head now (no-op without a ``key_file``); return the checkpoint written."""
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
                return self._write_checkpoint(tail) if tail.seq else None
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
            self._drop_fd()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # -- internals (called with self._lock held) -------------------------------------------------

    def _ensure_lock_fd(self) -> int:
        if self._pid != os.getpid():
            # A forked child shares the parent's open files, and with them the flock: start afresh.
            for fd in (self._lock_fd, self._fd):
                if fd is not None:
                    _close_quietly(fd)
            self._lock_fd = self._fd = None
            self._tail = None
            self._pid = os.getpid()
        if self._lock_fd is None:
            make_private_dirs(self.path.parent)
            self._lock_fd = open_private(_lock_path(self.path), os.O_RDWR)
        return self._lock_fd

    def _drop_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _close_quietly(fd)

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

    def _append_locked(self, body: dict[str, Any], deadline: float, limit: float) -> dict[str, Any]:
        fd, size = self._open_log()
        tail, size, pending = self._current_tail(fd, size)
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
        self._append_line(fd, size, line)
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

    def _write_checkpoint(self, tail: _Tail) -> dict[str, Any]:
        """Append a signed (seq, hash) of the chain's head to the checkpoint file (under the file lock)."""
        assert self.key_file is not None
        if self._signer is None:
            self._signer = load_or_create_signing_key(self.key_file)
        entry = sign_checkpoint(self._signer, {"seq": tail.seq, "hash": tail.hash,
                                               "ts": format_ts(self._clock()), "log": self.path.name})
        line = (json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n").encode("ascii")
        fd = open_private(self.checkpoint_file, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            if self.durable:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        self._checkpointed = (tail.seq, time.monotonic())
        self._count("checkpoints")
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
            row = _last_row_of_file(_rotated(self.path, 1))
            if row is not None:
                # The previous file was rotated away but this one never got its marker (a crash).
                pending.insert(0, self._rotation_marker())
        elif (row := _last_row_in(fd, size)) is None:
            log.warning("audit log %s holds no valid row to chain from; starting a new chain after its "
                        "content (`gateway audit verify` will flag it)", self.path)
        return _Tail(row["seq"], row["hash"]) if row is not None else _START

    def _repair_torn_tail(self, fd: int, size: int) -> tuple[int, dict[str, Any] | None]:
        """Complete or cut a last line lacking its newline: the new size, and the record of a cut."""
        offset, fragment = next(_reverse_lines(fd, size))
        if fragment.endswith(b"\n"):
            return size, None
        if _parse_row(fragment) is not None:
            self._append_line(fd, size, b"\n")
            return size + 1, None
        os.ftruncate(fd, offset)
        log.warning("audit log %s ended with a torn line (%d bytes, an interrupted write); removed it",
                    self.path, len(fragment))
        return offset, {"phase": REPAIRED_PHASE, "torn_bytes": len(fragment),
                        "torn_sha256": hashlib.sha256(fragment).hexdigest()}

    def _stamp(self, body: Mapping[str, Any], tail: _Tail) -> tuple[dict[str, Any], bytes]:
        row: dict[str, Any] = {"ts": format_ts(self._clock()), "seq": tail.seq + 1}
        row.update(body)
        row["prev"] = tail.hash
        row["hash"] = row_hash(row)
        try:
            return row, (json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escape it rather than lose the row
            return row, (json.dumps(row, separators=(",", ":")) + "\n").encode("ascii")

    def _emit(self, fd: int, size: int, tail: _Tail, body: Mapping[str, Any]) -> tuple[_Tail, int]:
        """Append a bookkeeping row; return the new tail and file size."""
        row, line = self._stamp(prepare_event(body), tail)
        self._append_line(fd, size, line)
        return _Tail(row["seq"], row["hash"]), size + len(line)

    def _append_line(self, fd: int, size: int, line: bytes) -> None:
        """Append all of ``line`` and flush it, or cut the file back to ``size`` bytes and raise."""
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            if self.durable:
                os.fdatasync(fd)
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
            old.rename(_rotated(self.path, index + 1))
        self.path.rename(_rotated(self.path, 1))
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
        first = next((row for raw in _forward_lines(fd, size) if (row := _parse_row(raw)) is not None), None)
        last = _last_row_in(fd, size)
    finally:
        os.close(fd)
    if first is None or last is None:
        return {"first_seq": None, "last_seq": None, "rows": 0, "last_ts": None}
    rows = max(0, last["seq"] - first["seq"] + 1)
    return {"first_seq": first["seq"], "last_seq": last["seq"], "rows": rows,
            "last_ts": parse_ts(last.get("ts"))}


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


# ---------------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LineFault:
    """One line that breaks the chain (or is torn): where, a stable ``reason`` code and details."""

    file: Path
    line: int
    reason: str  # not_json | hash_mismatch | seq_gap | prev_mismatch | torn
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}: {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of walking the chain. ``ok`` only when no line is broken and none is torn."""

    files: tuple[Path, ...]
    rows: int
    first_seq: int | None
    last_seq: int | None
    first_broken_line: LineFault | None
    torn_last_line: LineFault | None
    #: how many lines broke the chain (the first is ``first_broken_line``)
    problems: int
    #: the oldest kept file starts at a rotation marker: earlier rows were rotated away
    starts_after_rotation: bool
    #: the check against signed checkpoints, when asked for
    checkpoint: CheckpointReport | None = None

    @property
    def ok(self) -> bool:
        return (self.first_broken_line is None and self.torn_last_line is None
                and (self.checkpoint is None or self.checkpoint.ok))


class _ChainCheck:
    """Walks rows in order, re-anchoring after each break so one edit is reported once."""

    def __init__(self) -> None:
        self.expected_seq: int | None = None
        self.expected_prev = GENESIS
        self.rows = 0
        self.first_seq: int | None = None
        self.faults: list[LineFault] = []
        self.starts_after_rotation = False

    def fault(self, file: Path, line: int, reason: str, detail: str) -> None:
        self.faults.append(LineFault(file, line, reason, detail))

    def row(self, file: Path, line: int, row: dict[str, Any]) -> None:
        problem = self._problem(row)
        if problem is not None:
            self.fault(file, line, *problem)
        if self.first_seq is None:
            self.first_seq = row["seq"]
        self.rows += 1
        self.expected_seq = row["seq"] + 1
        self.expected_prev = row["hash"]

    def _problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        if row_hash(row) != row["hash"]:
            return "hash_mismatch", "the row's content does not match its hash: it was edited after writing"
        if self.expected_seq is None:
            return self._start_problem(row)
        if row["seq"] != self.expected_seq:
            what = "rows are missing" if row["seq"] > self.expected_seq else "rows are out of order"
            return "seq_gap", f"expected seq {self.expected_seq}, found {row['seq']}: {what}"
        if row["prev"] != self.expected_prev:
            return "prev_mismatch", "prev does not match the hash of the line before: a row was replaced"
        return None

    def _start_problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        if row.get("phase") == ROTATED_PHASE:
            self.starts_after_rotation = row["seq"] > 1
            return None
        if row["seq"] != 1:
            return "seq_gap", (f"the log starts at seq {row['seq']} without a rotation marker: "
                               "the rows before it were removed")
        if row["prev"] != GENESIS:
            return "prev_mismatch", "the first row does not start the chain (prev is not the genesis value)"
        return None


def _numbered_lines(fd: int, size: int) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw line, is it the last line)."""
    previous: bytes | None = None
    number = 0
    for raw in _forward_lines(fd, size):
        if previous is not None:
            yield number, previous, False
        number += 1
        previous = raw
    if previous is not None:
        yield number, previous, True


@dataclass(frozen=True)
class CheckpointFault:
    """One checkpoint that does not hold: its line in the checkpoint file, a stable reason, details."""

    line: int
    reason: str  # missing | not_json | bad_signature | key_mismatch | cut_tail | rewritten
    detail: str

    def __str__(self) -> str:
        return f"checkpoint line {self.line}: {self.reason}: {self.detail}" if self.line else \
            f"{self.reason}: {self.detail}"


@dataclass(frozen=True)
class CheckpointReport:
    """The log checked against its signed checkpoints."""

    file: Path
    #: checkpoints whose row is in the log and matched
    checked: int
    #: checkpoints of rows rotated away by retention (nothing left to compare)
    skipped: int
    #: the newest checkpoint's seq (rows after it are protected by the chain alone)
    last_seq: int | None
    public_key: str | None
    faults: tuple[CheckpointFault, ...]

    @property
    def ok(self) -> bool:
        return not self.faults

    @property
    def first_fault(self) -> CheckpointFault | None:
        return self.faults[0] if self.faults else None


def verify(path: Path, *, checkpoints: bool = False,
           public_key: Ed25519PublicKey | None = None) -> VerifyReport:
    """Walk the log and its rotated predecessors in order and check every line's hash, seq and prev.

    A final line of the newest file that lacks its newline or does not parse is reported as
    ``torn_last_line`` (an interrupted write), not as a break; anywhere else it is ``not_json``.
    Safe to run while writers append: it checks the log as it stood when it started.

    With ``checkpoints``, the signed heads in ``<name>.checkpoints`` are checked as well (see
    ``CheckpointReport``): each must carry a valid signature (by ``public_key`` when given, else by
    the key of the first checkpoint), and the row at its seq must still be in the log with the signed
    hash. A log cut below a signed seq (``cut_tail``) or rewritten and re-hashed (``rewritten``) fails.
    """
    check = _ChainCheck()
    torn: LineFault | None = None
    raw_checkpoints: list[bytes | None] = []
    with _snapshot(Path(path), raw_checkpoints if checkpoints else None) as files:
        entries = _parse_checkpoints(raw_checkpoints[0]) if checkpoints else None
        wanted = {entry["seq"] for _, entry in entries or () if isinstance(entry.get("seq"), int)}
        hashes: dict[int, str] = {}
        for index, (file, fd, size) in enumerate(files):
            newest = index == len(files) - 1
            for number, raw, last in _numbered_lines(fd, size):
                row = _parse_row(raw)
                if newest and last and (row is None or not raw.endswith(b"\n")):
                    torn = LineFault(file, number, "torn", "the last line is incomplete (a write was "
                                     "interrupted, e.g. by a crash); this is not tampering")
                elif row is None:
                    check.fault(file, number, "not_json", "the line is not a stamped JSON row")
                if row is not None:
                    check.row(file, number, row)
                    if row["seq"] in wanted:
                        hashes[row["seq"]] = row["hash"]
    last_seq = None if check.expected_seq is None else check.expected_seq - 1
    checkpoint = None
    if entries is not None:
        checkpoint = _check_checkpoints(checkpoint_path(Path(path)), entries, hashes, check.first_seq,
                                        last_seq, public_key)
    return VerifyReport(
        files=tuple(file for file, _, _ in files), rows=check.rows, first_seq=check.first_seq,
        last_seq=last_seq,
        first_broken_line=check.faults[0] if check.faults else None, torn_last_line=torn,
        problems=len(check.faults), starts_after_rotation=check.starts_after_rotation,
        checkpoint=checkpoint,
    )


def _parse_checkpoints(data: bytes | None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, entry) of each line of the checkpoint file (none when it is missing).
    A line that is not a JSON object becomes an empty entry (reported as ``not_json``)."""
    entries: list[tuple[int, dict[str, Any]]] = []
    for number, raw in enumerate((data or b"").splitlines(), start=1):
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            entry = None
        entries.append((number, entry if isinstance(entry, dict) else {}))
    return entries


def _check_checkpoints(file: Path, entries: list[tuple[int, dict[str, Any]]],
                       hashes: Mapping[int, str], first_seq: int | None, last_seq: int | None,
                       pinned: Ed25519PublicKey | None) -> CheckpointReport:
    faults: list[CheckpointFault] = []
    checked = skipped = 0
    newest: int | None = None
    key_text = public_key_text(pinned) if pinned is not None else None
    if not entries:
        faults.append(CheckpointFault(0, "missing", f"no checkpoints in {file}: the log cannot be checked "
                                      "against a signed head (was the file removed, or no signing key set?)"))
    for number, entry in entries:
        seq, signed_hash, signer = entry.get("seq"), entry.get("hash"), entry.get("public_key")
        if not (type(seq) is int and isinstance(signed_hash, str) and isinstance(signer, str)):
            faults.append(CheckpointFault(number, "not_json", "the line is not a checkpoint"))
            continue
        key_text = key_text or signer
        if signer != key_text:
            faults.append(CheckpointFault(number, "key_mismatch", f"signed by {signer}, expected {key_text}"))
            continue
        try:
            key = parse_public_key(signer)
        except ValueError:
            key = None
        if key is None or not checkpoint_signature_ok(entry, key):
            faults.append(CheckpointFault(number, "bad_signature", f"the checkpoint of seq {seq} does not "
                                          "carry a valid signature: it was edited or forged"))
            continue
        newest = seq if newest is None else max(newest, seq)
        if last_seq is None or seq > last_seq:
            faults.append(CheckpointFault(number, "cut_tail", f"seq {seq} was signed but the log ends at "
                                          f"seq {last_seq}: rows were removed from its end"))
        elif first_seq is not None and seq < first_seq:
            skipped += 1
        elif hashes.get(seq) != signed_hash:
            faults.append(CheckpointFault(number, "rewritten", f"the row at seq {seq} is not the one signed: "
                                          "the history up to it was rewritten"))
        else:
            checked += 1
    return CheckpointReport(file, checked, skipped, newest, key_text, tuple(faults))


# ---------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------

#: read_rows filters matched by equality against the row's field of the same name
_EQUALITY_FILTERS = ("target", "tool", "phase", "caller", "correlation_id")


def _as_utc(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _in_window(row: Mapping[str, Any], since: datetime | None, until: datetime | None) -> bool:
    if since is None and until is None:
        return True
    moment = parse_ts(row.get("ts"))
    if moment is None:
        return False
    return (since is None or moment >= since) and (until is None or moment <= until)


def _rows_newest_first(path: Path) -> Generator[dict[str, Any], None, None]:
    with _snapshot(Path(path)) as files:
        for _, fd, size in reversed(files):
            for _, line in _reverse_lines(fd, size):
                if (row := _parse_row(line)) is not None:
                    yield row


def read_rows(path: Path, *, last: int | None = None, since: datetime | None = None,
              until: datetime | None = None, target: str | None = None, tool: str | None = None,
              phase: str | None = None, caller: str | None = None,
              correlation_id: str | None = None) -> list[dict[str, Any]]:
    """Rows matching every given filter, oldest first; with ``last``, only the newest ``last`` of them.

    Naive datetimes count as UTC. Lines that are not rows (torn, garbage) are skipped: use ``verify``
    to judge the file. Reading starts from the end, so ``last`` is cheap on a large log.
    """
    wanted = {name: value for name, value in zip(
        _EQUALITY_FILTERS, (target, tool, phase, caller, correlation_id), strict=True) if value is not None}
    start, end = _as_utc(since), _as_utc(until)
    found: list[dict[str, Any]] = []
    if last is not None and last <= 0:
        return found
    with contextlib.closing(_rows_newest_first(path)) as rows:
        for row in rows:
            if all(row.get(k) == v for k, v in wanted.items()) and _in_window(row, start, end):
                found.append(row)
                if last is not None and len(found) >= last:
                    break
    found.reverse()
    return found


#: stats() counters: output key -> row field
_STATS_FIELDS = {"by_phase": "phase", "by_tool": "tool", "by_target": "target", "by_caller": "caller",
                 "by_outcome": "outcome"}


def stats(path: Path, *, since: datetime | None = None) -> dict[str, Any]:
    """Counts of rows (since ``since``) by phase, tool, target, caller and outcome (most frequent first,
    ties by name); plus ``rows`` and the ``first_ts``/``last_ts`` seen. A row lacking a field is not
    counted under it."""
    counters = {name: Counter[str]() for name in _STATS_FIELDS}
    start = _as_utc(since)
    rows = 0
    first_ts = last_ts = None
    for row in _rows_newest_first(Path(path)):
        if not _in_window(row, start, None):
            continue
        rows += 1
        last_ts = last_ts or row.get("ts")
        first_ts = row.get("ts")
        for name, field_name in _STATS_FIELDS.items():
            value = row.get(field_name)
            if isinstance(value, str | int | bool):
                counters[name][str(value)] += 1
    summary: dict[str, Any] = {"rows": rows, "since": format_ts(start) if start else None,
                               "first_ts": first_ts, "last_ts": last_ts}
    summary.update({name: dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))
                    for name, counter in counters.items()})
    return summary
