"""Checking the Merkle tree while a verifier walks the rows: roots at the signed sizes, and the notes."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.merkle import Frontier, HashReader, RootRecorder, frontier_indexes, leaf_hash, tree_root
from gateway.audit.note import open_checkpoint, parse_checkpoint
from gateway.audit.signing import parse_public_key
from gateway.audit.witness import WitnessFault, WitnessReport, check_witnesses, witnessed


def key_of(entries: Iterable[tuple[int, Mapping[str, Any]]],
           pinned: Ed25519PublicKey | None) -> Ed25519PublicKey | None:
    """The key checkpoints and witnesses are checked with: the pinned one, else the first checkpoint's."""
    if pinned is not None:
        return pinned
    for _, entry in entries:
        try:
            return parse_public_key(str(entry["public_key"]))
        except (KeyError, ValueError):
            continue
    return None


def note_problem(entry: Mapping[str, Any], key: Ed25519PublicKey | None,
                 roots: Mapping[int, bytes] | None) -> tuple[str, str] | None:
    """Why the checkpoint note in ``entry`` does not hold (reason, detail), or None (also when the entry
    predates notes, or the rows before the log's oldest kept one left no tree to compare with)."""
    note = entry.get("note")
    if note is None:
        return None
    parsed = parse_checkpoint(note) if isinstance(note, str) else None
    if parsed is None or key is None or open_checkpoint(note, parsed.origin, key) is None:
        return "bad_signature", f"the checkpoint note of seq {entry.get('seq')} is not validly signed"
    if parsed.size != entry.get("seq"):
        return "bad_signature", f"the note signs tree size {parsed.size}, the entry seq {entry.get('seq')}"
    if roots is not None and parsed.size in roots and roots[parsed.size] != parsed.root:
        return "rewritten", (f"the rows up to seq {parsed.size} no longer hash to the signed Merkle root "
                             f"{base64.b64encode(parsed.root).decode()}: the history was rewritten")
    return None


class TreeWalk:
    """The tree side of one verification walk (see the module docstring)."""

    def __init__(self, entries: Iterable[tuple[int, Mapping[str, Any]]],
                 witness: Sequence[tuple[str, str]] | None, key: Ed25519PublicKey | None) -> None:
        self.witness = witness
        self.good, self.faults = witnessed(witness or (), None, key) if witness is not None else ([], [])
        sizes = {cp.size for _, cp in self.good}
        for _, entry in entries:
            parsed = parse_checkpoint(entry["note"]) if isinstance(entry.get("note"), str) else None
            if parsed is not None:
                sizes.add(parsed.size)
        self.sizes = sizes
        self.recorder: RootRecorder | None = None
        self.unprovable_below: int | None = None

    def start(self, first_seq: int, read: HashReader) -> None:
        """The walk begins at ``first_seq``: the rows before it (rotated away) are known by their stored
        tree hashes (``read``: stored positions -> hashes; ``LookupError``/``ValueError`` when missing);
        witnessed sizes within them are judged by the stored tree."""
        if not self.sizes:
            return
        try:
            start = Frontier() if first_seq <= 1 else Frontier(first_seq - 1, list(read(
                frontier_indexes(first_seq - 1))))
            earlier = {size: tree_root(size, read) for size in self.sizes if size < first_seq - 1}
        except (LookupError, ValueError):
            self.unprovable_below = first_seq
            return
        self.recorder = RootRecorder(self.sizes, start)
        self.recorder.roots.update(earlier)

    def add(self, line: bytes) -> None:
        if self.recorder is not None:
            self.recorder.add(leaf_hash(line))

    def roots(self) -> dict[int, bytes] | None:
        return self.recorder.roots if self.recorder is not None else None

    def size(self) -> int:
        return self.recorder.frontier.size if self.recorder is not None else 0

    def witness_report(self, size: int | None = None) -> WitnessReport | None:
        if self.witness is None:
            return None
        faults = list(self.faults)
        if self.recorder is None and self.unprovable_below is not None:
            faults.append(WitnessFault("the log", None, "unprovable",
                                       f"rows before seq {self.unprovable_below} were rotated away and the "
                                       "tree file does not hold their hashes"))
        else:
            size = self.size() if size is None else size
            faults.extend(check_witnesses(self.good, self.roots() or {}, size))
        return WitnessReport(len(self.good), tuple(faults))
