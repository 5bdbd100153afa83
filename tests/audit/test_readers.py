"""One reading interface for the audit chain (``gateway.audit.readers.FileAuditReader``): rows, stats,
verification, checkpoints and tree hashes of a real JSONL log."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.audit.file_sink import AuditSink
from gateway.audit.files import checkpoint_path
from gateway.audit.merkle import leaf_hash
from gateway.audit.readers import AuditReader, FileAuditReader


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    with AuditSink(path, durable=False, key_file=tmp_path / "signing.key", checkpoint_rows=2) as sink:
        for tool in ("list_vms", "power_on_vm", "list_vms"):
            sink.write({"phase": "call", "tool": tool, "target": "vc1", "caller": "alice"})
    return path


def test_where_names_the_log(log: Path) -> None:
    reader = FileAuditReader(log)
    assert reader.where == str(log)
    assert reader.path == log


def test_it_is_an_audit_reader(log: Path) -> None:
    reader: AuditReader = FileAuditReader(log)
    assert reader.rows(last=1)


def test_rows_pass_the_filters_through(log: Path) -> None:
    reader = FileAuditReader(log)
    assert [r["seq"] for r in reader.rows()] == [1, 2, 3]
    assert [r["seq"] for r in reader.rows(tool="list_vms")] == [1, 3]
    assert [r["seq"] for r in reader.rows(tool="list_vms", last=1)] == [3]
    assert reader.rows(caller="bob") == []


def test_stats_count_the_rows(log: Path) -> None:
    summary = FileAuditReader(log).stats()
    assert summary["rows"] == 3
    assert summary["by_tool"] == {"list_vms": 2, "power_on_vm": 1}


def test_verify_walks_the_chain_and_checkpoints(log: Path) -> None:
    report = FileAuditReader(log).verify(checkpoints=True)
    assert report.ok
    assert report.checkpoint is not None and report.checkpoint.checked == 2


def test_checkpoints_are_the_signed_entries(log: Path) -> None:
    entries = FileAuditReader(log).checkpoints()
    assert [e["seq"] for e in entries] == [2, 3]
    assert all(isinstance(e["note"], str) for e in entries)


def test_checkpoints_of_a_log_without_a_file_are_empty(tmp_path: Path) -> None:
    assert FileAuditReader(tmp_path / "audit.jsonl").checkpoints() == []


def test_a_garbage_checkpoint_line_reads_as_an_empty_entry(log: Path) -> None:
    with checkpoint_path(log).open("a") as handle:
        handle.write("junk\n")
    assert FileAuditReader(log).checkpoints()[-1] == {}


def test_read_hashes_reads_the_tree_file(log: Path) -> None:
    first_row = log.read_bytes().splitlines()[0]
    assert FileAuditReader(log).read_hashes([0]) == [leaf_hash(first_row)]


def test_read_hashes_beyond_the_tree_is_a_lookup_error(log: Path, tmp_path: Path) -> None:
    with pytest.raises(LookupError):
        FileAuditReader(log).read_hashes([10_000])
    with pytest.raises(LookupError):
        FileAuditReader(tmp_path / "none.jsonl").read_hashes([0])
