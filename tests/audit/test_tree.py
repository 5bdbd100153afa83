"""The audit log's Merkle tree on both engines (the JSONL file and a real PostgreSQL): every row of a
10,000-row log is provable against the signed checkpoint, checkpoints are consistent with each other,
and any edit, deletion, reordering, insertion, cut tail or re-signed rewrite is caught by
``verify --witness`` against what a witness saw earlier, naming the first inconsistent checkpoint."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.file_sink import AuditSink
from gateway.audit.files import log_files
from gateway.audit.merkle import leaf_hash, verify_inclusion
from gateway.audit.note import Checkpoint, parse_checkpoint
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.proofs import (
    check_consistency,
    check_inclusion,
    consistency_proof,
    inclusion_proof,
    latest_checkpoint,
    open_signed,
)
from gateway.audit.readers import AuditReader, FileAuditReader
from gateway.audit.signing import load_or_create_signing_key
from gateway.audit.witness import read_witness
from gateway.store.postgres import PostgresStore

ENGINES = ("file", pytest.param("postgresql", marks=pytest.mark.postgres))
COLUMNS = "seq, ts, phase, tool, target, caller, correlation_id, hash, body"


@dataclass
class Log:
    """One audit log under test on one engine, with its witness directory and signing key."""

    engine: str
    home: Path
    sink: AuditSink | PgAuditSink
    reader: AuditReader
    url: str | None = None
    store: PostgresStore | None = None
    closers: list[Any] = field(default_factory=list)

    @property
    def witness(self) -> Path:
        return self.home / "witness"

    @property
    def key(self) -> Ed25519PublicKey:
        return load_or_create_signing_key(self.home / "signing.key").public_key()

    def write(self, rows: int, start: int = 0) -> None:
        for i in range(start, start + rows):
            self.sink.write({"phase": "call", "tool": "list_vms", "caller": "ann", "args": {"i": i}})

    def lines(self) -> list[bytes]:
        """Every row as stored, oldest first."""
        if self.store is not None:
            with self.store.pool.connection() as conn:
                found = conn.execute("SELECT body FROM audit_rows ORDER BY seq").fetchall()
            return [str(r["body"]).encode() for r in found]
        return [line for file in log_files(self.home / "audit.jsonl")
                for line in file.read_bytes().splitlines()]

    def verify_witness(self) -> Any:
        return self.reader.verify(witness=read_witness(self.witness), public_key=self.key)


def _open(engine: str, home: Path, url: str | None, **options: Any) -> Log:
    common = {"key_file": home / "signing.key", "witness_dir": home / "witness",
              "origin": "test.example/audit"}
    if engine == "file":
        path = home / "audit.jsonl"
        sink = AuditSink(path, durable=False, **common, **options)
        return Log(engine, home, sink, FileAuditReader(path))
    assert url is not None
    store = PostgresStore(url)
    pg_sink = PgAuditSink(store, **common, **{k: v for k, v in options.items() if k.startswith("checkpoint")})
    return Log(engine, home, pg_sink, PgAuditReader(store), url=url, store=store, closers=[store.close])


@pytest.fixture(params=ENGINES)
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    opened: list[Log] = []

    def make(name: str = "log", url: str | None = None, **options: Any) -> Log:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        if request.param == "postgresql" and url is None:
            url = request.getfixturevalue("pg_url") if not opened else request.getfixturevalue(
                "pg_server").create_database()
        log = _open(request.param, home, url, **options)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.sink.close()
        for close in log.closers:
            close()


def _checkpoints(log: Log) -> list[Checkpoint]:
    found = [parse_checkpoint(e["note"]) for e in log.reader.checkpoints() if isinstance(e.get("note"), str)]
    return [c for c in found if c is not None]


def test_every_row_of_a_10000_row_log_has_an_inclusion_proof_that_verifies(make_log: Any) -> None:
    log = make_log(checkpoint_rows=2500)
    log.write(10_000)
    checkpoint = open_signed(latest_note_of(log), log.key)
    assert checkpoint.size == 10_000 and checkpoint.origin == "test.example/audit"
    lines = log.lines()
    assert len(lines) == 10_000
    for seq, line in enumerate(lines, start=1):
        proof = inclusion_proof(log.reader, seq, checkpoint.size)
        assert proof["index"] == seq - 1 and proof["tree_size"] == 10_000
        hashes = [base64.b64decode(h) for h in proof["hashes"]]
        assert verify_inclusion(seq - 1, 10_000, leaf_hash(line), hashes, checkpoint.root), seq
    check_inclusion(inclusion_proof(log.reader, 4321), checkpoint, lines[4320])
    with pytest.raises(ValueError, match="not leaf 4320"):
        check_inclusion(inclusion_proof(log.reader, 4321), checkpoint, lines[4321])


def latest_note_of(log: Log) -> str:
    return latest_checkpoint(log.reader).note


def test_a_consistency_proof_between_two_checkpoints_verifies(make_log: Any) -> None:
    log = make_log(checkpoint_rows=7)
    log.write(50)
    checkpoints = _checkpoints(log)
    assert [c.size for c in checkpoints] == [7, 14, 21, 28, 35, 42, 49]
    for old in checkpoints:
        new = checkpoints[-1]
        check_consistency(consistency_proof(log.reader, old.size, new.size), old, new)
    with pytest.raises(ValueError, match="does not extend"):
        forged = Checkpoint("test.example/audit", 14, checkpoints[2].root, "")  # size 21's root
        check_consistency(consistency_proof(log.reader, 14, 49), forged, checkpoints[-1])


def _rows_as_stored(log: Log) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.lines()]


def _tamper(log: Log, how: str, seq: int) -> None:
    """Change the stored log as an intruder would (seq counts from 1)."""
    if log.store is None:
        path = log.home / "audit.jsonl"
        lines = path.read_bytes().splitlines(keepends=True)
        i = seq - 1
        if how == "edit":
            lines[i] = lines[i].replace(b'"caller":"ann"', b'"caller":"eve"')
        elif how == "delete":
            del lines[i]
        elif how == "reorder":
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
        elif how == "insert":
            lines.insert(i, lines[i])
        elif how == "truncate":
            lines = lines[:i]
        path.write_bytes(b"".join(lines))
        return
    with psycopg.connect(log.url or "", autocommit=True) as conn:
        if how == "edit":
            conn.execute("UPDATE audit_rows SET body = replace(body, '\"ann\"', '\"eve\"') WHERE seq = %s",
                         (seq,))
        elif how == "delete":
            conn.execute("DELETE FROM audit_rows WHERE seq = %s", (seq,))
        elif how == "reorder":
            conn.execute("UPDATE audit_rows SET seq = CASE seq WHEN %s THEN -1 ELSE -2 END "
                         "WHERE seq IN (%s, %s)", (seq, seq, seq + 1))
            conn.execute("UPDATE audit_rows SET seq = CASE seq WHEN -1 THEN %s ELSE %s END WHERE seq < 0",
                         (seq + 1, seq))
        elif how == "insert":
            conn.execute("UPDATE audit_rows SET seq = -seq - 1 WHERE seq >= %s", (seq,))
            conn.execute("UPDATE audit_rows SET seq = -seq WHERE seq < 0")
            conn.execute("INSERT INTO audit_rows (seq, ts, hash, body) SELECT %s, ts, hash, body "
                         "FROM audit_rows WHERE seq = %s", (seq, seq + 1))
        elif how == "truncate":
            conn.execute("DELETE FROM audit_rows WHERE seq >= %s", (seq,))


@pytest.mark.parametrize("how", ["edit", "delete", "reorder", "insert", "truncate"])
def test_a_changed_log_no_longer_extends_what_the_witness_saw(make_log: Any, how: str) -> None:
    log = make_log(checkpoint_rows=10)
    log.write(60)
    assert log.verify_witness().ok
    _tamper(log, how, 34)
    report = log.verify_witness()
    assert not report.ok and report.witness is not None
    fault = report.witness.first_fault
    assert fault is not None
    if how == "truncate":  # 33 rows left: the witness saw 40 and more
        assert (fault.reason, fault.size) == ("rollback", 40) and "holds 33" in fault.detail
    else:  # seq 34 changed: the first witnessed head covering it is size 40, and 1..30 still hold
        assert (fault.reason, fault.size) == ("inconsistent", 40), fault
        assert "seq 31..40" in fault.detail
    assert "witness" in fault.where and fault.where.endswith(".checkpoint")


def test_a_rewritten_log_re_signed_with_the_same_key_passes_its_checkpoints_but_not_the_witness(
        make_log: Any) -> None:
    log = make_log(checkpoint_rows=10)
    log.write(60)
    # the intruder holds the key: a second log written with it, one row different, and its own checkpoints
    forged = make_log("forged", checkpoint_rows=10)
    shutil.copy(log.home / "signing.key", forged.home / "signing.key")
    _copy_rows(log, forged, 25)  # rows 1..25 kept as they were, row 26 onwards rewritten
    forged.sink.write({"phase": "call", "tool": "delete_vm", "caller": "eve", "args": {"i": 25}})
    forged.write(34, start=26)
    forged.sink.close()
    assert forged.reader.verify(checkpoints=True, public_key=log.key).ok, "a re-signed rewrite fools them"
    report = forged.reader.verify(witness=read_witness(log.witness), public_key=log.key)
    assert not report.ok and report.witness is not None and report.witness.first_fault is not None
    fault = report.witness.first_fault
    assert (fault.reason, fault.size) == ("inconsistent", 30) and "seq 21..30" in fault.detail
    assert str(log.witness) in fault.where


def _copy_rows(log: Log, to: Log, rows: int) -> None:
    if log.store is None:
        lines = (log.home / "audit.jsonl").read_bytes().splitlines(keepends=True)[:rows]
        (to.home / "audit.jsonl").write_bytes(b"".join(lines))
        return
    with psycopg.connect(log.url or "") as source, source.cursor() as cursor:
        cursor.execute(f"SELECT {COLUMNS} FROM audit_rows WHERE seq <= %s ORDER BY seq", (rows,))
        found = cursor.fetchall()
    with psycopg.connect(to.url or "", autocommit=True) as target, target.cursor() as cursor:
        cursor.executemany(f"INSERT INTO audit_rows ({COLUMNS}) VALUES ({', '.join(['%s'] * 9)})", found)


def test_a_witness_of_another_key_is_refused_by_signature(make_log: Any, tmp_path: Path) -> None:
    log = make_log(checkpoint_rows=10)
    log.write(20)
    other = load_or_create_signing_key(tmp_path / "other.key").public_key()
    report = log.reader.verify(witness=read_witness(log.witness), public_key=other)
    assert report.witness is not None and report.witness.first_fault is not None
    assert report.witness.first_fault.reason == "bad_signature"


def test_checkpoint_notes_are_checked_by_verify_checkpoint(make_log: Any) -> None:
    log = make_log(checkpoint_rows=10)
    log.write(30)
    report = log.reader.verify(checkpoints=True, public_key=log.key)
    assert report.ok and report.checkpoint is not None and report.checkpoint.checked == 3
    assert all(isinstance(e["note"], str) and e["tree_size"] == e["seq"] for e in log.reader.checkpoints())


def test_rotation_and_retention_keep_the_retained_range_provable(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    key_file, witness = tmp_path / "signing.key", tmp_path / "witness"
    with AuditSink(path, durable=False, max_bytes=4000, keep=2, retain_seconds=0, key_file=key_file,
                   checkpoint_rows=10, witness_dir=witness) as sink:
        for i in range(300):
            sink.write({"phase": "call", "tool": "list_vms", "caller": "ann", "args": {"i": i}})
    assert sink.stats()["files_dropped"] > 0
    reader = FileAuditReader(path)
    key = load_or_create_signing_key(key_file).public_key()
    report = reader.verify(checkpoints=True, public_key=key, witness=read_witness(witness))
    assert report.ok, (report.checkpoint, report.witness)
    assert report.first_seq is not None and report.first_seq > 1 and report.starts_after_rotation
    assert report.witness is not None and report.witness.checked > 20
    checkpoint = open_signed(latest_checkpoint(reader).note, key)
    lines = [line for file in log_files(path) for line in file.read_bytes().splitlines()]
    for offset, line in enumerate(lines):
        seq = report.first_seq + offset
        check_inclusion(inclusion_proof(reader, seq), checkpoint, line)
    first = parse_checkpoint(read_witness(witness)[0][1])
    assert first is not None and first.size < report.first_seq, "the oldest witnessed rows are gone"
    check_consistency(consistency_proof(reader, first.size), first, checkpoint)


def test_a_log_from_before_the_tree_gets_one_on_its_next_write(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditSink(path, durable=False) as sink:
        for i in range(37):
            sink.write({"phase": "call", "args": {"i": i}})
    (tmp_path / "audit.jsonl.tree").unlink()
    with AuditSink(path, durable=False, key_file=tmp_path / "k", checkpoint_rows=1000) as sink:
        sink.write({"phase": "call", "args": {"i": 37}})
    reader = FileAuditReader(path)
    checkpoint = latest_checkpoint(reader)
    assert checkpoint.size == 38
    lines = path.read_bytes().splitlines()
    check_inclusion(inclusion_proof(reader, 5), checkpoint, lines[4])


def test_pruning_the_table_keeps_the_retained_rows_provable(pg_url: str, tmp_path: Path) -> None:
    from gateway.audit.pg_retention import PRUNED_PHASE, prune_audit

    log = _open("postgresql", tmp_path, pg_url, checkpoint_rows=10)
    try:
        log.write(300)
        assert prune_audit(log.sink, 201) == 200  # type: ignore[arg-type]
        report = log.reader.verify(checkpoints=True, public_key=log.key, witness=read_witness(log.witness))
        assert report.ok, (report.first_broken_line, report.checkpoint, report.witness)
        assert (report.first_seq, report.rows, report.starts_after_rotation) == (201, 101, True)
        assert report.checkpoint is not None and report.checkpoint.skipped == 20
        assert report.witness is not None and report.witness.checked == 30
        assert json.loads(log.lines()[-1])["phase"] == PRUNED_PHASE
        log.sink.checkpoint()
        checkpoint = open_signed(latest_note_of(log), log.key)
        assert checkpoint.size == 301
        for offset, line in enumerate(log.lines()):
            check_inclusion(inclusion_proof(log.reader, 201 + offset), checkpoint, line)
        first = parse_checkpoint(read_witness(log.witness)[0][1])
        assert first is not None and first.size == 10
        check_consistency(consistency_proof(log.reader, 10), first, checkpoint)
        # a row deleted from the kept range is caught by the witness; an unrecorded prune by the chain
        _tamper(log, "delete", 250)
        assert not log.verify_witness().ok
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM audit_rows WHERE seq < 220")
        assert log.reader.verify().first_broken_line is not None
    finally:
        log.sink.close()
        for close in log.closers:
            close()


def test_two_replicas_appending_at_once_keep_one_tree(pg_url: str, tmp_path: Path) -> None:
    import threading

    stores = [PostgresStore(pg_url) for _ in range(2)]
    sinks = [PgAuditSink(s, key_file=tmp_path / "signing.key", checkpoint_rows=25,
                         origin="test.example/audit", witness_dir=tmp_path / "witness") for s in stores]
    try:
        def append(sink: PgAuditSink, who: int) -> None:
            for i in range(150):
                sink.write({"phase": "call", "caller": f"replica-{who}", "args": {"i": i}})

        threads = [threading.Thread(target=append, args=(sink, n)) for n, sink in enumerate(sinks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        sinks[0].checkpoint()
        reader = PgAuditReader(stores[0])
        key = load_or_create_signing_key(tmp_path / "signing.key").public_key()
        report = reader.verify(checkpoints=True, public_key=key, witness=read_witness(tmp_path / "witness"))
        assert report.ok and report.rows == 300, (report.checkpoint, report.witness)
        checkpoint = open_signed(latest_checkpoint(reader).note, key)
        with stores[0].pool.connection() as conn:
            found = conn.execute("SELECT body FROM audit_rows ORDER BY seq").fetchall()
        lines = [str(r["body"]).encode() for r in found]
        for seq, line in enumerate(lines, start=1):
            check_inclusion(inclusion_proof(reader, seq), checkpoint, line)
    finally:
        for sink in sinks:
            sink.close()
        for store in stores:
            store.close()
