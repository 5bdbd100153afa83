"""C2SP signed notes and tlog checkpoints: the text form of a signed tree head that other tools read.

The formats are c2sp.org/tlog-checkpoint and c2sp.org/signed-note, keys as Go's ``sumdb/note`` reads
them; the key's name is the log's origin.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: the signature algorithm byte of Ed25519 in signed notes
ED25519 = 0x01
_DASH = "\u2014 "
_NAME = re.compile(r"[^\s+]+")


@dataclass(frozen=True)
class Checkpoint:
    """A signed tree head: the log's origin, its size and root, and the note text it was read from."""

    origin: str
    size: int
    root: bytes
    note: str

    def body(self) -> str:
        return checkpoint_body(self.origin, self.size, self.root)


def valid_name(name: str) -> bool:
    """Whether ``name`` can name a key (and a log): non-empty, no whitespace, no ``+``."""
    return bool(_NAME.fullmatch(name))


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(name: str, key: Ed25519PublicKey) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ED25519]) + _raw(key)).digest()[:4]


def verifier_key(name: str, key: Ed25519PublicKey) -> str:
    """The verifier key text ``<name>+<id hex>+<base64 key>``."""
    if not valid_name(name):
        raise ValueError(f"{name!r} cannot name a note key: use letters, digits and punctuation, no "
                         "spaces and no '+'")
    encoded = base64.b64encode(bytes([ED25519]) + _raw(key)).decode("ascii")
    return f"{name}+{key_id(name, key).hex()}+{encoded}"


def parse_verifier_key(text: str) -> tuple[str, Ed25519PublicKey]:
    """(name, key) of a verifier key text; ``ValueError`` naming the expected form otherwise."""
    name, _, rest = text.strip().partition("+")
    id_hex, _, encoded = rest.partition("+")
    try:
        raw = base64.b64decode(encoded, validate=True)
        if not valid_name(name) or len(raw) != 33 or raw[0] != ED25519:
            raise ValueError
        key = Ed25519PublicKey.from_public_bytes(raw[1:])
        if key_id(name, key).hex() != id_hex.lower():
            raise ValueError
    except (ValueError, binascii.Error):
        raise ValueError(f"{text.strip()!r} is not a note verifier key; expected <name>+<8 hex>+<base64> as "
                         "printed by `gateway audit key --note`") from None
    return name, key


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    return f"{origin}\n{size}\n{base64.b64encode(root).decode('ascii')}\n"


def sign_note(body: str, name: str, key: Ed25519PrivateKey) -> str:
    """``body`` (newline-terminated text) signed by ``key`` under ``name``: the whole signed note."""
    if not body.endswith("\n") or "\n\n" in body:
        raise ValueError("a note's text ends with one newline and holds no blank line")
    signature = key_id(name, key.public_key()) + key.sign(body.encode("utf-8"))
    return f"{body}\n{_DASH}{name} {base64.b64encode(signature).decode('ascii')}\n"


def open_note(note: str, name: str, key: Ed25519PublicKey) -> str | None:
    """The text of ``note`` when it carries a valid signature by (``name``, ``key``), else None."""
    body, sep, signatures = note.partition("\n\n")
    if not sep or not signatures.endswith("\n"):
        return None
    body += "\n"
    wanted = key_id(name, key)
    for line in signatures[:-1].split("\n"):
        if not line.startswith(_DASH):
            return None
        signer, _, encoded = line[len(_DASH):].rpartition(" ")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            return None
        if signer != name or raw[:4] != wanted:
            continue
        try:
            key.verify(raw[4:], body.encode("utf-8"))
        except InvalidSignature:
            return None
        return body
    return None


def parse_checkpoint(note: str) -> Checkpoint | None:
    """The origin, size and root a checkpoint note states (signatures not checked), or None."""
    lines = note.partition("\n\n")[0].split("\n")
    if len(lines) < 3 or not lines[1].isdigit() or (lines[1].startswith("0") and lines[1] != "0"):
        return None
    try:
        root = base64.b64decode(lines[2], validate=True)
    except binascii.Error:
        return None
    if len(root) != 32 or not valid_name(lines[0]):
        return None
    return Checkpoint(lines[0], int(lines[1]), root, note)


def open_checkpoint(note: str, name: str, key: Ed25519PublicKey) -> Checkpoint | None:
    """The checkpoint in ``note`` when its signature by (``name``, ``key``) holds and its origin is
    ``name``; else None."""
    body = open_note(note, name, key)
    checkpoint = parse_checkpoint(note) if body is not None else None
    return checkpoint if checkpoint is not None and checkpoint.origin == name else None


def sign_checkpoint_note(origin: str, size: int, root: bytes, key: Ed25519PrivateKey) -> str:
    return sign_note(checkpoint_body(origin, size, root), origin, key)
