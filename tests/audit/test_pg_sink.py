"""The audit chain in PostgreSQL (real server): one chain for every replica, never forked; verified,
read and summarised like the file; fail closed when the database cannot take a row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from support.postgres import PgServer, discard, start_postgres, wait_for

from gateway.audit.chain import row_hash
from gateway.audit.file_sink import AuditSink
from gateway.audit.metrics import audit_families
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.query import stats
from gateway.backends import engine_of
from gateway.errors import AuditUnavailable
from gateway.settings import Settings
from gateway.store.postgres import PostgresStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(pg_url: str) -> Iterator[PostgresStore]:
    with PostgresStore(pg_url) as s:
        yield s


def test_rows_chain_and_verify(store: PostgresStore) -> None:
    sink = PgAuditSink(store)
    first = sink.write({"phase": "call", "tool": "list_vms", "target": "vc1", "caller": "ann"})
    second = sink.write({"phase": "result", "tool": "list_vms", "target": "vc1", "caller": "ann",
                         "result": {"vms": ["a", "b"]}})
    assert (first["seq"], second["seq"]) == (1, 2)
    assert first["prev"] == "0" * 64 and second["prev"] == first["hash"]
    assert "result" not in second and second["result_size"] > 0
    report = PgAuditReader(store).verify()
    assert report.ok and (report.rows, report.first_seq, report.last_seq) == (2, 1, 2)


def test_stats_feed_the_audit_metric_families(store: PostgresStore) -> None:
    """/metrics shows the audit families on PostgreSQL too (counted by this process)."""
    sink = PgAuditSink(store)
    for _ in range(3):
        sink.write({"phase": "call", "tool": "list_vms", "caller": "ann"})
    families = {f.name: f.samples[0].value for f in audit_families(sink)}
    assert families["gateway_audit_rows_written"] == 3
    assert families["gateway_audit_lock_timeouts"] == 0
    assert "gateway_audit_bytes" not in families, "no file size to report for a table"


def test_secrets_are_redacted_before_the_row_reaches_the_table(store: PostgresStore, pg_url: str) -> None:
    PgAuditSink(store).write({"phase": "call", "caller": "ann", "args": {"password": "hunter2-secret"}})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert "hunter2-secret" not in repr(conn.execute("SELECT * FROM audit_rows").fetchall())


_APPENDER = """
import os, sys
from gateway.store.postgres import PostgresStore
from gateway.audit.pg_sink import PgAuditSink
store = PostgresStore(os.environ["STORE_AT"])
sink = PgAuditSink(store)
print("ready", flush=True)
sys.stdin.readline()
for i in range(int(sys.argv[1])):
    sink.write({"phase": "call", "caller": sys.argv[2], "n": i})
