"""Outside witnesses of the audit log: checkpoints published where the host's root cannot take them back.

A witness directory holds one file per checkpoint, created exclusively, never overwritten;
``check_witnesses`` tells whether the log still extends every checkpoint a witness saw.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gateway.audit.note import Checkpoint, open_checkpoint, parse_checkpoint, sign_checkpoint_note
from gateway.private_files import make_private_dirs

log = logging.getLogger(__name__)

#: the origin line (and key name) of checkpoints when none is configured (GATEWAY_AUDIT_ORIGIN)
DEFAULT_ORIGIN = "vsphere-mcp-gateway/audit"
WITNESS_SUFFIX = ".checkpoint"

CheckpointListener = Callable[[Mapping[str, Any]], None]


class CheckpointPublisher:
    """Signs the checkpoint note of a tree head and hands every checkpoint to its witnesses."""

    def __init__(self, origin: str, witness_dir: Path | None = None) -> None:
        self.origin = origin
        self.witness_dir = Path(witness_dir) if witness_dir is not None else None
        #: called with each checkpoint entry written (the notifier's ``checkpoint`` event); never raise
        self.listeners: list[CheckpointListener] = []

    def note_fields(self, size: int, root: bytes, key: Ed25519PrivateKey) -> dict[str, Any]:
        """What a checkpoint entry carries of the tree: its size, base64 root and signed note."""
        return {"tree_size": size, "root": base64.b64encode(root).decode("ascii"),
                "note": sign_checkpoint_note(self.origin, size, root, key)}

    def publish(self, entry: Mapping[str, Any]) -> None:
        """Write ``entry``'s note to the witness directory and tell the listeners; failures are logged
        (the checkpoint itself is written already)."""
        note = entry.get("note")
        if not isinstance(note, str):
            return
        if self.witness_dir is not None:
            try:
                publish_to_dir(self.witness_dir, note, int(entry["tree_size"]))
            except OSError as exc:
                log.warning("could not publish audit checkpoint %s to the witness directory %s: %s",
                            entry.get("tree_size"), self.witness_dir, exc)
        for listener in list(self.listeners):
            try:
                listener(entry)
            except Exception:
                log.exception("an audit checkpoint listener failed")


def publish_to_dir(directory: Path, note: str, size: int) -> Path:
    make_private_dirs(directory)
    digest = hashlib.sha256(note.encode("utf-8")).hexdigest()[:8]
    path = directory / f"{size:012d}-{digest}{WITNESS_SUFFIX}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return path
    try:
        os.write(fd, note.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def split_notes(text: str) -> list[str]:
    """The signed notes in ``text``, one after another (each: text lines, a blank line, signatures)."""
    notes: list[str] = []
    lines = text.split("\n")
    current: list[str] = []
    signing = False
    for line in lines:
        if signing:
            if line.startswith("\u2014 "):
                current.append(line)
                continue
            notes.append("\n".join(current) + "\n")
            current, signing = [], False
        if line == "" and current:
            current.append(line)
            signing = True
        elif line != "":
            current.append(line)
    if signing and current:
        notes.append("\n".join(current) + "\n")
    return notes


def read_witness(path: Path) -> list[tuple[str, str]]:
    """(where, note) of every note a witness holds: a file of notes, or a directory of such files
    (read in name order)."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    found: list[tuple[str, str]] = []
    for file in files:
        notes = split_notes(file.read_text("utf-8"))
        found.extend((f"{file}#{i + 1}" if len(notes) > 1 else str(file), note)
                     for i, note in enumerate(notes))
    return found


@dataclass(frozen=True)
class WitnessFault:
    """A witnessed checkpoint the log does not extend: where it was read, its size, why."""

    where: str
    size: int | None
    reason: str  # not_a_checkpoint | bad_signature | rollback | inconsistent
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}: {self.detail}"


@dataclass(frozen=True)
class WitnessReport:
    checked: int
    faults: tuple[WitnessFault, ...]

    @property
    def ok(self) -> bool:
        return not self.faults

    @property
    def first_fault(self) -> WitnessFault | None:
        return self.faults[0] if self.faults else None


def witnessed(notes: Sequence[tuple[str, str]], origin: str | None,
              key: Ed25519PublicKey | None) -> tuple[list[tuple[str, Checkpoint]], list[WitnessFault]]:
    """The witnessed checkpoints whose signature holds (by ``key`` under their origin, or ``origin``
    when given; unchecked without a key), and a fault for each other note."""
    good: list[tuple[str, Checkpoint]] = []
    faults: list[WitnessFault] = []
    for where, note in notes:
        parsed = parse_checkpoint(note)
        if parsed is None:
            faults.append(WitnessFault(where, None, "not_a_checkpoint", "not a signed tree head"))
            continue
        name = origin or parsed.origin
        opened = open_checkpoint(note, name, key) if key is not None else parsed
        if opened is None:
            faults.append(WitnessFault(where, parsed.size, "bad_signature",
                                       f"the checkpoint of size {parsed.size} is not signed by this log's "
                                       f"key as {name}"))
            continue
        good.append((where, opened))
    return good, faults


def check_witnesses(checkpoints: Sequence[tuple[str, Checkpoint]], roots: Mapping[int, bytes],
                    size: int) -> list[WitnessFault]:
    """Compare witnessed checkpoints (``where``, checkpoint) with the log's roots at their sizes (``roots``,
    recomputed from the rows) and its size now: one fault per checkpoint the log no longer extends,
    the smallest tree size first, each naming the range where the log changed."""
    faults: list[WitnessFault] = []
    consistent = 0
    for where, checkpoint in sorted(checkpoints, key=lambda item: item[1].size):
        if checkpoint.size > size:
            faults.append(WitnessFault(where, checkpoint.size, "rollback",
                                       f"a witness saw {checkpoint.size} rows but the log holds {size}: rows "
                                       f"after seq {size} were removed (or this is another view of the log)"))
        elif roots.get(checkpoint.size) != checkpoint.root:
            faults.append(WitnessFault(where, checkpoint.size, "inconsistent",
                                       f"the log's first {checkpoint.size} rows no longer hash to the root "
                                       f"the witness saw: a row in seq {consistent + 1}..{checkpoint.size} "
                                       "was edited, removed, reordered or inserted (a rewritten or split "
                                       "view of the log)"))
        else:
            consistent = max(consistent, checkpoint.size)
    return faults
