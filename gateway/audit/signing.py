"""Signed checkpoints: the Ed25519 key, the public key's text form operators pin, signing and checking one."""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gateway.audit.chain import canonical_json
from gateway.errors import AuditUnavailable
from gateway.private_files import make_private_dirs

log = logging.getLogger(__name__)

#: a signed checkpoint of the chain's head is written after this many rows ...
DEFAULT_CHECKPOINT_ROWS = 1000
#: ... or this long after the previous one: on the first write, or by the server's timer when no row
#: comes (``gateway.audit.schedule``; GATEWAY_AUDIT_CHECKPOINT_SECONDS), and on rotation and close
DEFAULT_CHECKPOINT_SECONDS = 300.0
#: the signing key's file name in the state directory (GATEWAY_HOME)
SIGNING_KEY_NAME = "audit-signing.key"


def load_or_create_signing_key(key_file: Path) -> Ed25519PrivateKey:
    """The Ed25519 key in ``key_file`` (PEM, PKCS#8), generated (mode 0600) when the file is missing.

    Creation is exclusive (two processes starting at once end up with one key) and flushed to disk.
    A key file readable by group or others is refused: anyone who can read it can forge checkpoints.
    """
    key_file = Path(key_file)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    make_private_dirs(key_file.parent)
    if key_file.exists():
        return _read_signing_key(key_file)
    # written whole under a private name, then linked into place: a process that finds the name finds
    # a complete key (an exclusive create of the name itself would show others an empty file)
    partial = key_file.with_name(f".{key_file.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(partial, key_file)  # fails when another process linked its key first
    except FileExistsError:
        return _read_signing_key(key_file)
    finally:
        partial.unlink()
    dir_fd = os.open(key_file.parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    log.info("created the audit signing key %s; its public key (pin it off this host): %s",
                key_file, public_key_text(key.public_key()))
    return key


def _read_signing_key(key_file: Path) -> Ed25519PrivateKey:
    mode = key_file.stat().st_mode
    if mode & 0o077:
        raise AuditUnavailable(f"the audit signing key {key_file} is readable by others (mode "
                               f"{stat.S_IMODE(mode):o}); fix: chmod 600 {key_file}")
    try:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise AuditUnavailable(f"the audit signing key {key_file} cannot be read as a private key ({exc}); "
                               "fix: restore it from a backup, or move it away and let the gateway create "
                               "a new one (then pin the new public key)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditUnavailable(f"the audit signing key {key_file} is not an Ed25519 key; fix: move it "
                               "away and let the gateway create a new one")
    return key


def public_key_text(key: Ed25519PublicKey) -> str:
    """A public key as ``ed25519:<hex of its 32 raw bytes>``: what checkpoints carry and operators pin."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"ed25519:{raw.hex()}"


def parse_public_key(text: str) -> Ed25519PublicKey:
    """The key ``public_key_text`` printed; ``ValueError`` naming the expected form otherwise."""
    body = text.strip().removeprefix("ed25519:")
    try:
        raw = bytes.fromhex(body)
        if len(raw) != 32:
            raise ValueError
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a public key; expected ed25519:<64 hex digits> as printed by "
                         "`gateway audit key`") from None


def sign_checkpoint(key: Ed25519PrivateKey, head: Mapping[str, Any]) -> dict[str, Any]:
    """``head`` plus the signer's public key and an Ed25519 signature over their canonical JSON."""
    entry = {**head, "public_key": public_key_text(key.public_key())}
    entry["sig"] = key.sign(canonical_json(entry)).hex()
    return entry


def checkpoint_signature_ok(entry: Mapping[str, Any], key: Ed25519PublicKey) -> bool:
    """Whether ``entry`` (a checkpoint line) was signed by ``key`` exactly as it stands."""
    try:
        signature = bytes.fromhex(str(entry["sig"]))
        key.verify(signature, canonical_json({k: v for k, v in entry.items() if k != "sig"}))
    except (KeyError, ValueError, TypeError, InvalidSignature):
        return False
    return True
