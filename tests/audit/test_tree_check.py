"""The tree side of verification (``gateway.audit.tree_check``): which key checks checkpoints, a checkpoint
note judged against the recomputed root, and ``TreeWalk`` keeping roots at the sizes notes and witnesses
name."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.merkle import Frontier, leaf_hash, root_of, stored_hash_count
from gateway.audit.note import sign_checkpoint_note
from gateway.audit.signing import public_key_text
from gateway.audit.tree_check import TreeWalk, key_of, note_problem

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
OTHER = Ed25519PrivateKey.from_private_bytes(bytes(32))
ORIGIN = "gw.example/audit"
LINES = [f'{{"seq":{i}}}'.encode() for i in range(1, 9)]
LEAVES = [leaf_hash(line) for line in LINES]


def _root(n: int) -> bytes:
    return root_of(LEAVES[:n])


def _note(size: int, root: bytes | None = None, key: Ed25519PrivateKey = KEY) -> str:
    return sign_checkpoint_note(ORIGIN, size, _root(size) if root is None else root, key)


def _stored() -> list[bytes]:
    """The stored hash sequence of the eight leaves."""
    frontier, stored = Frontier(), []
    for leaf in LEAVES:
        stored.extend(frontier.append(leaf))
    assert len(stored) == stored_hash_count(len(LEAVES))
    return stored


def _reader(stored: list[bytes]) -> Any:
    def read(indexes: Sequence[int]) -> list[bytes]:
        try:
            return [stored[i] for i in indexes]
        except IndexError:
            raise LookupError("missing") from None

    return read


def test_key_of_prefers_the_pinned_key() -> None:
    pinned = OTHER.public_key()
    assert key_of([(1, {"public_key": public_key_text(KEY.public_key())})], pinned) is pinned


def test_key_of_takes_the_first_checkpoints_key_it_can_read() -> None:
    entries = [(1, {}), (2, {"public_key": "ed25519:junk"}),
               (3, {"public_key": public_key_text(KEY.public_key())})]
    found = key_of(entries, None)
    assert found is not None
    assert public_key_text(found) == public_key_text(KEY.public_key())


def test_key_of_without_a_usable_key_is_none() -> None:
    assert key_of([(1, {"public_key": "nope"})], None) is None
    assert key_of([], None) is None


def test_an_entry_without_a_note_has_no_problem() -> None:
    assert note_problem({"seq": 3}, KEY.public_key(), {}) is None


def test_a_valid_note_matching_the_root_has_no_problem() -> None:
    assert note_problem({"seq": 4, "note": _note(4)}, KEY.public_key(), {4: _root(4)}) is None


def test_a_note_without_a_root_to_compare_has_no_problem() -> None:
    assert note_problem({"seq": 4, "note": _note(4)}, KEY.public_key(), None) is None
    assert note_problem({"seq": 4, "note": _note(4)}, KEY.public_key(), {3: _root(3)}) is None


@pytest.mark.parametrize(("entry", "key"), [
    ({"seq": 4, "note": "not a note"}, KEY),
    ({"seq": 4, "note": 42}, KEY),
    ({"seq": 4, "note": _note(4, key=OTHER)}, KEY),
    ({"seq": 4, "note": _note(4)}, None),
])
def test_a_note_not_validly_signed_is_a_bad_signature(entry: dict[str, Any],
                                                      key: Ed25519PrivateKey | None) -> None:
    problem = note_problem(entry, key.public_key() if key else None, {})
    assert problem == ("bad_signature", "the checkpoint note of seq 4 is not validly signed")


def test_a_note_signing_another_size_than_its_entry_is_a_bad_signature() -> None:
    problem = note_problem({"seq": 5, "note": _note(4)}, KEY.public_key(), {})
    assert problem == ("bad_signature", "the note signs tree size 4, the entry seq 5")


def test_a_note_whose_root_the_rows_no_longer_give_is_rewritten() -> None:
    problem = note_problem({"seq": 4, "note": _note(4, root=b"\x07" * 32)}, KEY.public_key(), {4: _root(4)})
    assert problem is not None
    assert problem[0] == "rewritten"
    assert "no longer hash to the signed Merkle root" in problem[1]


def test_a_walk_from_the_first_row_keeps_roots_at_noted_sizes() -> None:
    walk = TreeWalk([(1, {"note": _note(3)}), (2, {"note": _note(8)})], None, KEY.public_key())
    assert walk.sizes == {3, 8}
    walk.start(1, _reader([]))
    for line in LINES:
        walk.add(line)
    assert walk.roots() == {3: _root(3), 8: _root(8)}
    assert walk.size() == 8
    assert walk.witness_report() is None


def test_a_walk_with_nothing_to_compare_records_nothing() -> None:
    walk = TreeWalk([(1, {"seq": 1})], None, None)
    walk.start(1, _reader([]))
    walk.add(LINES[0])
    assert walk.roots() is None
    assert walk.size() == 0


def test_a_walk_after_rotation_starts_from_the_stored_hashes() -> None:
    walk = TreeWalk([(1, {"note": _note(2)}), (2, {"note": _note(8)})], None, KEY.public_key())
    walk.start(6, _reader(_stored()))
    for line in LINES[5:]:
        walk.add(line)
    assert walk.roots() == {2: _root(2), 8: _root(8)}


def test_a_walk_after_rotation_without_stored_hashes_cannot_prove_witnesses() -> None:
    witness = [("w", _note(3))]
    walk = TreeWalk([], witness, KEY.public_key())
    walk.start(6, _reader([]))
    assert walk.roots() is None
    report = walk.witness_report()
    assert report is not None
    assert [f.reason for f in report.faults] == ["unprovable"]
    assert "rows before seq 6 were rotated away" in report.faults[0].detail


def test_witnessed_checkpoints_the_log_extends_are_ok() -> None:
    walk = TreeWalk([], [("w1", _note(4)), ("w2", _note(8))], KEY.public_key())
    walk.start(1, _reader([]))
    for line in LINES:
        walk.add(line)
    report = walk.witness_report()
    assert report is not None
    assert report.ok
    assert report.checked == 2


def test_a_witness_that_saw_more_rows_is_a_rollback() -> None:
    walk = TreeWalk([], [("w", _note(8))], KEY.public_key())
    walk.start(1, _reader([]))
    for line in LINES[:5]:
        walk.add(line)
    report = walk.witness_report()
    assert report is not None
    assert [(f.reason, f.size) for f in report.faults] == [("rollback", 8)]


def test_a_witness_whose_root_differs_is_inconsistent() -> None:
    walk = TreeWalk([], [("w", _note(4, root=hashlib.sha256(b"x").digest()))], KEY.public_key())
    walk.start(1, _reader([]))
    for line in LINES:
        walk.add(line)
    report = walk.witness_report()
    assert report is not None
    assert [f.reason for f in report.faults] == ["inconsistent"]


def test_a_witness_note_signed_by_another_key_is_a_fault() -> None:
    walk = TreeWalk([], [("w", _note(4, key=OTHER))], KEY.public_key())
    walk.start(1, _reader([]))
    report = walk.witness_report()
    assert report is not None
    assert [f.reason for f in report.faults] == ["bad_signature"]
    assert report.checked == 0


def test_witness_report_at_an_explicit_size() -> None:
    walk = TreeWalk([], [("w", _note(8))], KEY.public_key())
    walk.start(1, _reader([]))
    for line in LINES:
        walk.add(line)
    report = walk.witness_report(size=6)
    assert report is not None
    assert [f.reason for f in report.faults] == ["rollback"]