store.close()
"""


def test_two_replicas_appending_at_once_never_fork_the_chain(store: PostgresStore, pg_url: str) -> None:
    rows_each = 150
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STORE_AT": pg_url}
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(rows_each), f"replica-{i}"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(2)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    reader = PgAuditReader(store)
    report = reader.verify()
    assert report.ok, report.first_broken_line
    assert (report.rows, report.last_seq) == (2 * rows_each, 2 * rows_each)
    callers = reader.stats()["by_caller"]
    assert callers == {"replica-0": rows_each, "replica-1": rows_each}


def test_verify_names_an_edited_and_a_removed_row(store: PostgresStore, pg_url: str) -> None:
    sink = PgAuditSink(store)
    for i in range(5):
        sink.write({"phase": "call", "caller": "ann", "n": i})
    with psycopg.connect(pg_url, autocommit=True) as conn:
        body = json.loads(conn.execute("SELECT body FROM audit_rows WHERE seq = 2").fetchone()[0])
        body["caller"] = "mallory"
        conn.execute("UPDATE audit_rows SET body = %s WHERE seq = 2", (json.dumps(body),))
    report = PgAuditReader(store).verify()
    assert not report.ok
    assert report.first_broken_line is not None
    assert (report.first_broken_line.line, report.first_broken_line.reason) == (2, "hash_mismatch")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE audit_rows SET body = %s WHERE seq = 2",
                     (json.dumps({**body, "caller": "ann"}),))  # restored: the hash matches again
        assert PgAuditReader(store).verify().ok
        conn.execute("DELETE FROM audit_rows WHERE seq = 4")
    report = PgAuditReader(store).verify()
    assert report.first_broken_line is not None
    assert (report.first_broken_line.line, report.first_broken_line.reason) == (5, "seq_gap")


def test_reader_filters_like_the_file_reader(store: PostgresStore) -> None:
    moments = iter([datetime(2026, 11, 30, 10, m, tzinfo=UTC) for m in range(6)])
    sink = PgAuditSink(store, clock=lambda: next(moments))
    for tool, caller in [("a", "ann"), ("b", "bob"), ("a", "bob"), ("a", "ann"), ("c", "ann"), ("a", "ann")]:
        sink.write({"phase": "call", "tool": tool, "caller": caller})
    reader = PgAuditReader(store)
    assert [r["seq"] for r in reader.rows(tool="a", caller="ann")] == [1, 4, 6]
    assert [r["seq"] for r in reader.rows(tool="a", last=2)] == [4, 6]
    assert [r["seq"] for r in reader.rows(since=datetime(2026, 11, 30, 10, 3, tzinfo=UTC),
                                          until=datetime(2026, 11, 30, 10, 4, tzinfo=UTC))] == [4, 5]
    assert reader.rows(last=0) == []
    summary = reader.stats(since=datetime(2026, 11, 30, 10, 1, tzinfo=UTC))
    assert summary["rows"] == 5 and summary["by_tool"] == {"a": 3, "b": 1, "c": 1}
    window = ("2026-11-30T10:01:00.000Z", "2026-11-30T10:05:00.000Z")
    assert (summary["first_ts"], summary["last_ts"]) == window


def test_the_table_and_the_file_summarise_the_same_rows_alike(store: PostgresStore, tmp_path: Path) -> None:
    events = [{"phase": "call", "tool": "a", "caller": "ann", "outcome": "ok"},
              {"phase": "call", "tool": "b", "caller": "bob", "target": "vc1"},
              {"phase": "outcome", "tool": "a", "caller": "bob", "outcome": "error"},
              {"phase": "call", "tool": "c", "caller": "ann", "target": "vc2", "outcome": "ok"}]
    def clock() -> Iterator[datetime]:
        return iter([datetime(2026, 11, 30, 10, m, tzinfo=UTC) for m in range(len(events))])

    table_clock, file_clock = clock(), clock()
    with PgAuditSink(store, clock=lambda: next(table_clock)) as table_sink, \
            AuditSink(tmp_path / "audit.jsonl", durable=False, clock=lambda: next(file_clock)) as file_sink:
        for event in events:
            table_sink.write(event)
            file_sink.write(event)
    since = datetime(2026, 11, 30, 10, 1)  # naive: UTC
    table, file = PgAuditReader(store).stats(since=since), stats(tmp_path / "audit.jsonl", since=since)
    assert table == file
    assert (table["rows"], table["first_ts"], table["last_ts"]) == (3, "2026-11-30T10:01:00.000Z",
                                                                    "2026-11-30T10:03:00.000Z")
    assert table["by_caller"] == {"ann": 1, "bob": 2} and table["by_outcome"] == {"error": 1, "ok": 1}


def test_the_engine_table_picks_the_audit_table_with_postgres_and_the_file_without(
        store: PostgresStore, pg_url: str, tmp_path: Path) -> None:
    shared = Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url})
    assert isinstance(engine_of(shared).audit(shared, store), PgAuditSink)
    embedded = Settings.from_env({"GATEWAY_HOME": str(tmp_path)})
    sink = engine_of(embedded).audit(embedded, store)
    assert not isinstance(sink, PgAuditSink)
    sink.close()


@pytest.mark.postgres
def test_a_row_the_database_cannot_take_fails_closed() -> None:
    server = start_postgres()  # its own server: this test stops it
    try:
        with PostgresStore(server.create_database(), timeout=2.0) as store:
            sink = PgAuditSink(store, timeout=2.0)
            sink.write({"phase": "call", "caller": "ann"})
            assert sink.writable()
            server.stop("fast")
            assert not sink.writable()
            with pytest.raises(AuditUnavailable) as info:
                sink.write({"phase": "call", "caller": "ann"})
            assert server.password not in info.value.message
            server.start()
            wait_for(sink.writable, "the pool reconnecting after PostgreSQL came back")
            assert sink.write({"phase": "call", "caller": "ann"})["seq"] == 2  # recovered, same chain
            assert PgAuditReader(store).verify().ok
            sink.close()
            with pytest.raises(AuditUnavailable):
                sink.write({"phase": "call"})
    finally:
        discard(server)


def _gateway(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=False)


def test_audit_cli_reads_the_table(store: PostgresStore, pg_server: PgServer, pg_url: str,
                                   tmp_path: Path) -> None:
    sink = PgAuditSink(store)
    for tool in ("list_vms", "power_off_vm", "list_vms"):
        sink.write({"phase": "call", "tool": tool, "caller": "ann", "target": "vc1"})
    env = {"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url}
    verified = _gateway("audit", "verify", env=env)
    assert verified.returncode == 0, verified.stderr
    assert "OK" in verified.stdout and "3 rows" in verified.stdout
    shown = _gateway("audit", "log", "--json", "--tool", "list_vms", env=env)
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["seq"] for line in shown.stdout.splitlines()] == [1, 3]
    counted = _gateway("audit", "stats", "--json", env=env)
    assert json.loads(counted.stdout)["by_tool"] == {"list_vms": 2, "power_off_vm": 1}
    for done in (verified, shown, counted):
        assert pg_server.password not in done.stdout + done.stderr
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE audit_rows SET body = replace(body, 'ann', 'eve') WHERE seq = 2")
    broken = _gateway("audit", "verify", env=env)
    assert broken.returncode == 1 and "BROKEN" in broken.stderr and "BROKEN" not in broken.stdout


def _signed_table(store: PostgresStore, pg_url: str, tmp_path: Path, rows: int) -> dict[str, str]:
    """``rows`` rows written by the sink a replica opens (the engine table's ``audit``), closed (a last
    checkpoint); returns the environment `gateway audit` needs to read them with the same signing key."""
    env = {"GATEWAY_HOME": str(tmp_path / "home"), "GATEWAY_DATABASE_URL": pg_url,
           "GATEWAY_AUDIT_SIGNING_KEY_FILE": str(tmp_path / "secret" / "signing.key")}
    sink = engine_of(settings := Settings.from_env(env)).audit(settings, store)
    for i in range(rows):
        sink.write({"phase": "call", "tool": "list_vms", "caller": "ann", "n": i})
    sink.close()
    return env


def test_verify_checkpoint_passes_on_an_intact_table(store: PostgresStore, pg_url: str,
                                                     tmp_path: Path) -> None:
    env = _signed_table(store, pg_url, tmp_path, 5)
    verified = _gateway("audit", "verify", "--checkpoint", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "checkpoints: OK" in verified.stdout and "newest seq 5" in verified.stdout
    assert (tmp_path / "secret" / "signing.key").is_file(), "the key named by the setting signs"
    assert not (tmp_path / "home" / "audit-signing.key").exists()


def test_verify_checkpoint_detects_a_cut_tail(store: PostgresStore, pg_url: str, tmp_path: Path) -> None:
    env = _signed_table(store, pg_url, tmp_path, 5)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM audit_rows WHERE seq >= 4")  # the chain of rows 1..3 is still intact
    assert _gateway("audit", "verify", env=env).returncode == 0, "the chain alone cannot see a cut tail"
    verified = _gateway("audit", "verify", "--checkpoint", env=env)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "cut_tail" in verified.stderr and "seq 5 was signed" in verified.stderr


def test_verify_checkpoint_detects_a_rewritten_history(store: PostgresStore, pg_url: str,
                                                      tmp_path: Path) -> None:
    env = _signed_table(store, pg_url, tmp_path, 5)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # row 2 changed and every later row re-chained
        prev = conn.execute("SELECT hash FROM audit_rows WHERE seq = 1").fetchone()[0]
        for (body,) in conn.execute("SELECT body FROM audit_rows WHERE seq >= 2 ORDER BY seq").fetchall():
            row = json.loads(body)
            row["caller"] = "mallory" if row["seq"] == 2 else row["caller"]
            row["prev"] = prev
            row["hash"] = prev = row_hash(row)
            conn.execute("UPDATE audit_rows SET body = %s, hash = %s, caller = %s WHERE seq = %s",
                         (json.dumps(row), row["hash"], row["caller"], row["seq"]))
    assert _gateway("audit", "verify", env=env).returncode == 0, "the chain alone cannot see a rewrite"
    verified = _gateway("audit", "verify", "--checkpoint", env=env)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert "rewritten" in verified.stderr and "the row at seq 5 is not the one signed" in verified.stderr


def _checkpoint_seqs(pg_url: str) -> list[int]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return [int(r[0]) for r in conn.execute("SELECT seq FROM audit_checkpoints ORDER BY id").fetchall()]


def test_sink_signs_every_n_rows_and_on_close(store: PostgresStore, pg_url: str, tmp_path: Path) -> None:
    sink = PgAuditSink(store, key_file=tmp_path / "signing.key", checkpoint_rows=2, checkpoint_seconds=3600)
    for i in range(5):
        sink.write({"phase": "call", "caller": "ann", "n": i})
    assert _checkpoint_seqs(pg_url) == [2, 4]
    sink.close()
    assert _checkpoint_seqs(pg_url) == [2, 4, 5]
    assert sink.stats()["checkpoints"] == 3 and sink.stats()["checkpoint_failures"] == 0
    report = PgAuditReader(store).verify(checkpoints=True)
    assert report.ok and report.checkpoint is not None and report.checkpoint.checked == 3


def test_a_failed_checkpoint_is_counted_and_never_fails_the_row(store: PostgresStore, pg_url: str,
                                                               tmp_path: Path) -> None:
    key_file = tmp_path / "signing.key"
    key_file.write_text("not a key")
    key_file.chmod(0o644)  # refused: readable by others
    sink = PgAuditSink(store, key_file=key_file, checkpoint_rows=1)
    assert sink.write({"phase": "call", "caller": "ann"})["seq"] == 1
    assert sink.stats()["checkpoint_failures"] == 1 and _checkpoint_seqs(pg_url) == []
    sink.close()
    closing = PgAuditSink(store, key_file=key_file, checkpoint_rows=10)  # only the closing one is due
    assert closing.write({"phase": "call", "caller": "ann"})["seq"] == 2
    assert closing.stats()["checkpoint_failures"] == 0
    closing.close()  # logged and counted, not raised
    assert closing.stats()["checkpoint_failures"] == 1 and _checkpoint_seqs(pg_url) == []
    report = PgAuditReader(store).verify(checkpoints=True)
    assert report.rows == 2 and report.checkpoint is not None
    assert report.checkpoint.first_fault is not None and report.checkpoint.first_fault.reason == "missing"


def test_replicas_sharing_one_key_verify_against_it_pinned(store: PostgresStore, pg_url: str,
                                                           tmp_path: Path) -> None:
    from gateway.audit.signing import load_or_create_signing_key

    key_file = tmp_path / "signing.key"
    replicas = [PgAuditSink(store, key_file=key_file, checkpoint_rows=3) for _ in range(2)]
    for i in range(6):
        replicas[i % 2].write({"phase": "call", "caller": f"replica-{i % 2}"})
    for sink in replicas:
        sink.close()
    pinned = load_or_create_signing_key(key_file).public_key()
    report = PgAuditReader(store).verify(checkpoints=True, public_key=pinned)
    assert report.ok and report.checkpoint is not None and report.checkpoint.checked >= 2
    other = load_or_create_signing_key(tmp_path / "other.key").public_key()
    wrong = PgAuditReader(store).verify(checkpoints=True, public_key=other)
    assert wrong.checkpoint is not None and wrong.checkpoint.first_fault is not None
    assert wrong.checkpoint.first_fault.reason == "key_mismatch"


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, "home/audit-signing.key"),
    ({"GATEWAY_AUDIT_SIGNING_KEY_FILE": "{tmp}/secret/key.pem"}, "secret/key.pem"),
])
def test_the_signing_key_setting(tmp_path: Path, environ: dict[str, str], expected: str) -> None:
    env = {k: v.format(tmp=tmp_path) for k, v in environ.items()}
    settings = Settings.from_env({**env, "GATEWAY_HOME": str(tmp_path / "home")})
    assert settings.signing_key_file == tmp_path / expected


@pytest.mark.anyio
async def test_a_gateway_shutting_down_signs_the_head_on_postgres(pg_url: str, tmp_path: Path,
                                                                anyio_backend: str) -> None:
    """The closing checkpoint needs the database: the gateway closes its audit sink before its store."""
    from gateway.server.runtime import Gateway

    (tmp_path / "targets.yaml").write_text("targets: []\n")
    gw = Gateway.build(Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url}))
    gw.audit.write({"phase": "call", "caller": "ann"})
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the configuration loads are rows too
        head = conn.execute("SELECT max(seq) FROM audit_rows").fetchone()
    await gw.close()
    assert head is not None and _checkpoint_seqs(pg_url)[-1:] == [int(head[0])]


def test_a_grouped_row_commits_without_waiting_for_its_wal_flush_and_chains_with_the_others(
        store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    statements: list[str] = []
    execute = psycopg.Connection.execute

    def spy(self: psycopg.Connection, query: object, *args: object, **kwargs: object) -> object:
        statements.append(str(query))
        return execute(self, query, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    sink = PgAuditSink(store)
    first = sink.write_grouped({"phase": "call", "tool": "list_vms", "caller": "ann"})
    grouped = list(statements)
    statements.clear()
    second = sink.write({"phase": "executing", "tool": "power_off_vm", "caller": "ann"})
    assert "SET LOCAL synchronous_commit = off" in grouped, "the read's commit does not wait for the flush"
    assert not any("synchronous_commit" in s for s in statements), "a change's commit waits for it"
    with psycopg.connect(pg_url, autocommit=True) as conn:  # committed: another connection sees it
        seqs = [r[0] for r in conn.execute("SELECT seq FROM audit_rows ORDER BY seq").fetchall()]
    assert seqs == [1, 2] and second["prev"] == first["hash"]
    assert PgAuditReader(store).verify().ok
