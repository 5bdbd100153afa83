"""Proofs over the audit log's Merkle tree, as the CLI prints and HTTPS serves them, and their offline check.

Row ``seq`` S is leaf S-1. A failure to give a proof raises ``NotFound`` or ``InvalidArgument`` with the fix.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.merkle import (
    consistency_plan,
    inclusion_plan,
    leaf_hash,
    read_plan,
    verify_consistency,
    verify_inclusion,
)
from gateway.audit.note import Checkpoint, open_checkpoint, parse_checkpoint
from gateway.errors import AuditUnavailable, InvalidArgument, NotFound


class TreeReader(Protocol):
    """What proofs read (``gateway.audit.readers.AuditReader`` gives it)."""

    def checkpoints(self) -> list[dict[str, Any]]: ...

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]: ...


def latest_note(reader: TreeReader) -> str:
    """The newest signed checkpoint note, exactly as signed."""
    for entry in reversed(reader.checkpoints()):
        if isinstance(entry.get("note"), str):
            return str(entry["note"])
    raise NotFound("the audit log has no signed checkpoint note yet; the gateway signs one every 1000 rows, "
                   "every 5 minutes with new rows, and when it stops (it needs its signing key)")


def latest_checkpoint(reader: TreeReader) -> Checkpoint:
    checkpoint = parse_checkpoint(latest_note(reader))
    if checkpoint is None:
        raise AuditUnavailable("the newest checkpoint note cannot be read; run `gateway audit verify "
                               "--checkpoint`")
    return checkpoint


def _b64(hashes: Sequence[bytes]) -> list[str]:
    return [base64.b64encode(h).decode("ascii") for h in hashes]


def _read(reader: TreeReader, plan: Any) -> list[bytes]:
    try:
        return read_plan(plan, reader.read_hashes)
    except LookupError as exc:
        raise AuditUnavailable(f"the audit tree lacks a hash this proof needs ({exc}); run `gateway audit "
                               "verify --checkpoint`") from None


def inclusion_proof(reader: TreeReader, seq: int, tree_size: int | None = None) -> dict[str, Any]:
    """The proof that row ``seq`` is in the tree of the latest checkpoint (or of ``tree_size`` rows)."""
    latest = latest_checkpoint(reader).size
    size = latest if tree_size is None else tree_size
    if size > latest:
        raise NotFound(f"the latest checkpoint covers {latest} rows, not {size}")
    if not 1 <= seq <= size:
        raise NotFound(f"row seq {seq} is not in the tree of the latest checkpoint ({size} rows); a newer "
                       "row is provable once the next checkpoint covers it")
    hashes = _read(reader, inclusion_plan(seq - 1, size))
    return {"index": seq - 1, "tree_size": size, "hashes": _b64(hashes)}


def consistency_proof(reader: TreeReader, old_size: int, new_size: int | None = None) -> dict[str, Any]:
    """The proof that the tree of ``old_size`` rows is a prefix of that of ``new_size`` (default: the
    latest checkpoint's size)."""
    new = latest_checkpoint(reader).size if new_size is None else new_size
    if not 0 <= old_size <= new:
        raise InvalidArgument("old_size", f"no consistency proof from {old_size} to {new} rows: the old "
                              "size must be between 0 and the new one")
    latest = latest_checkpoint(reader).size
    if new > latest:
        raise NotFound(f"the latest checkpoint covers {latest} rows, not {new}")
    return {"old_size": old_size, "new_size": new,
            "hashes": _b64(_read(reader, consistency_plan(old_size, new)))}


# -- offline checking ---------------------------------------------------------------------------------------

def _hashes(proof: Mapping[str, Any]) -> list[bytes]:
    raw = proof.get("hashes")
    if not isinstance(raw, list):
        raise ValueError("the proof has no \"hashes\" list")
    try:
        hashes = [base64.b64decode(h, validate=True) for h in raw]
    except (binascii.Error, TypeError):
        raise ValueError("a proof hash is not base64") from None
    if any(len(h) != 32 for h in hashes):
        raise ValueError("a proof hash is not 32 bytes")
    return hashes


def open_signed(note: str, key: Ed25519PublicKey, origin: str | None = None) -> Checkpoint:
    """The checkpoint ``note`` states when signed by ``key`` (under ``origin`` or its own); ValueError."""
    parsed = parse_checkpoint(note)
    if parsed is None:
        raise ValueError("the checkpoint is not a signed tree head (origin, size, base64 root)")
    opened = open_checkpoint(note, origin or parsed.origin, key)
    if opened is None:
        raise ValueError(f"the checkpoint is not signed by this key as {origin or parsed.origin}")
    return opened


def check_inclusion(proof: Mapping[str, Any], checkpoint: Checkpoint, row: bytes) -> None:
    """Raise ValueError (saying why) unless ``proof`` shows ``row`` (as stored) in ``checkpoint``."""
    index, size = proof.get("index"), proof.get("tree_size")
    if type(index) is not int or type(size) is not int:
        raise ValueError("the proof needs integer \"index\" and \"tree_size\"")
    if size != checkpoint.size:
        raise ValueError(f"the proof is for a tree of {size} rows, the checkpoint signs {checkpoint.size}")
    if not verify_inclusion(index, size, leaf_hash(row.removesuffix(b"\n")), _hashes(proof), checkpoint.root):
        raise ValueError(f"the row is not leaf {index} of the signed tree: the row, the proof or the "
                         "checkpoint was altered")


def check_consistency(proof: Mapping[str, Any], old: Checkpoint, new: Checkpoint) -> None:
    """Raise ValueError unless ``proof`` shows the ``old`` checkpoint's tree is a prefix of ``new``'s."""
    if (proof.get("old_size"), proof.get("new_size")) != (old.size, new.size):
        raise ValueError(f"the proof is from {proof.get('old_size')} to {proof.get('new_size')} rows, the "
                         f"checkpoints sign {old.size} and {new.size}")
    if not verify_consistency(old.size, new.size, old.root, new.root, _hashes(proof)):
        raise ValueError("the newer checkpoint does not extend the older one: the log was rewritten "
                         "between them (or the proof was altered)")
