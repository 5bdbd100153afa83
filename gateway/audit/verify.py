"""Verification: the first line that breaks the chain (or is torn), and checkpoints against the rows."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.chain import GENESIS, ROTATED_PHASE, parse_row, row_hash
from gateway.audit.files import checkpoint_path, forward_lines, snapshot
from gateway.audit.signing import checkpoint_signature_ok, parse_public_key, public_key_text
from gateway.audit.tree_check import TreeWalk, key_of, note_problem
from gateway.audit.tree_file import stored_reader
from gateway.audit.witness import WitnessReport


@dataclass(frozen=True)
class LineFault:
    """One line that breaks the chain (or is torn): where, a stable ``reason`` code and details."""

    file: Path
    line: int
    reason: str  # not_json | hash_mismatch | seq_gap | prev_mismatch | torn
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}: {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of walking the chain. ``ok`` only when no line is broken and none is torn."""

    files: tuple[Path, ...]
    rows: int
    first_seq: int | None
    last_seq: int | None
    first_broken_line: LineFault | None
    torn_last_line: LineFault | None
    #: how many lines broke the chain (the first is ``first_broken_line``)
    problems: int
    #: the oldest kept file starts at a rotation marker: earlier rows were rotated away
    starts_after_rotation: bool
    #: the check against signed checkpoints, when asked for
    checkpoint: CheckpointReport | None = None
    #: the check against what outside witnesses saw, when asked for
    witness: WitnessReport | None = None

    @property
    def ok(self) -> bool:
        return (self.first_broken_line is None and self.torn_last_line is None
                and (self.checkpoint is None or self.checkpoint.ok)
                and (self.witness is None or self.witness.ok))


class _ChainCheck:
    """Walks rows in order, re-anchoring after each break so one edit is reported once."""

    def __init__(self) -> None:
        self.expected_seq: int | None = None
        self.expected_prev = GENESIS
        self.rows = 0
        self.first_seq: int | None = None
        self.faults: list[LineFault] = []
        self.starts_after_rotation = False

    def fault(self, file: Path, line: int, reason: str, detail: str) -> None:
        self.faults.append(LineFault(file, line, reason, detail))

    def row(self, file: Path, line: int, row: dict[str, Any]) -> None:
        problem = self._problem(row)
        if problem is not None:
            self.fault(file, line, *problem)
        if self.first_seq is None:
            self.first_seq = row["seq"]
        self.rows += 1
        self.expected_seq = row["seq"] + 1
        self.expected_prev = row["hash"]

    def _problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        if row_hash(row) != row["hash"]:
            return "hash_mismatch", "the row's content does not match its hash: it was edited after writing"
        if self.expected_seq is None:
            return self._start_problem(row)
        if row["seq"] != self.expected_seq:
            what = "rows are missing" if row["seq"] > self.expected_seq else "rows are out of order"
            return "seq_gap", f"expected seq {self.expected_seq}, found {row['seq']}: {what}"
        if row["prev"] != self.expected_prev:
            return "prev_mismatch", "prev does not match the hash of the line before: a row was replaced"
        return None

    def _start_problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        if row.get("phase") == ROTATED_PHASE:
            self.starts_after_rotation = row["seq"] > 1
            return None
        if row["seq"] != 1:
            return "seq_gap", (f"the log starts at seq {row['seq']} without a rotation marker: "
                               "the rows before it were removed")
        if row["prev"] != GENESIS:
            return "prev_mismatch", "the first row does not start the chain (prev is not the genesis value)"
        return None


