"""The JSONL log's files on disk (``gateway.audit.files``): the rotated set, sidecar paths, reading lines
from either end, the last row, and a snapshot under the writers' lock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gateway.audit.chain import GENESIS, row_line, stamp
from gateway.audit.file_sink import AuditSink
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
    shared_lock,
    snapshot,
)


@contextmanager
def _opened(path: Path) -> Iterator[tuple[int, int]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd, os.fstat(fd).st_size
    finally:
        os.close(fd)


def _row_bytes(seq: int) -> bytes:
    from datetime import UTC, datetime

    return row_line(stamp({"phase": "call", "n": seq}, seq, GENESIS, datetime(2026, 1, 1, tzinfo=UTC)))


def test_sidecar_paths_sit_beside_the_log(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    assert lock_path(log) == tmp_path / "audit.jsonl.lock"
    assert checkpoint_path(log) == tmp_path / "audit.jsonl.checkpoints"
    assert rotated_path(log, 3) == tmp_path / "audit.jsonl.3"


def test_checkpoint_path_accepts_a_string() -> None:
    assert checkpoint_path("/var/log/a.jsonl") == Path("/var/log/a.jsonl.checkpoints")  # type: ignore[arg-type]


def test_log_files_lists_rotated_files_oldest_first_then_the_log(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    for name in ("audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.10"):
        (tmp_path / name).write_text("")
    assert log_files(log) == [tmp_path / "audit.jsonl.10", tmp_path / "audit.jsonl.2",
                              tmp_path / "audit.jsonl.1", log]


@pytest.mark.parametrize("name", ["audit.jsonl.lock", "audit.jsonl.checkpoints", "audit.jsonl.tree",
                                  "audit.jsonl.01", "audit.jsonl.0", "audit.jsonl.x1", "audit.jsonl.",
                                  "audit.jsonl.\u0663", "other.jsonl.1"])
def test_log_files_ignores_what_is_not_a_rotated_file(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("")
    (tmp_path / "audit.jsonl").write_text("")
    assert log_files(tmp_path / "audit.jsonl") == [tmp_path / "audit.jsonl"]


def test_log_files_without_the_log_lists_only_rotated_ones(tmp_path: Path) -> None:
    (tmp_path / "audit.jsonl.1").write_text("")
    assert log_files(tmp_path / "audit.jsonl") == [tmp_path / "audit.jsonl.1"]


def test_log_files_in_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert log_files(tmp_path / "nowhere" / "audit.jsonl") == []


@pytest.mark.parametrize(("data", "lines"), [
    (b"", []),
    (b"a\n", [b"a\n"]),
    (b"a\nb\nc\n", [b"a\n", b"b\n", b"c\n"]),
    (b"a\nb", [b"a\n", b"b"]),
    (b"\n\n", [b"\n", b"\n"]),
])
def test_forward_lines_keep_their_newline(tmp_path: Path, data: bytes, lines: list[bytes]) -> None:
    (tmp_path / "f").write_bytes(data)
    with _opened(tmp_path / "f") as (fd, size):
        assert list(forward_lines(fd, size)) == lines


@pytest.mark.parametrize(("data", "lines"), [
    (b"", []),
    (b"a\n", [(0, b"a\n")]),
    (b"a\nbb\nc\n", [(5, b"c\n"), (2, b"bb\n"), (0, b"a\n")]),
    (b"a\nb", [(2, b"b"), (0, b"a\n")]),
])
def test_reverse_lines_give_offsets_from_the_end(tmp_path: Path, data: bytes,
                                                 lines: list[tuple[int, bytes]]) -> None:
    (tmp_path / "f").write_bytes(data)
    with _opened(tmp_path / "f") as (fd, size):
        assert list(reverse_lines(fd, size)) == lines


def test_lines_longer_than_a_chunk_read_whole_both_ways(tmp_path: Path) -> None:
    long = b"x" * 200_000 + b"\n"
    data = b"first\n" + long + b"last\n"
    (tmp_path / "f").write_bytes(data)
    with _opened(tmp_path / "f") as (fd, size):
        assert list(forward_lines(fd, size)) == [b"first\n", long, b"last\n"]
        assert [line for _, line in reverse_lines(fd, size)] == [b"last\n", long, b"first\n"]
        offsets = [offset for offset, _ in reverse_lines(fd, size)]
    assert offsets == [6 + len(long), 6, 0]


def test_forward_lines_stop_at_the_size_given(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a\nb\nc\n")
    with _opened(tmp_path / "f") as (fd, _):
        assert list(forward_lines(fd, 4)) == [b"a\n", b"b\n"]


def test_last_row_skips_garbage_and_a_torn_line(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(_row_bytes(1) + b"\n" + _row_bytes(2) + b"\nnot a row\n" + _row_bytes(3))
    with _opened(tmp_path / "f") as (fd, size):
        row = last_row_in(fd, size)
        line = last_line_in(fd, size)
    assert row is not None and row["seq"] == 2
    assert line == _row_bytes(2)


def test_last_row_of_a_file_without_rows_is_none(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"garbage\n")
    with _opened(tmp_path / "f") as (fd, size):
        assert last_row_in(fd, size) is None
        assert last_line_in(fd, size) is None
    assert last_row_of_file(tmp_path / "f") is None


def test_last_row_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert last_row_of_file(tmp_path / "missing") is None


def test_last_row_of_file_reads_the_newest_row(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(_row_bytes(1) + b"\n" + _row_bytes(2) + b"\n")
    row = last_row_of_file(tmp_path / "f")
    assert row is not None and row["n"] == 2


def test_shared_lock_without_a_lock_file_proceeds(tmp_path: Path) -> None:
    with shared_lock(tmp_path / "audit.jsonl"):
        pass


def test_snapshot_opens_every_file_with_its_size_and_closes_them(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    with AuditSink(log, durable=False) as sink:
        sink.write({"phase": "call"})
    (tmp_path / "audit.jsonl.1").write_bytes(b"old\n")
    with snapshot(log) as files:
        sizes = [(p, size) for p, _, size in files]
        assert sizes == [(tmp_path / "audit.jsonl.1", 4), (log, log.stat().st_size)]
        descriptors = [fd for _, fd, _ in files]
        assert all(os.fstat(fd) for fd in descriptors)
    for fd in descriptors:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_snapshot_also_reads_the_checkpoint_file(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_bytes(b"")
    checkpoint_path(log).write_bytes(b'{"seq": 1}\n')
    also: list[bytes | None] = []
    with snapshot(log, also):
        pass
    assert also == [b'{"seq": 1}\n']


def test_snapshot_reports_a_missing_checkpoint_file_as_none(tmp_path: Path) -> None:
    also: list[bytes | None] = []
    with snapshot(tmp_path / "audit.jsonl", also) as files:
        assert files == []
    assert also == [None]


def test_close_quietly_ignores_a_closed_descriptor(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    close_quietly(fd)
