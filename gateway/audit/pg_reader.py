"""Reading the audit chain in PostgreSQL with the same answers as the file's readers (``PgAuditReader``).

Verification reads one REPEATABLE READ snapshot, so it is consistent while replicas append. Someone
able to delete checkpoint rows too is caught only down to the newest checkpoint left: pin the public
key so forged checkpoints fail as ``key_mismatch``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from gateway.audit.chain import GENESIS, format_ts, row_hash
from gateway.audit.pg_retention import retained_from
from gateway.audit.pg_sink import FILTER_COLUMNS
from gateway.audit.pg_tree import read_hashes
from gateway.audit.query import RowCounts
from gateway.audit.tree_check import TreeWalk, key_of
from gateway.audit.verify import LineFault, VerifyReport, check_checkpoints, parse_checkpoints
from gateway.errors import AuditUnavailable
from gateway.store.postgres import PostgresStore

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

log = logging.getLogger(__name__)


class PgAuditReader:
    """``gateway audit log|stats|verify`` on the audit table."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.where = f"{store.where} (table audit_rows)"
        self.label = Path(store.where.removeprefix("postgresql://") + "#audit_rows")
        self.checkpoint_label = Path(store.where.removeprefix("postgresql://") + "#audit_checkpoints")

    @contextmanager
    def _snapshot(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self.store.pool.connection() as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield conn
        except psycopg.Error as exc:
            log.error("audit: cannot read %s: %s", self.where, exc)
            raise AuditUnavailable(f"cannot read {self.where}; check PostgreSQL and the gateway log"
                                   ) from None

    def rows(self, *, last: int | None = None, since: datetime | None = None,
             until: datetime | None = None, target: str | None = None, tool: str | None = None,
             phase: str | None = None, caller: str | None = None,
             correlation_id: str | None = None) -> list[dict[str, Any]]:
        """Rows matching every filter, oldest first; with ``last`` only the newest ``last`` of them."""
        if last is not None and last <= 0:
            return []
        clauses, params = self._window(since, until)
        for name, value in zip(FILTER_COLUMNS, (phase, tool, target, caller, correlation_id), strict=True):
            if value is not None:
                clauses.append(f"{name} = %s")
                params.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        limit = "" if last is None else f"LIMIT {int(last)}"
        with self._snapshot() as conn:
            found = conn.execute(f"SELECT body FROM audit_rows {where} ORDER BY seq DESC {limit}",
                                 params).fetchall()
        return [json.loads(r["body"]) for r in reversed(found)]

    @staticmethod
    def _window(since: datetime | None, until: datetime | None) -> tuple[list[str], list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if since is not None:
            clauses.append("ts >= %s")
            params.append(format_ts(since if since.tzinfo else since.replace(tzinfo=UTC)))
        if until is not None:
            clauses.append("ts <= %s")
            params.append(format_ts(until if until.tzinfo else until.replace(tzinfo=UTC)))
        return clauses, params

    def stats(self, *, since: datetime | None = None) -> dict[str, Any]:
        """The same summary as ``gateway.audit.query.stats`` (counted by ``query.RowCounts``)."""
        clauses, params = self._window(since, None)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        counts = RowCounts(newest_first=False)
        with self._snapshot() as conn, conn.cursor(name="audit_stats") as cursor:
            cursor.execute(f"SELECT body FROM audit_rows {where} ORDER BY seq", params)
            for record in cursor:
                counts.add(json.loads(record["body"]))
        return counts.summary(since)

    def verify(self, *, checkpoints: bool = False, public_key: Ed25519PublicKey | None = None,
               witness: Sequence[tuple[str, str]] | None = None) -> VerifyReport:
        """Walk the table in ``seq`` order and check every row's hash, seq and prev (one snapshot).

        With ``checkpoints``, the signed heads in ``audit_checkpoints`` are checked in the same
        snapshot by the file verifier's rules (``gateway.audit.verify.verify``): a table cut below a
        signed seq (``cut_tail``) or rewritten and re-chained (``rewritten``) fails."""
        faults: list[LineFault] = []
        count = 0
        first_seq: int | None = None
        expected_seq: int | None = None
        expected_prev = GENESIS
        entries: list[tuple[int, dict[str, Any]]] | None = None
        hashes: dict[int, str] = {}
        with self._snapshot() as conn, conn.cursor(name="audit_verify") as cursor:
            if checkpoints:
                found = conn.execute("SELECT body FROM audit_checkpoints ORDER BY id").fetchall()
                entries = parse_checkpoints(b"\n".join(str(r["body"]).encode("utf-8") for r in found))
            wanted = {entry["seq"] for _, entry in entries or () if type(entry.get("seq")) is int}
            tree = TreeWalk(entries or (), witness, key_of(entries or (), public_key))
            retained = retained_from(conn)
            cursor.execute("SELECT seq, hash, body FROM audit_rows ORDER BY seq")
            for record in cursor:
                seq = int(record["seq"])
                if first_seq is None:
                    tree.start(seq, lambda indexes: read_hashes(conn, indexes))
                tree.add(str(record["body"]).encode("utf-8"))
                problem = _problem(record, expected_seq, expected_prev, retained)
                if problem is not None:
                    faults.append(LineFault(self.label, seq, *problem))
                first_seq = seq if first_seq is None else first_seq
                count += 1
                expected_seq, expected_prev = seq + 1, str(record["hash"])
                if seq in wanted:
                    hashes[seq] = str(record["hash"])
        last_seq = None if expected_seq is None else expected_seq - 1
        checkpoint = None
        if entries is not None:
            checkpoint = check_checkpoints(self.checkpoint_label, entries, hashes, first_seq, last_seq,
                                            public_key, tree.roots())
        return VerifyReport(files=(self.label,) if count else (), rows=count, first_seq=first_seq,
                            last_seq=last_seq,
                            first_broken_line=faults[0] if faults else None, torn_last_line=None,
                            problems=len(faults),
                            starts_after_rotation=retained > 1 and first_seq == retained,
                            checkpoint=checkpoint,
                            witness=tree.witness_report())

    # -- the Merkle tree (``gateway.audit.proofs`` builds proofs from these) ---------------------------

    def checkpoints(self) -> list[dict[str, Any]]:
        """The signed checkpoint entries, oldest first."""
        with self._snapshot() as conn:
            found = conn.execute("SELECT body FROM audit_checkpoints ORDER BY id").fetchall()
        return [entry for _, entry in parse_checkpoints(b"\n".join(str(r["body"]).encode() for r in found))]

    def read_hashes(self, indexes: Sequence[int]) -> list[bytes]:
        with self._snapshot() as conn:
            return read_hashes(conn, indexes)

    def rows_after(self, seq: int | None, since: float) -> Iterator[dict[str, Any]]:
        """The rows after ``seq`` (every row with None) no older than ``since`` (epoch seconds), oldest
        first: by the primary key and the ``ts`` index, so the work is the rows returned. Rows of every
        replica (one table; seqs are taken under the append lock, so they commit in order)."""
        moment = format_ts(datetime.fromtimestamp(since, UTC))
        with self._snapshot() as conn, conn.cursor(name="audit_rows_after") as cursor:
            cursor.execute("SELECT body FROM audit_rows WHERE seq > %s AND ts >= %s ORDER BY seq",
                           (-1 if seq is None else seq, moment))
            for record in cursor:
                yield json.loads(record["body"])


def _problem(record: Mapping[str, Any], expected_seq: int | None, expected_prev: str,
             retained: int = 1) -> tuple[str, str] | None:
    try:
        row = json.loads(record["body"])
    except ValueError:
        return "not_json", "the row's body is not a stamped JSON row"
    if not isinstance(row, dict) or row.get("seq") != record["seq"] or row.get("hash") != record["hash"]:
        return "hash_mismatch", "the row's columns do not match its body: it was edited after writing"
    if row_hash(row) != row["hash"]:
        return "hash_mismatch", "the row's content does not match its hash: it was edited after writing"
    want = retained if expected_seq is None else expected_seq
    if row["seq"] != want:
        what = "rows are missing" if row["seq"] > want else "rows are out of order"
        return "seq_gap", f"expected seq {want}, found {row['seq']}: {what}"
    if expected_seq is None and retained > 1:
        return None  # the first row kept after a prune: the row it chains to was dropped by retention
    if row.get("prev") != expected_prev:
        return "prev_mismatch", "prev does not match the hash of the row before: a row was replaced"
    return None
