"""Verification of the JSONL log (``gateway.audit.verify``): the chain walked in order, the first line that
breaks it named with a stable reason, a torn last line told from tampering, and the signed checkpoints
checked against the rows (a cut tail, a rewritten history)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.chain import GENESIS, ROTATED_PHASE, row_hash, row_line
from gateway.audit.file_sink import AuditSink
from gateway.audit.files import checkpoint_path
from gateway.audit.signing import load_or_create_signing_key, public_key_text
from gateway.audit.verify import (
    CheckpointFault,
    CheckpointReport,
    LineFault,
    check_checkpoints,
    parse_checkpoints,
    verify,
)


def _write(path: Path, rows: int, **options: Any) -> None:
    with AuditSink(path, durable=False, **options) as sink:
        for i in range(rows):
            sink.write({"phase": "call", "n": i})


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _put(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(row_line(r) + b"\n" for r in rows))


def _rechain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with every ``prev`` and ``hash`` made consistent again (a forger's rewrite)."""
    prev = rows[0]["prev"]
    for row in rows:
        row["prev"] = prev
        row["hash"] = row_hash(row)
        prev = row["hash"]
    return rows


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    _write(path, 6)
    return path


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    """Ten rows, checkpointed every third row and on close."""
    path = tmp_path / "audit.jsonl"
    _write(path, 10, key_file=tmp_path / "signing.key", checkpoint_rows=3)
    return path


def test_an_untouched_log_verifies(log: Path) -> None:
    report = verify(log)
    assert report.ok
    assert (report.rows, report.first_seq, report.last_seq, report.problems) == (6, 1, 6, 0)
    assert report.files == (log,)
    assert report.first_broken_line is None and report.torn_last_line is None
    assert not report.starts_after_rotation
    assert report.checkpoint is None and report.witness is None


def test_a_missing_log_verifies_empty(tmp_path: Path) -> None:
    report = verify(tmp_path / "none.jsonl")
    assert report.ok
    assert (report.rows, report.first_seq, report.last_seq) == (0, None, None)


def test_an_edited_row_is_a_hash_mismatch_at_its_line(log: Path) -> None:
    rows = _rows(log)
    rows[2]["n"] = 99
    _put(log, rows)
    report = verify(log)
    assert not report.ok
    fault = report.first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (3, "hash_mismatch")
    assert report.problems == 1


def test_a_deleted_row_is_a_seq_gap(log: Path) -> None:
    rows = _rows(log)
    del rows[3]
    _put(log, rows)
    fault = verify(log).first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (4, "seq_gap")
    assert "expected seq 4, found 5: rows are missing" in fault.detail


def test_swapped_rows_are_out_of_order(log: Path) -> None:
    rows = _rows(log)
    rows[1], rows[2] = rows[2], rows[1]
    _put(log, rows)
    report = verify(log)
    fault = report.first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (2, "seq_gap")
    assert report.problems == 3


def test_a_replaced_row_rehashed_is_a_prev_mismatch_on_the_next(log: Path) -> None:
    rows = _rows(log)
    rows[2]["n"] = 99
    rows[2]["hash"] = row_hash(rows[2])
    _put(log, rows)
    fault = verify(log).first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (4, "prev_mismatch")


def test_a_log_starting_past_seq_one_without_a_marker_is_a_gap(log: Path) -> None:
    _put(log, _rows(log)[2:])
    fault = verify(log).first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (1, "seq_gap")
    assert "starts at seq 3 without a rotation marker" in fault.detail


def test_a_first_row_not_chained_to_genesis_is_a_prev_mismatch(log: Path) -> None:
    rows = _rows(log)
    rows[0]["prev"] = "1" * 64
    _put(log, _rechain(rows))
    fault = verify(log).first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (1, "prev_mismatch")


def test_a_log_starting_at_a_rotation_marker_says_so(log: Path) -> None:
    rows = _rows(log)
    marker = {**rows[2], "phase": ROTATED_PHASE}
    _put(log, _rechain([marker, *rows[3:]]))
    report = verify(log)
    assert report.ok
    assert report.starts_after_rotation
    assert report.first_seq == 3


def test_a_torn_last_line_is_not_tampering(log: Path) -> None:
    with log.open("ab") as handle:
        handle.write(b'{"seq": 7, "ha')
    report = verify(log)
    assert not report.ok
    assert report.first_broken_line is None
    torn = report.torn_last_line
    assert torn is not None
    assert (torn.line, torn.reason) == (7, "torn")
    assert report.rows == 6


def test_a_complete_last_row_without_its_newline_is_torn(log: Path) -> None:
    log.write_bytes(log.read_bytes().rstrip(b"\n"))
    report = verify(log)
    assert report.torn_last_line is not None
    assert report.rows == 6


def test_garbage_in_the_middle_is_not_json(log: Path) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([*lines[:2], b"garbage\n", *lines[2:]]))
    fault = verify(log).first_broken_line
    assert fault is not None
    assert (fault.line, fault.reason) == (3, "not_json")


def test_the_chain_verifies_across_rotated_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write(path, 20, max_bytes=600)
    report = verify(path)
    assert report.ok
    assert len(report.files) > 1
    assert report.files[-1] == path
    assert report.last_seq is not None and report.last_seq > 20  # rotation markers are rows too


