"""The JSONL log's Merkle tree on disk (``gateway.audit.tree_file``): ``<name>.tree`` holds every stored
subtree hash; ``FileTree.sync`` rebuilds what is missing or wrong from the rows; readers read hashes by
position."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.audit.file_sink import AuditSink
from gateway.audit.files import last_row_of_file
from gateway.audit.merkle import HASH_SIZE, leaf_hash, root_of, stored_hash_count, stored_hash_index
from gateway.audit.tree_file import (
    FileTree,
    first_seq_of,
    read_hashes,
    row_lines_after,
    stored_leaf,
    stored_reader,
    tree_path,
)


def _write(path: Path, rows: int, **options: object) -> None:
    with AuditSink(path, durable=False, key_file=path.with_name("signing.key"), **options) as sink:
        for i in range(rows):
            sink.write({"phase": "call", "n": i})


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    _write(path, 7)
    return path


def _sync(path: Path) -> FileTree:
    tree = FileTree(path)
    lines = _lines(path)
    tree.sync(len(lines), lambda: lines[-1])
    return tree


def test_tree_path_sits_beside_the_log(tmp_path: Path) -> None:
    assert tree_path(tmp_path / "audit.jsonl") == tmp_path / "audit.jsonl.tree"


def test_the_sink_keeps_every_stored_hash_of_its_rows(log: Path) -> None:
    data = tree_path(log).read_bytes()
    assert len(data) == stored_hash_count(7) * HASH_SIZE
    leaves = [leaf_hash(line) for line in _lines(log)]
    for i, leaf in enumerate(leaves):
        index = stored_hash_index(0, i)
        assert data[index * HASH_SIZE:(index + 1) * HASH_SIZE] == leaf


def test_read_hashes_by_position(log: Path) -> None:
    fd = os.open(tree_path(log), os.O_RDONLY)
    try:
        first, _ = read_hashes(fd, [0, 1])
        assert first == leaf_hash(_lines(log)[0])
        assert stored_leaf(fd, 2) == leaf_hash(_lines(log)[2])
        with pytest.raises(ValueError, match="no hash at position 999"):
            read_hashes(fd, [999])
        assert stored_leaf(fd, 500) is None
    finally:
        os.close(fd)


def test_stored_reader_reads_hashes_and_raises_lookup_errors(log: Path, tmp_path: Path) -> None:
    read = stored_reader(log)
    assert read([0]) == [leaf_hash(_lines(log)[0])]
    with pytest.raises(LookupError, match="no hash at position 999"):
        read([999])
    with pytest.raises(LookupError, match="no audit tree file"):
        stored_reader(tmp_path / "other.jsonl")([0])


def test_sync_loads_the_frontier_of_a_tree_in_step(log: Path) -> None:
    tree = _sync(log)
    assert tree.frontier is not None
    assert tree.frontier.size == 7
    assert tree.frontier.root() == root_of(leaf_hash(line) for line in _lines(log))
    tree.forget()


def test_sync_rebuilds_a_missing_tree_file(log: Path) -> None:
    expected = tree_path(log).read_bytes()
    tree_path(log).unlink()
    tree = _sync(log)
    tree.forget()
    assert tree_path(log).read_bytes() == expected


def test_sync_drops_a_partial_append(log: Path) -> None:
    expected = tree_path(log).read_bytes()
    with tree_path(log).open("ab") as handle:
        handle.write(b"\x00" * 40)
    tree = _sync(log)
    tree.forget()
    assert tree_path(log).read_bytes() == expected


def test_sync_rebuilds_a_tree_whose_newest_leaf_is_wrong(log: Path) -> None:
    expected = tree_path(log).read_bytes()
    with tree_path(log).open("r+b") as handle:
        handle.seek(stored_hash_index(0, 6) * HASH_SIZE)
        handle.write(b"\xff" * HASH_SIZE)
    tree = _sync(log)
    tree.forget()
    assert tree_path(log).read_bytes() == expected


def test_sync_cuts_a_tree_longer_than_the_log(log: Path) -> None:
    tree = FileTree(log)
    lines = _lines(log)
    tree.sync(5, lambda: lines[4])
    tree.forget()
    assert tree_path(log).stat().st_size == stored_hash_count(5) * HASH_SIZE


def test_add_appends_a_rows_hashes(log: Path) -> None:
    tree = _sync(log)
    tree.add(b'{"seq":8}')
    tree.flush()
    tree.forget()
    assert tree_path(log).stat().st_size == stored_hash_count(8) * HASH_SIZE


def test_add_before_sync_does_nothing(log: Path) -> None:
    size = tree_path(log).stat().st_size
    FileTree(log).add(b"row")
    assert tree_path(log).stat().st_size == size


def test_a_tree_that_cannot_cover_rotated_rows_is_unusable(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditSink(path, durable=False, max_bytes=400) as sink:  # no key: no tree is kept
        for i in range(12):
            sink.write({"phase": "call", "n": i})
    rotated = [p for p in tmp_path.glob("audit.jsonl.*") if p.name[len("audit.jsonl."):].isdigit()]
    assert rotated
    for file in rotated:
        file.unlink()
    tree_path(path).unlink(missing_ok=True)
    last = last_row_of_file(path)
    assert last is not None and last["seq"] > 1
    tree = FileTree(path)
    tree.sync(last["seq"], lambda: _lines(path)[-1])
    assert not tree.usable
    assert tree.frontier is None
    tree.forget()


def test_row_lines_after_reads_every_row_after_a_seq(log: Path) -> None:
    assert list(row_lines_after(log, 4)) == _lines(log)[4:]
    assert list(row_lines_after(log, 7)) == []
    assert list(row_lines_after(log, 0)) == _lines(log)


def test_row_lines_after_stops_at_a_gap(log: Path) -> None:
    lines = _lines(log)
    log.write_bytes(b"".join(line + b"\n" for i, line in enumerate(lines) if i != 4))
    assert list(row_lines_after(log, 2)) == lines[2:4]


def test_row_lines_after_skips_a_torn_last_line(log: Path) -> None:
    with log.open("ab") as handle:
        handle.write(b'{"seq": 8')
    assert list(row_lines_after(log, 6)) == [_lines(log)[6]]


def test_row_lines_after_crosses_rotated_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write(path, 12, max_bytes=600)
    assert (tmp_path / "audit.jsonl.1").exists()
    seqs = [int(line.split(b'"seq":')[1].split(b",")[0]) for line in row_lines_after(path, 0)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) > 12


def test_first_seq_of(log: Path, tmp_path: Path) -> None:
    assert first_seq_of(log) == 1
    assert first_seq_of(tmp_path / "none.jsonl") is None
    log.write_bytes(b"".join(line + b"\n" for line in _lines(log)[3:]))
    assert first_seq_of(log) == 4
