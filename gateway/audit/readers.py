"""Reading the audit chain wherever it lives, through one interface (``AuditReader``): file or table."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.agents import CLOCK_SLACK_SECONDS, row_epoch
from gateway.audit.chain import parse_row
from gateway.audit.files import checkpoint_path, reverse_lines, snapshot
from gateway.audit.query import read_rows, stats
from gateway.audit.tree_file import stored_reader
from gateway.audit.verify import VerifyReport, parse_checkpoints, verify


class AuditReader(Protocol):
    where: str

    def rows(self, *, last: int | None = None, since: datetime | None = None,
             until: datetime | None = None, target: str | None = None, tool: str | None = None,
             phase: str | None = None, caller: str | None = None,
             correlation_id: str | None = None) -> list[dict[str, Any]]: ...

    def stats(self, *, since: datetime | None = None) -> dict[str, Any]: ...

    def verify(self, *, checkpoints: bool = False, public_key: Ed25519PublicKey | None = None,
               witness: Sequence[tuple[str, str]] | None = None) -> VerifyReport: ...

    def checkpoints(self) -> list[dict[str, Any]]: ...

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]: ...

    def rows_after(self, seq: int | None, since: float) -> Iterator[dict[str, Any]]: ...


class FileAuditReader:
    """The JSONL log and its rotated files (``gateway.audit.query``, ``gateway.audit.verify``), its
    checkpoint file and its tree file (``gateway.audit.tree_file``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    def rows(self, *, last: int | None = None, since: datetime | None = None,
             until: datetime | None = None, target: str | None = None, tool: str | None = None,
             phase: str | None = None, caller: str | None = None,
             correlation_id: str | None = None) -> list[dict[str, Any]]:
        return read_rows(self.path, last=last, since=since, until=until, target=target, tool=tool,
                         phase=phase, caller=caller, correlation_id=correlation_id)

    def stats(self, *, since: datetime | None = None) -> dict[str, Any]:
        return stats(self.path, since=since)

    def verify(self, *, checkpoints: bool = False, public_key: Ed25519PublicKey | None = None,
               witness: Sequence[tuple[str, str]] | None = None) -> VerifyReport:
        return verify(self.path, checkpoints=checkpoints, public_key=public_key, witness=witness)

    def checkpoints(self) -> list[dict[str, Any]]:
        try:
            data = checkpoint_path(self.path).read_bytes()
        except FileNotFoundError:
            return []
        return [entry for _, entry in parse_checkpoints(data)]

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        """Stored tree hashes (``LookupError`` when the tree file lacks one)."""
        return stored_reader(self.path)(indexes)

    def rows_after(self, seq: int | None, since: float) -> Iterator[dict[str, Any]]:
        """The rows after ``seq`` (every row with None) down to the first row older than ``since``
        (epoch seconds) by more than ``CLOCK_SLACK_SECONDS``, newest first: read from the end of the
        log, so the work is the rows returned, never the whole log (``gateway.audit.agents``)."""
        with snapshot(self.path) as files:
            for _, fd, size in reversed(files):
                for _, line in reverse_lines(fd, size):
                    row = parse_row(line)
                    if row is None:
                        continue
                    if seq is not None and row["seq"] <= seq:
                        return
                    moment = row_epoch(row)
                    if moment is not None and moment < since - CLOCK_SLACK_SECONDS:
                        return
                    yield row
