"""Outside witnesses (``gateway.audit.witness``): publishing signed notes to a directory, reading them back,
and judging whether the log still extends every checkpoint a witness saw."""

from __future__ import annotations

import base64
import hashlib
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.merkle import root_of
from gateway.audit.note import parse_checkpoint, sign_checkpoint_note
from gateway.audit.witness import (
    DEFAULT_ORIGIN,
    CheckpointPublisher,
    WitnessFault,
    WitnessReport,
    check_witnesses,
    publish_to_dir,
    read_witness,
    split_notes,
    witnessed,
)

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
OTHER = Ed25519PrivateKey.from_private_bytes(bytes(32))
ORIGIN = "gw.example/audit"
ROOT = hashlib.sha256(b"root").digest()


def _note(size: int, root: bytes = ROOT, key: Ed25519PrivateKey = KEY, origin: str = ORIGIN) -> str:
    return sign_checkpoint_note(origin, size, root, key)


def test_default_origin() -> None:
    assert DEFAULT_ORIGIN == "vsphere-mcp-gateway/audit"


def test_publish_to_dir_names_the_file_by_size_and_digest(tmp_path: Path) -> None:
    note = _note(5)
    path = publish_to_dir(tmp_path / "w", note, 5)
    digest = hashlib.sha256(note.encode()).hexdigest()[:8]
    assert path == tmp_path / "w" / f"000000000005-{digest}.checkpoint"
    assert path.read_text() == note
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_publish_to_dir_never_overwrites(tmp_path: Path) -> None:
    note = _note(5)
    path = publish_to_dir(tmp_path, note, 5)
    path.write_text("kept as it was")
    assert publish_to_dir(tmp_path, note, 5) == path
    assert path.read_text() == "kept as it was"


def test_publisher_note_fields() -> None:
    fields = CheckpointPublisher(ORIGIN).note_fields(3, ROOT, KEY)
    assert fields["tree_size"] == 3
    assert fields["root"] == base64.b64encode(ROOT).decode("ascii")
    checkpoint = parse_checkpoint(fields["note"])
    assert checkpoint is not None
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == (ORIGIN, 3, ROOT)


def test_publisher_writes_to_the_witness_dir_and_tells_listeners(tmp_path: Path) -> None:
    publisher = CheckpointPublisher(ORIGIN, tmp_path / "witness")
    heard: list[Mapping[str, Any]] = []
    publisher.listeners.append(heard.append)
    entry = {"seq": 3, **publisher.note_fields(3, ROOT, KEY)}
    publisher.publish(entry)
    assert heard == [entry]
    (written,) = (tmp_path / "witness").iterdir()
    assert written.read_text() == entry["note"]


def test_publisher_ignores_an_entry_without_a_note(tmp_path: Path) -> None:
    publisher = CheckpointPublisher(ORIGIN, tmp_path / "witness")
    heard: list[Mapping[str, Any]] = []
    publisher.listeners.append(heard.append)
    publisher.publish({"seq": 3})
    assert heard == []
    assert not (tmp_path / "witness").exists()


def test_a_failing_listener_does_not_stop_the_others() -> None:
    publisher = CheckpointPublisher(ORIGIN)
    heard: list[Mapping[str, Any]] = []

    def broken(_entry: Mapping[str, Any]) -> None:
        raise RuntimeError("listener down")

    publisher.listeners.extend([broken, heard.append])
    publisher.publish({"tree_size": 1, "note": _note(1)})
    assert len(heard) == 1


def test_a_witness_dir_that_cannot_be_written_only_logs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    publisher = CheckpointPublisher(ORIGIN, blocker / "witness")
    heard: list[Mapping[str, Any]] = []
    publisher.listeners.append(heard.append)
    publisher.publish({"tree_size": 1, "note": _note(1)})
    assert len(heard) == 1


def test_split_notes_of_one_note() -> None:
    note = _note(1)
    assert split_notes(note) == [note]


def test_split_notes_of_notes_one_after_another() -> None:
    notes = [_note(1), _note(2), _note(3)]
    assert split_notes("".join(notes)) == notes


def test_split_notes_of_notes_separated_by_blank_lines() -> None:
    notes = [_note(1), _note(2)]
    assert split_notes("\n".join(notes) + "\n\n") == notes


@pytest.mark.parametrize("text", ["", "\n", "\n\n\n"])
def test_split_notes_without_a_signature_block_is_empty(text: str) -> None:
    assert split_notes(text) == []


