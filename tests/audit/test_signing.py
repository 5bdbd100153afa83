"""Signed checkpoints (``gateway.audit.signing``): the signing key on disk, the public key's text form,
and signing and checking one checkpoint entry."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.signing import (
    checkpoint_signature_ok,
    load_or_create_signing_key,
    parse_public_key,
    public_key_text,
    sign_checkpoint,
)
from gateway.errors import AuditUnavailable

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
HEAD = {"seq": 12, "hash": "ab" * 32, "ts": "2026-01-01T00:00:00.000Z"}


def _raw(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def test_a_missing_key_file_is_created_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "audit-signing.key"
    key = load_or_create_signing_key(path)
    assert isinstance(key, Ed25519PrivateKey)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


def test_an_existing_key_file_is_read_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "audit-signing.key"
    first = load_or_create_signing_key(path)
    again = load_or_create_signing_key(path)
    assert _raw(first) == _raw(again)


def test_a_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit-signing.key"
    load_or_create_signing_key(path)
    path.chmod(0o640)
    with pytest.raises(AuditUnavailable, match=r"readable by others \(mode 640\); fix: chmod 600"):
        load_or_create_signing_key(path)


def test_a_key_file_that_is_not_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit-signing.key"
    path.write_bytes(b"not a key\n")
    path.chmod(0o600)
    with pytest.raises(AuditUnavailable, match="cannot be read as a private key"):
        load_or_create_signing_key(path)


def test_a_key_file_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit-signing.key"
    ec = generate_private_key(SECP256R1())
    path.write_bytes(ec.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    path.chmod(0o600)
    with pytest.raises(AuditUnavailable, match="is not an Ed25519 key"):
        load_or_create_signing_key(path)


def test_public_key_text_is_ed25519_and_64_hex_digits() -> None:
    text = public_key_text(KEY.public_key())
    raw = KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert text == f"ed25519:{raw.hex()}"


@pytest.mark.parametrize("spelling", ["{}", "  {}\n", "{upper}"])
def test_parse_public_key_reads_what_public_key_text_printed(spelling: str) -> None:
    text = public_key_text(KEY.public_key())
    hex_part = text.removeprefix("ed25519:")
    given = spelling.format(text, upper="ed25519:" + hex_part.upper())
    assert public_key_text(parse_public_key(given)) == text


def test_parse_public_key_accepts_bare_hex() -> None:
    text = public_key_text(KEY.public_key())
    assert public_key_text(parse_public_key(text.removeprefix("ed25519:"))) == text


@pytest.mark.parametrize("text", ["", "ed25519:", "ed25519:abcd", "ed25519:" + "zz" * 32,
                                  "ed25519:" + "00" * 33, "rsa:" + "00" * 32])
def test_parse_public_key_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected ed25519:<64 hex digits>"):
        parse_public_key(text)


def test_sign_checkpoint_adds_the_public_key_and_a_signature() -> None:
    entry = sign_checkpoint(KEY, HEAD)
    assert {k: entry[k] for k in HEAD} == HEAD
    assert entry["public_key"] == public_key_text(KEY.public_key())
    assert len(bytes.fromhex(entry["sig"])) == 64


def test_a_signed_checkpoint_checks_with_its_key() -> None:
    assert checkpoint_signature_ok(sign_checkpoint(KEY, HEAD), KEY.public_key())


def test_a_signed_checkpoint_does_not_check_with_another_key() -> None:
    other = Ed25519PrivateKey.from_private_bytes(bytes(32))
    assert not checkpoint_signature_ok(sign_checkpoint(KEY, HEAD), other.public_key())


@pytest.mark.parametrize(("field", "value"), [("seq", 13), ("hash", "cd" * 32), ("ts", "later"),
                                              ("public_key", "ed25519:" + "00" * 32), ("extra", 1)])
def test_any_edit_of_a_signed_checkpoint_breaks_it(field: str, value: object) -> None:
    entry = {**sign_checkpoint(KEY, HEAD), field: value}
    assert not checkpoint_signature_ok(entry, KEY.public_key())


@pytest.mark.parametrize("sig", [None, "not hex", "00" * 64, 42])
def test_a_missing_or_malformed_signature_does_not_check(sig: object) -> None:
    entry = dict(sign_checkpoint(KEY, HEAD))
    if sig is None:
        del entry["sig"]
    else:
        entry["sig"] = sig
    assert not checkpoint_signature_ok(entry, KEY.public_key())


def _race(key_file: Path, creators: int) -> tuple[list[str], list[BaseException]]:
    """``creators`` threads released at once, each loading or creating ``key_file``."""
    start = threading.Barrier(creators)
    keys: list[str] = []
    errors: list[BaseException] = []

    def create() -> None:
        start.wait()
        try:
            keys.append(public_key_text(load_or_create_signing_key(key_file).public_key()))
        except BaseException as exc:  # the assertion names it
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(creators)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return keys, errors


def test_processes_starting_at_once_all_read_the_one_complete_key(tmp_path: Path) -> None:
    """Many creators racing on one missing key file end up with one key, and none of them ever reads a
    half-written file (a creator that made the name first and wrote into it after showed others an empty
    file: "cannot be read as a private key")."""
    for round_ in range(50):
        key_file = tmp_path / str(round_) / "audit-signing.key"
        keys, errors = _race(key_file, 12)
        assert errors == []
        assert len(set(keys)) == 1 and len(keys) == 12
        assert sorted(p.name for p in key_file.parent.iterdir()) == ["audit-signing.key"]
