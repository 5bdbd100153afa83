"""C2SP signed notes and checkpoints (gateway.audit.note): format, verifier keys, tampering."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit import note

ROOT = bytes(range(32))


def test_a_checkpoint_note_has_the_c2sp_layout_and_opens_with_its_verifier_key() -> None:
    key = Ed25519PrivateKey.generate()
    text = note.sign_checkpoint_note("gw.example/audit", 42, ROOT, key)
    body, signature = text.split("\n\n")
    assert body == f"gw.example/audit\n42\n{base64.b64encode(ROOT).decode()}"
    assert signature.startswith("\u2014 gw.example/audit ") and signature.endswith("\n")
    raw = base64.b64decode(signature.rsplit(" ", 1)[1])
    assert len(raw) == 4 + 64 and raw[:4] == note.key_id("gw.example/audit", key.public_key())
    name, public = note.parse_verifier_key(note.verifier_key("gw.example/audit", key.public_key()))
    checkpoint = note.open_checkpoint(text, name, public)
    assert checkpoint is not None and (checkpoint.size, checkpoint.root) == (42, ROOT)


def test_the_verifier_key_text_is_name_plus_id_plus_base64_key() -> None:
    key = Ed25519PrivateKey.generate()
    text = note.verifier_key("gw", key.public_key())
    name, key_id, encoded = text.split("+", 2)  # the base64 key may itself hold a '+'
    assert name == "gw" and key_id == note.key_id("gw", key.public_key()).hex() and len(key_id) == 8
    assert base64.b64decode(encoded)[0] == 0x01 and len(base64.b64decode(encoded)) == 33


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("\n42\n", "\n43\n"),
    lambda t: t.replace("gw.example/audit\n", "other/audit\n", 1),
    lambda t: t[:-6] + ("A" if t[-6] != "A" else "B") + t[-5:],
])
def test_an_edited_note_does_not_open(edit: object) -> None:
    key = Ed25519PrivateKey.generate()
    text = note.sign_checkpoint_note("gw.example/audit", 42, ROOT, key)
    assert callable(edit)
    assert note.open_checkpoint(edit(text), "gw.example/audit", key.public_key()) is None


def test_another_key_does_not_open_a_note() -> None:
    text = note.sign_checkpoint_note("gw", 1, ROOT, Ed25519PrivateKey.generate())
    assert note.open_checkpoint(text, "gw", Ed25519PrivateKey.generate().public_key()) is None


@pytest.mark.parametrize("bad", ["", "a b", "a+b"])
def test_a_name_with_space_or_plus_cannot_name_a_key(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot name"):
        note.verifier_key(bad, Ed25519PrivateKey.generate().public_key())
