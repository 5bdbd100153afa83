"""Interoperability: the audit log's checkpoints, verifier key and proofs (both engines) verified by a
second, independent implementation of the same formats: Go's golang.org/x/mod/sumdb/tlog and
sumdb/note (Debian package golang-golang-x-mod-dev), through tests/interop_go/main.go. Under CI=true a
missing Go toolchain or package fails the test."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.processes import unavailable
from support.tier import needs

from gateway.audit.file_sink import AuditSink
from gateway.audit.note import parse_checkpoint, verifier_key
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.proofs import consistency_proof, inclusion_proof, latest_note
from gateway.audit.readers import AuditReader, FileAuditReader
from gateway.audit.signing import load_or_create_signing_key
from gateway.store.postgres import PostgresStore

GOPATH = Path("/usr/share/gocode")
SOURCE = Path(__file__).resolve().parents[1] / "interop_go" / "main.go"
ORIGIN = "interop.example/audit"


@pytest.fixture(scope="module")
@needs("slow")
def go_checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None:
        unavailable("Go is not installed (Debian: golang-go)")
    if not (GOPATH / "src/golang.org/x/mod/sumdb/tlog").is_dir():
        unavailable("golang.org/x/mod is not installed (Debian: golang-golang-x-mod-dev)")
    out = tmp_path_factory.mktemp("go")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOCACHE": str(out / "cache"),
           "GOFLAGS": ""}
    built = subprocess.run([go, "build", "-o", str(out / "check"), str(SOURCE)], env=env, capture_output=True,
                           text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    return out / "check"


@pytest.fixture(params=["file", pytest.param("postgresql", marks=pytest.mark.postgres)])
def signed_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[AuditReader, list[bytes]]]:
    key_file = tmp_path / "signing.key"
    rows: list[bytes] = []
    if request.param == "file":
        path = tmp_path / "audit.jsonl"
        with AuditSink(path, durable=False, key_file=key_file, checkpoint_rows=40, origin=ORIGIN) as sink:
            for i in range(203):
                sink.write({"phase": "call", "tool": "list_vms", "caller": "ann", "args": {"i": i, "s": "é"}})
        yield FileAuditReader(path), path.read_bytes().splitlines()
        return
    with PostgresStore(request.getfixturevalue("pg_url")) as store:
        pg = PgAuditSink(store, key_file=key_file, checkpoint_rows=40, origin=ORIGIN)
        for i in range(203):
            pg.write({"phase": "call", "tool": "list_vms", "caller": "ann", "args": {"i": i, "s": "é"}})
        pg.close()
        with store.pool.connection() as conn:
            rows = [str(r["body"]).encode() for r in conn.execute("SELECT body FROM audit_rows ORDER BY seq")]
        yield PgAuditReader(store), rows


def test_go_sumdb_verifies_the_checkpoints_and_proofs(go_checker: Path, signed_log: Any,
                                                      tmp_path: Path) -> None:
    reader, rows = signed_log
    key = load_or_create_signing_key(tmp_path / "signing.key").public_key()
    note = latest_note(reader)
    checkpoint = parse_checkpoint(note)
    assert checkpoint is not None and checkpoint.size == 203
    notes = [e["note"] for e in reader.checkpoints() if isinstance(e.get("note"), str)]
    request = {
        "vkey": verifier_key(ORIGIN, key), "checkpoint": note,
        "rows": [base64.b64encode(r).decode() for r in rows],
        "inclusion": [{"row": base64.b64encode(rows[seq - 1]).decode(), "proof": inclusion_proof(reader, seq)}
                      for seq in range(1, 204)],
        "consistency": [{"old": old, "proof": consistency_proof(reader, parse_checkpoint(old).size)}  # type: ignore[union-attr]
                        for old in notes[:-1]],
    }
    assert len(request["consistency"]) == 5
    checked = _run(go_checker, request)
    assert checked.stdout.strip() == "ok", checked.stdout + checked.stderr
    # and Go refuses what it should: a row that is not the proven one, a note signed by another key
    request["inclusion"] = [{"row": base64.b64encode(rows[7]).decode(), "proof": inclusion_proof(reader, 9)}]
    refused = _run(go_checker, {**request, "rows": []})
    assert refused.returncode == 1 and "tlog.CheckRecord(8)" in refused.stdout
    other = load_or_create_signing_key(tmp_path / "other.key").public_key()
    refused = _run(go_checker, {**request, "vkey": verifier_key(ORIGIN, other), "rows": []})
    assert refused.returncode == 1 and "note.Open" in refused.stdout


def _run(checker: Path, request: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(checker)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=60, check=False)