def _numbered_lines(fd: int, size: int) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw line, is it the last line)."""
    previous: bytes | None = None
    number = 0
    for raw in forward_lines(fd, size):
        if previous is not None:
            yield number, previous, False
        number += 1
        previous = raw
    if previous is not None:
        yield number, previous, True


@dataclass(frozen=True)
class CheckpointFault:
    """One checkpoint that does not hold: its line in the checkpoint file, a stable reason, details."""

    line: int
    reason: str  # missing | not_json | bad_signature | key_mismatch | cut_tail | rewritten
    detail: str

    def __str__(self) -> str:
        return f"checkpoint line {self.line}: {self.reason}: {self.detail}" if self.line else \
            f"{self.reason}: {self.detail}"


@dataclass(frozen=True)
class CheckpointReport:
    """The log checked against its signed checkpoints."""

    file: Path
    #: checkpoints whose row is in the log and matched
    checked: int
    #: checkpoints of rows rotated away by retention (nothing left to compare)
    skipped: int
    #: the newest checkpoint's seq (rows after it are protected by the chain alone)
    last_seq: int | None
    public_key: str | None
    faults: tuple[CheckpointFault, ...]

    @property
    def ok(self) -> bool:
        return not self.faults

    @property
    def first_fault(self) -> CheckpointFault | None:
        return self.faults[0] if self.faults else None


def verify(path: Path, *, checkpoints: bool = False, public_key: Ed25519PublicKey | None = None,
           witness: Sequence[tuple[str, str]] | None = None) -> VerifyReport:
    """Walk the log and its rotated predecessors in order and check every line's hash, seq and prev.

    A final line of the newest file that lacks its newline or does not parse is reported as
    ``torn_last_line`` (an interrupted write), not as a break; anywhere else it is ``not_json``.
    Safe to run while writers append: it checks the log as it stood when it started.

    With ``checkpoints``, the signed heads in ``<name>.checkpoints`` are checked as well (see
    ``CheckpointReport``): each must carry a valid signature (by ``public_key`` when given, else by
    the key of the first checkpoint), and the row at its seq must still be in the log with the signed
    hash, and the Merkle root of the rows up to it must be the one its note signs. A log cut below a
    signed seq (``cut_tail``) or rewritten and re-hashed (``rewritten``) fails.

    With ``witness`` ((where, note) pairs, ``gateway.audit.witness.read_witness``), every witnessed
    checkpoint must be extended by the log: its first N rows must still hash to the root the witness
    saw (``WitnessReport``), which no rewrite of the host's files can fake.
    """
    check = _ChainCheck()
    torn: LineFault | None = None
    raw_checkpoints: list[bytes | None] = []
    with snapshot(Path(path), raw_checkpoints if checkpoints else None) as files:
        entries = parse_checkpoints(raw_checkpoints[0]) if checkpoints else None
        wanted = {entry["seq"] for _, entry in entries or () if isinstance(entry.get("seq"), int)}
        tree = TreeWalk(entries or (), witness, key_of(entries or (), public_key))
        hashes: dict[int, str] = {}
        for index, (file, fd, size) in enumerate(files):
            newest = index == len(files) - 1
            for number, raw, last in _numbered_lines(fd, size):
                row = parse_row(raw)
                if newest and last and (row is None or not raw.endswith(b"\n")):
                    torn = LineFault(file, number, "torn", "the last line is incomplete (a write was "
                                     "interrupted, e.g. by a crash); this is not tampering")
                elif row is None:
                    check.fault(file, number, "not_json", "the line is not a stamped JSON row")
                if row is None:
                    continue
                if check.first_seq is None:
                    tree.start(row["seq"], stored_reader(Path(path)))
                check.row(file, number, row)
                tree.add(raw.removesuffix(b"\n"))
                if row["seq"] in wanted:
                    hashes[row["seq"]] = row["hash"]
    last_seq = None if check.expected_seq is None else check.expected_seq - 1
    checkpoint = None
    if entries is not None:
        checkpoint = check_checkpoints(checkpoint_path(Path(path)), entries, hashes, check.first_seq,
                                        last_seq, public_key, tree.roots())
    return VerifyReport(
        files=tuple(file for file, _, _ in files), rows=check.rows, first_seq=check.first_seq,
        last_seq=last_seq,
        first_broken_line=check.faults[0] if check.faults else None, torn_last_line=torn,
        problems=len(check.faults), starts_after_rotation=check.starts_after_rotation,
        checkpoint=checkpoint, witness=tree.witness_report(),
    )


def parse_checkpoints(data: bytes | None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, entry) of each line of the checkpoint file (none when it is missing).
    A line that is not a JSON object becomes an empty entry (reported as ``not_json``)."""
    entries: list[tuple[int, dict[str, Any]]] = []
    for number, raw in enumerate((data or b"").splitlines(), start=1):
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            entry = None
        entries.append((number, entry if isinstance(entry, dict) else {}))
    return entries


def check_checkpoints(file: Path, entries: list[tuple[int, dict[str, Any]]],
                       hashes: Mapping[int, str], first_seq: int | None, last_seq: int | None,
                       pinned: Ed25519PublicKey | None,
                       roots: Mapping[int, bytes] | None = None) -> CheckpointReport:
    faults: list[CheckpointFault] = []
    checked = skipped = 0
    newest: int | None = None
    key_text = public_key_text(pinned) if pinned is not None else None
    if not entries:
        faults.append(CheckpointFault(0, "missing", f"no checkpoints in {file}: the log cannot be checked "
                                      "against a signed head (was the file removed, or no signing key set?)"))
    for number, entry in entries:
        seq, signed_hash, signer = entry.get("seq"), entry.get("hash"), entry.get("public_key")
        if not (type(seq) is int and isinstance(signed_hash, str) and isinstance(signer, str)):
            faults.append(CheckpointFault(number, "not_json", "the line is not a checkpoint"))
            continue
        key_text = key_text or signer
        if signer != key_text:
            faults.append(CheckpointFault(number, "key_mismatch", f"signed by {signer}, expected {key_text}"))
            continue
        try:
            key = parse_public_key(signer)
        except ValueError:
            key = None
        if key is None or not checkpoint_signature_ok(entry, key):
            faults.append(CheckpointFault(number, "bad_signature", f"the checkpoint of seq {seq} does not "
                                          "carry a valid signature: it was edited or forged"))
            continue
        newest = seq if newest is None else max(newest, seq)
        if last_seq is None or seq > last_seq:
            faults.append(CheckpointFault(number, "cut_tail", f"seq {seq} was signed but the log ends at "
                                          f"seq {last_seq}: rows were removed from its end"))
        elif first_seq is not None and seq < first_seq:
            skipped += 1
        elif hashes.get(seq) != signed_hash:
            faults.append(CheckpointFault(number, "rewritten", f"the row at seq {seq} is not the one signed: "
                                          "the history up to it was rewritten"))
        elif (problem := note_problem(entry, key, roots)) is not None:
            faults.append(CheckpointFault(number, *problem))
        else:
            checked += 1
    return CheckpointReport(file, checked, skipped, newest, key_text, tuple(faults))
