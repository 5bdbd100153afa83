"""Proofs over the audit log's Merkle tree (``gateway.audit.proofs``): inclusion and consistency proofs read
through an ``AuditReader`` from a real signed log, checked offline with only the key, the checkpoint and
the row; and every refusal with its code."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.file_sink import AuditSink
from gateway.audit.note import Checkpoint, parse_checkpoint, sign_checkpoint_note
from gateway.audit.proofs import (
    check_consistency,
    check_inclusion,
    consistency_proof,
    inclusion_proof,
    latest_checkpoint,
    latest_note,
    open_signed,
)
from gateway.audit.readers import FileAuditReader
from gateway.audit.signing import load_or_create_signing_key
from gateway.errors import AuditUnavailable, InvalidArgument, NotFound

ORIGIN = "test.example/audit"
ROWS = 10


class _NoTree:
    """A reader with checkpoints but no tree hashes (a tree file lost)."""

    def __init__(self, checkpoints: list[dict[str, Any]]) -> None:
        self._checkpoints = checkpoints

    def checkpoints(self) -> list[dict[str, Any]]:
        return self._checkpoints

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        raise LookupError(f"no hash at {indexes[0]}")


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten rows with checkpoints at seq 4, 8 and 10 (on close)."""
    path = tmp_path_factory.mktemp("proofs") / "audit.jsonl"
    with AuditSink(path, durable=False, key_file=path.with_name("signing.key"), checkpoint_rows=4,
                   origin=ORIGIN) as sink:
        for i in range(ROWS):
            sink.write({"phase": "call", "n": i})
    return path


@pytest.fixture(scope="module")
def reader(signed: Path) -> FileAuditReader:
    return FileAuditReader(signed)


@pytest.fixture(scope="module")
def key(signed: Path) -> Any:
    return load_or_create_signing_key(signed.with_name("signing.key")).public_key()


def _row(path: Path, seq: int) -> bytes:
    return path.read_bytes().splitlines()[seq - 1]


def _checkpoint(reader: FileAuditReader, size: int) -> Checkpoint:
    for entry in reader.checkpoints():
        found = parse_checkpoint(entry["note"])
        if found is not None and found.size == size:
            return found
    raise AssertionError(f"no checkpoint of size {size}")


def test_latest_note_is_the_newest_signed_note(reader: FileAuditReader) -> None:
    checkpoint = parse_checkpoint(latest_note(reader))
    assert checkpoint is not None
    assert (checkpoint.origin, checkpoint.size) == (ORIGIN, ROWS)
    assert latest_checkpoint(reader).size == ROWS


def test_no_checkpoint_note_is_not_found() -> None:
    with pytest.raises(NotFound, match="no signed checkpoint note yet"):
        latest_note(_NoTree([{"seq": 1}]))


def test_an_unreadable_newest_note_is_audit_unavailable() -> None:
    with pytest.raises(AuditUnavailable, match="cannot be read"):
        latest_checkpoint(_NoTree([{"note": "not a checkpoint"}]))


@pytest.mark.parametrize("seq", range(1, ROWS + 1))
def test_every_row_is_provable_against_the_latest_checkpoint(signed: Path, reader: FileAuditReader,
                                                             key: Any, seq: int) -> None:
    proof = inclusion_proof(reader, seq)
    assert (proof["index"], proof["tree_size"]) == (seq - 1, ROWS)
    checkpoint = open_signed(latest_note(reader), key)
    check_inclusion(proof, checkpoint, _row(signed, seq))


@pytest.mark.parametrize(("seq", "size"), [(1, 4), (4, 4), (5, 8), (8, 8)])
def test_a_row_is_provable_against_an_older_tree_size(signed: Path, reader: FileAuditReader,
                                                      seq: int, size: int) -> None:
    proof = inclusion_proof(reader, seq, size)
    assert proof["tree_size"] == size
    check_inclusion(proof, _checkpoint(reader, size), _row(signed, seq))


def test_the_row_with_its_newline_is_the_same_leaf(signed: Path, reader: FileAuditReader) -> None:
    check_inclusion(inclusion_proof(reader, 3), latest_checkpoint(reader), _row(signed, 3) + b"\n")


@pytest.mark.parametrize("seq", [0, -1, ROWS + 1])
def test_a_row_outside_the_tree_is_not_found(reader: FileAuditReader, seq: int) -> None:
    with pytest.raises(NotFound, match=f"row seq {seq} is not in the tree"):
        inclusion_proof(reader, seq)


def test_a_tree_larger_than_the_latest_checkpoint_is_not_found(reader: FileAuditReader) -> None:
    with pytest.raises(NotFound, match=f"covers {ROWS} rows, not 11"):
        inclusion_proof(reader, 1, 11)


def test_a_proof_without_the_tree_hashes_is_audit_unavailable(reader: FileAuditReader) -> None:
    with pytest.raises(AuditUnavailable, match="lacks a hash this proof needs"):
        inclusion_proof(_NoTree(reader.checkpoints()), 2)


