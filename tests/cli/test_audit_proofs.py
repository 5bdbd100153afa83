"""gateway.cli.audit_proofs: ``gateway audit checkpoint|prove|verify-proof``; verify-proof checked offline
against notes signed here with a fresh key."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway import cli
from gateway.audit.merkle import leaf_hash, node_hash
from gateway.audit.note import sign_checkpoint_note, verifier_key
from gateway.audit.signing import public_key_text
from gateway.cli import main

ORIGIN = "gw.example/audit"
ROWS = (b'{"seq":1}', b'{"seq":2}')


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GATEWAY_HOME", "GATEWAY_AUDIT_LOG", "GATEWAY_DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("audit",))
    return tmp_path


class Signed:
    """Checkpoint notes of the one- and two-row trees over ``ROWS``, signed by a fresh key, as files."""

    def __init__(self, where: Path) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.where = where
        self.old = self.write("old.note", sign_checkpoint_note(ORIGIN, 1, leaf_hash(ROWS[0]), self.key))
        root = node_hash(leaf_hash(ROWS[0]), leaf_hash(ROWS[1]))
        self.new = self.write("new.note", sign_checkpoint_note(ORIGIN, 2, root, self.key))
        self.row = self.write("row.jsonl", ROWS[0].decode() + "\n")

    def write(self, name: str, text: str) -> Path:
        path = self.where / name
        path.write_text(text)
        return path

    def proof(self, proof: Any) -> Path:
        return self.write("proof.json", json.dumps(proof))

    @property
    def public(self) -> str:
        return public_key_text(self.key.public_key())


INCLUSION = {"index": 0, "tree_size": 2, "hashes": [b64(leaf_hash(ROWS[1]))]}
CONSISTENCY = {"old_size": 1, "new_size": 2, "hashes": [b64(leaf_hash(ROWS[1]))]}


def verify(signed: Signed, proof: Any, *extra: str, key: str | None = None) -> int:
    return main(["audit", "verify-proof", "--public-key", key or signed.public,
                 "--checkpoint", str(signed.new), "--proof", str(signed.proof(proof)), *extra])


def test_an_inclusion_proof_verifies(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    assert verify(signed, INCLUSION, "--row", str(signed.row)) == 0
    assert capsys.readouterr().out == f"OK: row leaf 0 is in the signed tree of 2 rows ({ORIGIN})\n"


def test_a_note_verifier_key_works_too(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    note_key = verifier_key(ORIGIN, signed.key.public_key())
    assert verify(signed, INCLUSION, "--row", str(signed.row), key=note_key) == 0


def test_a_consistency_proof_verifies(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    assert verify(signed, CONSISTENCY, "--old-checkpoint", str(signed.old)) == 0
    assert capsys.readouterr().out == (f"OK: the signed tree of 2 rows extends the signed tree of 1 rows "
                                       f"({ORIGIN})\n")


def failure(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("FAILED: ")
    return err.removeprefix("FAILED: ").strip()


def test_an_altered_row_fails(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    signed.row.write_text('{"seq":1,"x":1}\n')
    assert verify(signed, INCLUSION, "--row", str(signed.row)) == 1
    assert failure(capsys) == ("the row is not leaf 0 of the signed tree: the row, the proof or the "
                               "checkpoint was altered")


@pytest.mark.parametrize(("proof", "with_row", "why"), [
    (INCLUSION, False, "an inclusion proof needs --row (the row exactly as stored)"),
    (CONSISTENCY, False, "a consistency proof needs --old-checkpoint"),
    ([1, 2], False, "the proof is not a JSON object"),
    ({**INCLUSION, "tree_size": 3}, True, "the proof is for a tree of 3 rows, the checkpoint signs 2"),
    ({**INCLUSION, "index": "0"}, True, 'the proof needs integer "index" and "tree_size"'),
    ({**INCLUSION, "hashes": ["not base64!"]}, True, "a proof hash is not base64"),
    ({**INCLUSION, "hashes": [b64(b"short")]}, True, "a proof hash is not 32 bytes"),
    ({"index": 0, "tree_size": 2}, True, 'the proof has no "hashes" list'),
    ({**CONSISTENCY, "old_size": 2}, False, "a consistency proof needs --old-checkpoint"),
])
def test_a_proof_that_does_not_hold_fails_saying_why(env: Path, capsys: pytest.CaptureFixture[str],
                                                     proof: Any, with_row: bool, why: str) -> None:
    signed = Signed(env)
    assert verify(signed, proof, *(["--row", str(signed.row)] if with_row else [])) == 1
    assert failure(capsys) == why


@pytest.mark.parametrize(("proof", "why"), [
    ({**CONSISTENCY, "old_size": 2}, "the proof is from 2 to 2 rows, the checkpoints sign 1 and 2"),
    ({**CONSISTENCY, "hashes": [b64(leaf_hash(b"other"))]},
     "the newer checkpoint does not extend the older one: the log was rewritten between them (or the proof "
     "was altered)"),
])
def test_a_consistency_proof_that_does_not_hold(env: Path, capsys: pytest.CaptureFixture[str], proof: Any,
                                                why: str) -> None:
    signed = Signed(env)
    assert verify(signed, proof, "--old-checkpoint", str(signed.old)) == 1
    assert failure(capsys) == why


def test_a_checkpoint_signed_by_another_key_fails(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    other = public_key_text(Ed25519PrivateKey.generate().public_key())
    assert verify(signed, INCLUSION, "--row", str(signed.row), key=other) == 1
    assert failure(capsys) == f"the checkpoint is not signed by this key as {ORIGIN}"


def test_a_proof_file_that_is_not_json_fails(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    path = signed.write("proof.json", "{")
    assert main(["audit", "verify-proof", "--public-key", signed.public, "--checkpoint", str(signed.new),
                 "--proof", str(path)]) == 1
    assert failure(capsys).startswith("Expecting property name")


def test_a_missing_file_fails(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signed = Signed(env)
    assert main(["audit", "verify-proof", "--public-key", signed.public, "--checkpoint", str(env / "none"),
                 "--proof", str(signed.proof(INCLUSION))]) == 1
    assert "No such file or directory" in failure(capsys)


def test_a_bad_public_key_is_a_usage_error(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["audit", "verify-proof", "--public-key", "ed25519:zz", "--checkpoint", "c", "--proof", "p"])
    assert raised.value.code == 2
    assert "--public-key" in capsys.readouterr().err


# --------------------------------------------------------------------------- against a log


@pytest.mark.parametrize(("argv", "message"), [
    ((), "gateway: give either SEQ or --consistency OLD [NEW]\n"),
    (("3", "--consistency", "1"), "gateway: give either SEQ or --consistency OLD [NEW]\n"),
    (("--consistency", "1", "2", "3"), "gateway: --consistency takes OLD and at most one NEW\n"),
])
def test_prove_needs_one_kind_of_proof(env: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                       message: str) -> None:
    assert main(["audit", "prove", *argv, "--home", str(env / "home")]) == 2
    assert capsys.readouterr().err == message


@pytest.mark.parametrize("argv", [("checkpoint",), ("prove", "1"), ("prove", "--consistency", "1")])
def test_a_log_without_checkpoints_has_nothing_to_show(env: Path, capsys: pytest.CaptureFixture[str],
                                                       argv: tuple[str, ...]) -> None:
    assert main(["audit", *argv, "--home", str(env / "home")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gateway: the audit log has no signed checkpoint note yet")
