"""The JSONL log's files on disk: the rotated set, its lock and checkpoint files, lines read from either end.

A consistent snapshot is taken under the writers' lock; the sink, verification and queries share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.audit.chain import parse_row


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


def rotated_path(path: Path, index: int) -> Path:
    return path.with_name(f"{path.name}.{index}")


_CHUNK = 64 * 1024


def reverse_lines(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
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


def forward_lines(fd: int, size: int) -> Iterator[bytes]:
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


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def shared_lock(path: Path) -> Iterator[None]:
    """Hold the writers' lock shared (writers wait; readers do not wait for each other). Without
    access to the lock file (another user, or no writer yet) proceed unlocked."""
    try:
        lock_fd = os.open(lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(lock_fd)


@contextlib.contextmanager
def snapshot(path: Path, also: list[bytes | None] | None = None) -> Iterator[list[tuple[Path, int, int]]]:
    """The log's files, oldest first, as (path, open descriptor, size). Listed and opened under the
    shared lock, so no rotation falls in between and every size ends on a whole line; reading up to
    those sizes afterwards (unlocked) gives a consistent view that later appends do not disturb.
    With ``also``, the checkpoint file's content (None when missing) is appended to it, read under
    the same lock so it matches the rows seen."""
    opened: list[tuple[Path, int, int]] = []
    try:
        with shared_lock(path):
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
            close_quietly(fd)



def last_row_in(fd: int, size: int) -> dict[str, Any] | None:
    """The last complete line that is a stamped row (garbage lines after it are skipped)."""
    for _, line in reverse_lines(fd, size):
        if line.endswith(b"\n") and (row := parse_row(line)) is not None:
            return row
    return None


def last_line_in(fd: int, size: int) -> bytes | None:
    """The stored bytes (no newline) of the last complete line that is a stamped row."""
    for _, line in reverse_lines(fd, size):
        if line.endswith(b"\n") and parse_row(line) is not None:
            return line[:-1]
    return None


def last_row_of_file(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return last_row_in(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def checkpoint_path(path: Path) -> Path:
    """The checkpoint file beside a log: ``<name>.checkpoints`` (JSON lines, one signed head each)."""
    return Path(path).with_name(Path(path).name + ".checkpoints")


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