def test_an_edited_row_fails_its_inclusion_proof(signed: Path, reader: FileAuditReader) -> None:
    row = json.loads(_row(signed, 3))
    row["n"] = 99
    with pytest.raises(ValueError, match="is not leaf 2 of the signed tree"):
        check_inclusion(inclusion_proof(reader, 3), latest_checkpoint(reader),
                        json.dumps(row, separators=(",", ":")).encode())


def test_a_proof_for_another_row_fails(signed: Path, reader: FileAuditReader) -> None:
    with pytest.raises(ValueError, match="is not leaf"):
        check_inclusion(inclusion_proof(reader, 3), latest_checkpoint(reader), _row(signed, 4))


def test_an_inclusion_proof_for_another_tree_size_is_refused(signed: Path, reader: FileAuditReader) -> None:
    with pytest.raises(ValueError, match=f"for a tree of 4 rows, the checkpoint signs {ROWS}"):
        check_inclusion(inclusion_proof(reader, 1, 4), latest_checkpoint(reader), _row(signed, 1))


@pytest.mark.parametrize(("proof", "message"), [
    ({"index": "1", "tree_size": ROWS, "hashes": []}, "integer"),
    ({"index": 1, "tree_size": None, "hashes": []}, "integer"),
    ({"index": 1, "tree_size": ROWS}, "no \"hashes\" list"),
    ({"index": 1, "tree_size": ROWS, "hashes": "abc"}, "no \"hashes\" list"),
    ({"index": 1, "tree_size": ROWS, "hashes": ["***"]}, "not base64"),
    ({"index": 1, "tree_size": ROWS, "hashes": [5]}, "not base64"),
    ({"index": 1, "tree_size": ROWS, "hashes": [base64.b64encode(b"short").decode()]}, "not 32 bytes"),
])
def test_a_malformed_inclusion_proof_says_why(signed: Path, reader: FileAuditReader, proof: dict[str, Any],
                                              message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_inclusion(proof, latest_checkpoint(reader), _row(signed, 2))


@pytest.mark.parametrize(("old", "new"), [(4, 8), (4, ROWS), (8, ROWS), (0, ROWS), (ROWS, ROWS)])
def test_consistency_between_checkpoints(reader: FileAuditReader, old: int, new: int) -> None:
    proof = consistency_proof(reader, old, new)
    assert (proof["old_size"], proof["new_size"]) == (old, new)
    if old:
        check_consistency(proof, _checkpoint(reader, old), _checkpoint(reader, new))


def test_consistency_proof_defaults_to_the_latest_checkpoint(reader: FileAuditReader) -> None:
    assert consistency_proof(reader, 4)["new_size"] == ROWS


@pytest.mark.parametrize(("old", "new"), [(-1, None), (ROWS + 1, None), (9, 8)])
def test_consistency_from_a_size_outside_the_range_is_an_invalid_argument(reader: FileAuditReader, old: int,
                                                                          new: int | None) -> None:
    with pytest.raises(InvalidArgument) as caught:
        consistency_proof(reader, old, new)
    assert caught.value.details["field"] == "old_size"


def test_consistency_to_a_size_past_the_latest_checkpoint_is_not_found(reader: FileAuditReader) -> None:
    with pytest.raises(NotFound, match=f"covers {ROWS} rows, not 12"):
        consistency_proof(reader, 4, 12)


def test_consistency_with_swapped_checkpoints_is_refused(reader: FileAuditReader) -> None:
    with pytest.raises(ValueError, match="the proof is from 4 to 8 rows, the checkpoints sign 8 and 4"):
        check_consistency(consistency_proof(reader, 4, 8), _checkpoint(reader, 8), _checkpoint(reader, 4))


def test_a_forked_checkpoint_is_not_consistent(reader: FileAuditReader) -> None:
    forger = Ed25519PrivateKey.generate()
    old = _checkpoint(reader, 4)
    fork = parse_checkpoint(sign_checkpoint_note(ORIGIN, 8, b"\x01" * 32, forger))
    assert fork is not None
    with pytest.raises(ValueError, match="does not extend the older one"):
        check_consistency(consistency_proof(reader, 4, 8), old, fork)


def test_open_signed_returns_the_checkpoint_of_a_valid_note(reader: FileAuditReader, key: Any) -> None:
    checkpoint = open_signed(latest_note(reader), key)
    assert (checkpoint.origin, checkpoint.size) == (ORIGIN, ROWS)
    assert open_signed(latest_note(reader), key, ORIGIN).size == ROWS


def test_open_signed_refuses_another_key(reader: FileAuditReader) -> None:
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(ValueError, match=f"not signed by this key as {ORIGIN}"):
        open_signed(latest_note(reader), other)


def test_open_signed_refuses_another_origin(reader: FileAuditReader, key: Any) -> None:
    with pytest.raises(ValueError, match="not signed by this key as elsewhere/audit"):
        open_signed(latest_note(reader), key, "elsewhere/audit")


def test_open_signed_refuses_what_is_not_a_checkpoint(key: Any) -> None:
    with pytest.raises(ValueError, match="not a signed tree head"):
        open_signed("hello\n", key)
