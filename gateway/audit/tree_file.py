"""The JSONL log's Merkle tree on disk: ``<name>.tree``, every stored subtree hash, append-only.

Derived data: hashes are flushed before each checkpoint is signed, and ``FileTree.sync`` rebuilds
any missing or mismatched ones from the rows after a crash or another process's append.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from gateway.audit.chain import parse_row
from gateway.audit.files import close_quietly, forward_lines, log_files, reverse_lines
from gateway.audit.merkle import (
    HASH_SIZE,
    Frontier,
    frontier_indexes,
    leaf_hash,
    stored_hash_count,
    stored_hash_index,
    tree_size_for,
)
from gateway.private_files import open_private

log = logging.getLogger(__name__)


def tree_path(path: Path) -> Path:
    """The tree file beside a log: ``<name>.tree``."""
    return Path(path).with_name(Path(path).name + ".tree")


def read_hashes(fd: int, indexes: Sequence[int]) -> list[bytes]:
    """The stored hashes at ``indexes`` (``ValueError`` when one is beyond the file)."""
    found = []
    for index in indexes:
        data = os.pread(fd, HASH_SIZE, index * HASH_SIZE)
        if len(data) != HASH_SIZE:
            raise ValueError(f"the tree file holds no hash at position {index}")
        found.append(data)
    return found


def stored_leaf(fd: int, index: int) -> bytes | None:
    try:
        return read_hashes(fd, [stored_hash_index(0, index)])[0]
    except ValueError:
        return None


def row_lines_after(path: Path, seq: int) -> Iterator[bytes]:
    """The stored bytes (no newline) of every complete row after ``seq``, oldest first, across the log's
    files; stops at the first gap (a row rotated away cannot be hashed again)."""
    expected = seq + 1
    for fd, size in _opened(path):
        last = next((r for _, raw in reverse_lines(fd, size)
                     if raw.endswith(b"\n") and (r := parse_row(raw)) is not None), None)
        if last is None or last["seq"] < expected:
            continue
        for raw in forward_lines(fd, size):
            row = parse_row(raw) if raw.endswith(b"\n") else None
            if row is None or row["seq"] < expected:
                continue
            if row["seq"] != expected:
                return
            expected += 1
            yield raw[:-1]


def first_seq_of(path: Path) -> int | None:
    """The seq of the oldest row still in the log's files."""
    for fd, size in _opened(path):
        row = next((r for raw in forward_lines(fd, size) if (r := parse_row(raw)) is not None), None)
        if row is not None:
            return int(row["seq"])
    return None


def _opened(path: Path) -> Iterator[tuple[int, int]]:
    """Each of the log's files still there, oldest first, open for reading: (descriptor, size); each is
    closed when the caller moves on (or stops)."""
    for file in log_files(path):
        try:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            yield fd, os.fstat(fd).st_size
        finally:
            os.close(fd)


class FileTree:
    """The tree of one log as this process knows it: the frontier in memory, the hashes in the file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self.path = tree_path(self.log_path)
        self.frontier: Frontier | None = None  # None: not loaded (or no longer trusted)
        self.usable = True
        self._fd: int | None = None

    def sync(self, tail_seq: int, last_line: Callable[[], bytes | None]) -> None:
        """Make the tree hold exactly the ``tail_seq`` rows of the log (``last_line``: the newest row's
        stored bytes, read only when needed), rebuilding missing hashes from the rows. Called under the
        log's lock."""
        if not self.usable or (self.frontier is not None and self.frontier.size == tail_seq
                               and self._fd is not None):
            return  # in step, or found unusable once (never rescanned on every write)
        self.forget()
        fd = self._fd = open_private(self.path, os.O_RDWR | os.O_APPEND)
        size = os.fstat(fd).st_size // HASH_SIZE
        n = tree_size_for(size)
        while n is None:  # an append of hashes was cut: drop the partial one
            size -= 1
            n = tree_size_for(size)
        n = min(n, tail_seq)
        if n and n == tail_seq and (line := last_line()) is not None \
                and stored_leaf(fd, n - 1) != leaf_hash(line):
            retained = first_seq_of(self.log_path)
            log.warning("audit tree %s does not end with the log's newest row; rebuilding it from the "
                        "rows kept (seq %s on)", self.path, retained)
            n = 0 if retained is None or retained <= 1 else retained - 1
        os.ftruncate(fd, stored_hash_count(n) * HASH_SIZE)
        frontier = Frontier(n, read_hashes(fd, frontier_indexes(n)))
        if n < tail_seq:
            for line in row_lines_after(self.log_path, n):
                if frontier.size >= tail_seq:
                    break
                self._write(fd, frontier.append(leaf_hash(line)))
        if frontier.size != tail_seq:
            log.warning("audit tree %s cannot cover rows %d..%d (they were rotated away before the "
                        "tree existed); no checkpoint notes are signed for this log", self.path,
                        frontier.size + 1, tail_seq)
            self.usable = False
            return
        self.frontier = frontier

    def add(self, line: bytes) -> None:
        """Append the row whose stored bytes are ``line`` (after ``sync`` for the row before it)."""
        if self.frontier is None or self._fd is None:
            return
        try:
            self._write(self._fd, self.frontier.append(leaf_hash(line)))
        except OSError as exc:
            log.warning("could not append to the audit tree %s: %s; it is rebuilt on the next write",
                        self.path, exc)
            self.forget()

    def flush(self) -> None:
        if self._fd is not None:
            os.fdatasync(self._fd)

    def forget(self) -> None:
        """Re-read the tree from the file on the next ``sync`` (after a fork, or a failed append)."""
        self.frontier = None
        if self._fd is not None:
            fd, self._fd = self._fd, None
            close_quietly(fd)

    @staticmethod
    def _write(fd: int, hashes: Sequence[bytes]) -> None:
        data = memoryview(b"".join(hashes))
        while data:
            data = data[os.write(fd, data):]


def stored_reader(log_path: Path) -> Callable[[Sequence[int]], list[bytes]]:
    """Reads stored hashes from the log's tree file (``LookupError`` when it lacks one)."""

    def read(indexes: Sequence[int]) -> list[bytes]:
        try:
            fd = os.open(tree_path(log_path), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            raise LookupError(f"no audit tree file {tree_path(log_path)}") from None
        try:
            return read_hashes(fd, indexes)
        except ValueError as exc:
            raise LookupError(str(exc)) from None
        finally:
            os.close(fd)

    return read