def test_line_fault_text_names_file_line_and_reason(tmp_path: Path) -> None:
    assert str(LineFault(tmp_path / "a", 4, "seq_gap", "gap")) == f"{tmp_path / 'a'}:4: seq_gap: gap"


def test_signed_checkpoints_verify(signed: Path) -> None:
    report = verify(signed, checkpoints=True)
    assert report.ok
    checkpoint = report.checkpoint
    assert checkpoint is not None
    assert checkpoint.ok
    assert checkpoint.checked == 4  # seq 3, 6, 9 and the closing one at 10
    assert checkpoint.last_seq == 10
    assert checkpoint.public_key is not None and checkpoint.public_key.startswith("ed25519:")


def test_checkpoints_verify_against_the_pinned_key(signed: Path, tmp_path: Path) -> None:
    key = load_or_create_signing_key(tmp_path / "signing.key")
    assert verify(signed, checkpoints=True, public_key=key.public_key()).ok


def test_another_pinned_key_is_a_key_mismatch(signed: Path) -> None:
    other = Ed25519PrivateKey.from_private_bytes(bytes(32)).public_key()
    checkpoint = verify(signed, checkpoints=True, public_key=other).checkpoint
    assert checkpoint is not None
    assert {f.reason for f in checkpoint.faults} == {"key_mismatch"}
    assert checkpoint.public_key == public_key_text(other)


def test_a_log_without_checkpoints_is_missing_them(log: Path) -> None:
    report = verify(log, checkpoints=True)
    assert not report.ok
    assert report.checkpoint is not None
    fault = report.checkpoint.first_fault
    assert fault is not None
    assert (fault.line, fault.reason) == (0, "missing")


def test_a_cut_tail_below_a_signed_seq_is_found(signed: Path) -> None:
    _put(signed, _rows(signed)[:7])
    report = verify(signed, checkpoints=True)
    assert report.first_broken_line is None  # the chain alone cannot tell
    assert report.checkpoint is not None
    assert [f.reason for f in report.checkpoint.faults] == ["cut_tail", "cut_tail"]
    assert "seq 9 was signed but the log ends at seq 7" in report.checkpoint.faults[0].detail


def test_a_history_rewritten_and_rehashed_is_found(signed: Path) -> None:
    rows = _rows(signed)
    rows[1]["n"] = 99
    _put(signed, _rechain(rows))
    report = verify(signed, checkpoints=True)
    assert report.first_broken_line is None  # consistent chain, forged
    assert report.checkpoint is not None
    assert {f.reason for f in report.checkpoint.faults} == {"rewritten"}
    assert not report.ok


def test_an_edited_checkpoint_is_a_bad_signature(signed: Path) -> None:
    path = checkpoint_path(signed)
    entries = [json.loads(line) for line in path.read_bytes().splitlines()]
    entries[0]["ts"] = "2000-01-01T00:00:00.000Z"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    checkpoint = verify(signed, checkpoints=True).checkpoint
    assert checkpoint is not None
    assert [(f.line, f.reason) for f in checkpoint.faults] == [(1, "bad_signature")]
    assert checkpoint.checked == 3


def test_a_checkpoint_line_that_is_not_one_is_not_json(signed: Path) -> None:
    with checkpoint_path(signed).open("a") as handle:
        handle.write("junk\n[1]\n")
    checkpoint = verify(signed, checkpoints=True).checkpoint
    assert checkpoint is not None
    assert [(f.line, f.reason) for f in checkpoint.faults] == [(5, "not_json"), (6, "not_json")]


@pytest.mark.parametrize(("data", "entries"), [
    (None, []),
    (b"", []),
    (b'{"seq": 1}\n', [(1, {"seq": 1})]),
    (b'{"seq": 1}\njunk\n[2]\n{"seq": 3}', [(1, {"seq": 1}), (2, {}), (3, {}), (4, {"seq": 3})]),
])
def test_parse_checkpoints(data: bytes | None, entries: list[tuple[int, dict[str, Any]]]) -> None:
    assert parse_checkpoints(data) == entries


def test_checkpoints_of_rows_rotated_away_are_skipped(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    from gateway.audit.signing import sign_checkpoint

    entries = [(1, sign_checkpoint(key, {"seq": 2, "hash": "a" * 64}))]
    report = check_checkpoints(tmp_path / "c", entries, {}, first_seq=5, last_seq=9, pinned=None)
    assert (report.checked, report.skipped, report.ok) == (0, 1, True)
    assert report.last_seq == 2


def test_checkpoint_fault_text() -> None:
    assert str(CheckpointFault(3, "cut_tail", "gone")) == "checkpoint line 3: cut_tail: gone"
    assert str(CheckpointFault(0, "missing", "none")) == "missing: none"


def test_checkpoint_report_ok_and_first_fault(tmp_path: Path) -> None:
    fault = CheckpointFault(1, "rewritten", "x")
    assert CheckpointReport(tmp_path, 1, 0, 1, None, ()).ok
    report = CheckpointReport(tmp_path, 1, 0, 1, None, (fault,))
    assert not report.ok and report.first_fault is fault


def test_genesis_is_what_the_first_row_chains_to(log: Path) -> None:
    assert _rows(log)[0]["prev"] == GENESIS