def test_read_witness_of_a_file_of_one_note(tmp_path: Path) -> None:
    (tmp_path / "w").write_text(_note(1))
    assert read_witness(tmp_path / "w") == [(str(tmp_path / "w"), _note(1))]


def test_read_witness_numbers_several_notes_of_one_file(tmp_path: Path) -> None:
    (tmp_path / "w").write_text(_note(1) + _note(2))
    where = [place for place, _ in read_witness(tmp_path / "w")]
    assert where == [f"{tmp_path / 'w'}#1", f"{tmp_path / 'w'}#2"]


def test_read_witness_of_a_directory_reads_files_in_name_order(tmp_path: Path) -> None:
    publish_to_dir(tmp_path, _note(20), 20)
    publish_to_dir(tmp_path, _note(3), 3)
    (tmp_path / "sub").mkdir()
    sizes = [parse_checkpoint(note).size for _, note in read_witness(tmp_path)]  # type: ignore[union-attr]
    assert sizes == [3, 20]


def test_witnessed_keeps_notes_signed_by_the_key() -> None:
    good, faults = witnessed([("a", _note(1)), ("b", _note(2))], None, KEY.public_key())
    assert [(where, cp.size) for where, cp in good] == [("a", 1), ("b", 2)]
    assert faults == []


def test_witnessed_faults_a_note_that_is_not_a_checkpoint() -> None:
    good, faults = witnessed([("x", "hello\n")], None, KEY.public_key())
    assert good == []
    assert faults == [WitnessFault("x", None, "not_a_checkpoint", "not a signed tree head")]


def test_witnessed_faults_a_note_signed_by_another_key() -> None:
    _, faults = witnessed([("x", _note(4, key=OTHER))], None, KEY.public_key())
    assert [(f.reason, f.size) for f in faults] == [("bad_signature", 4)]
    assert "as gw.example/audit" in faults[0].detail


def test_witnessed_with_an_origin_checks_the_signature_under_that_name() -> None:
    _, faults = witnessed([("x", _note(4))], "another/origin", KEY.public_key())
    assert [f.reason for f in faults] == ["bad_signature"]


def test_witnessed_without_a_key_keeps_every_checkpoint_unchecked() -> None:
    good, faults = witnessed([("x", _note(4, key=OTHER))], None, None)
    assert [cp.size for _, cp in good] == [4]
    assert faults == []


def _roots(leaves: int) -> dict[int, bytes]:
    hashes = [hashlib.sha256(bytes([i])).digest() for i in range(leaves)]
    return {n: root_of(hashes[:n]) for n in range(leaves + 1)}


def _seen(size: int, root: bytes) -> tuple[str, Any]:
    checkpoint = parse_checkpoint(_note(size, root))
    assert checkpoint is not None
    return f"w{size}", checkpoint


def test_check_witnesses_passes_when_the_log_extends_every_checkpoint() -> None:
    roots = _roots(8)
    assert check_witnesses([_seen(3, roots[3]), _seen(8, roots[8])], roots, 8) == []


def test_check_witnesses_names_a_rollback() -> None:
    roots = _roots(8)
    (fault,) = check_witnesses([_seen(8, roots[8])], roots, 5)
    assert (fault.reason, fault.size) == ("rollback", 8)
    assert "a witness saw 8 rows but the log holds 5" in fault.detail


def test_check_witnesses_names_the_range_where_the_log_changed() -> None:
    roots = _roots(8)
    faults = check_witnesses([_seen(6, ROOT), _seen(2, roots[2])], roots, 8)
    assert [(f.reason, f.size) for f in faults] == [("inconsistent", 6)]
    assert "a row in seq 3..6" in faults[0].detail


def test_check_witnesses_reports_smallest_size_first() -> None:
    roots = _roots(4)
    faults = check_witnesses([_seen(4, ROOT), _seen(2, ROOT)], roots, 4)
    assert [f.size for f in faults] == [2, 4]


def test_witness_report_ok_and_first_fault() -> None:
    fault = WitnessFault("w", 3, "rollback", "gone")
    assert WitnessReport(2, ()).ok
    assert WitnessReport(2, ()).first_fault is None
    report = WitnessReport(2, (fault,))
    assert not report.ok
    assert report.first_fault is fault
    assert str(fault) == "w: rollback: gone"
