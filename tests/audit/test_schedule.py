"""Checkpoints on time: a server that gets no more calls still signs its newest audit rows within
GATEWAY_AUDIT_CHECKPOINT_SECONDS (the real `gateway serve`, on the file and on real PostgreSQL), tells
the witnesses, stops the timer on shutdown, and replicas sharing one chain never sign one tree size
twice; a bad interval is a startup error naming the variable."""

from __future__ import annotations

import math
import ssl
import threading
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.httpserver import Command, https_argv, run_serve
from support.postgres import wait_for
from support.simulator import Simulator, write_targets

from gateway.audit.file_sink import AuditSink
from gateway.audit.note import parse_checkpoint
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.proofs import open_signed
from gateway.audit.readers import AuditReader, FileAuditReader
from gateway.audit.schedule import CheckpointTimer, checkpoint_interval
from gateway.audit.signing import load_or_create_signing_key
from gateway.audit.witness import read_witness
from gateway.errors import ConfigError
from gateway.server.edge.tls import create_certificate
from gateway.settings import Settings
from gateway.store.postgres import PostgresStore

#: the done-means figures of issue 33: a 5 s interval, every row signed 15 s after the last one
INTERVAL = "5"
COVERED_WITHIN = 15.0


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf, 86400.5, 1e9, 0.01])
def test_a_bad_interval_is_a_startup_error_naming_the_variable(value: float, tmp_path: Path) -> None:
    settings = replace(Settings.from_env({"GATEWAY_HOME": str(tmp_path)}), audit_checkpoint_seconds=value)
    with pytest.raises(ConfigError, match="GATEWAY_AUDIT_CHECKPOINT_SECONDS"):
        checkpoint_interval(settings)
    with pytest.raises(ConfigError, match="GATEWAY_AUDIT_CHECKPOINT_SECONDS"):
        AuditSink.for_settings(settings)


@pytest.mark.parametrize("value", [0.1, 5.0, 300.0, 86400.0])
def test_a_sane_interval_is_the_sinks_schedule(value: float, tmp_path: Path) -> None:
    settings = replace(Settings.from_env({"GATEWAY_HOME": str(tmp_path)}), audit_checkpoint_seconds=value)
    assert checkpoint_interval(settings) == value
    with AuditSink.for_settings(settings) as sink:
        assert sink.checkpoint_seconds == value


def test_the_environment_value_reaches_the_sink(tmp_path: Path) -> None:
    settings = Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_AUDIT_CHECKPOINT_SECONDS": "7"})
    with AuditSink.for_settings(settings) as sink:
        assert sink.checkpoint_seconds == 7.0


# ------------------------------------------------------------------------ the real server, no more calls


def _start(tmp: Path, sim: Simulator, token: str | None = None,
           **extra: str) -> tuple[Command, Path, Path, str]:
    """`gateway serve` (HTTPS) with a 5 s checkpoint interval and a witness directory; returns the
    command, its home, the witness directory and the caller's token (``token``, or the bootstrap one
    this server wrote) once it listens and has served one call."""
    tmp.mkdir(parents=True, exist_ok=True)
    home, witness = tmp / "home", tmp / "witness"
    env = write_targets(tmp / "targets.yaml", {"vc1": sim})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml"),
                "GATEWAY_AUDIT_WITNESS_DIR": str(witness),
                "GATEWAY_AUDIT_CHECKPOINT_SECONDS": INTERVAL, **extra})
    if token is None:
        env["GATEWAY_BOOTSTRAP_TOKEN_FILE"] = str(tmp / "token")
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp, env, *https_argv(cert))
    base = command.base()
    token = token or (tmp / "token").read_text().strip()
    tls = ssl.create_default_context(cafile=str(cert.cert))
    # the last call: none after it
    answer = httpx2.get(f"{base}/readyz", headers={"Authorization": f"Bearer {token}"}, verify=tls,
                        timeout=30)
    assert answer.status_code in (200, 503), answer.text
    return command, home, witness, token


def _covers_every_row(reader: AuditReader) -> dict[str, Any] | None:
    """The newest checkpoint when it signs the chain's head and the tree of all its rows, else None."""
    rows, entries = reader.rows(), reader.checkpoints()
    if not rows or not entries:
        return None
    newest = max(entries, key=lambda e: int(e["seq"]))
    head = rows[-1]
    if (newest["seq"], newest["hash"], newest.get("tree_size")) == (head["seq"], head["hash"], len(rows)):
        return newest
    return None


def _assert_signed_and_witnessed(entry: dict[str, Any], key_file: Path, witness: Path) -> None:
    key = load_or_create_signing_key(key_file).public_key()
    checkpoint = open_signed(entry["note"], key)
    assert checkpoint.size == entry["tree_size"]
    sizes = [c.size for _, note in read_witness(witness) if (c := parse_checkpoint(note)) is not None]
    assert entry["tree_size"] in sizes, f"the witness never heard of tree size {entry['tree_size']}: {sizes}"


def _wait_covered(reader: AuditReader, command: Command) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def covered() -> bool:
        assert command.process.poll() is None, command.output()
        entry = _covers_every_row(reader)
        found[:] = [entry] if entry is not None else []
        return bool(found)

    wait_for(covered, "a signed checkpoint covering every row", COVERED_WITHIN)
    return found[0]


def test_a_quiet_file_server_signs_its_tail_on_time(sim_vc1: Simulator, tmp_path: Path) -> None:
    command, home, witness, _ = _start(tmp_path, sim_vc1)
    try:
        entry = _wait_covered(FileAuditReader(home / "audit.jsonl"), command)
        _assert_signed_and_witnessed(entry, home / "audit-signing.key", witness)
    finally:
        assert command.stop() == 0, command.output()
    assert "did not stop" not in command.output()


def test_a_quiet_postgres_server_signs_its_tail_on_time(sim_vc1: Simulator, pg_url: str,
                                                        tmp_path: Path) -> None:
    command, home, witness, _ = _start(tmp_path, sim_vc1, GATEWAY_DATABASE_URL=pg_url)
    try:
        with closing(PostgresStore(pg_url)) as store:
            entry = _wait_covered(PgAuditReader(store), command)
        _assert_signed_and_witnessed(entry, home / "audit-signing.key", witness)
    finally:
        assert command.stop() == 0, command.output()


def _duplicates(url: str) -> list[dict[str, Any]]:
    with closing(PostgresStore(url)) as store, store.pool.connection() as conn:
        found = conn.execute("SELECT seq, count(*) AS n FROM audit_checkpoints GROUP BY seq "
                             "HAVING count(*) > 1").fetchall()
    return [dict(r) for r in found]


def test_two_postgres_replicas_sign_each_tree_size_once(sim_vc1: Simulator, pg_url: str,
                                                        tmp_path: Path) -> None:
    """Both replicas' timers race for every new head (1 s ticks); each head is signed once."""
    key_file = tmp_path / "signing.key"
    shared = {"GATEWAY_DATABASE_URL": pg_url, "GATEWAY_AUDIT_SIGNING_KEY_FILE": str(key_file),
              "GATEWAY_AUDIT_CHECKPOINT_SECONDS": "1"}
    commands: list[Command] = []
    try:
        token: str | None = None
        for name in "ab":
            command, _, _, token = _start(tmp_path / name, sim_vc1, token, **shared)
            commands.append(command)
        with closing(PostgresStore(pg_url)) as store:
            reader = PgAuditReader(store)
            writer = PgAuditSink(store)  # a third writer without a key: rows only, signed by the replicas
            for burst in range(5):
                for i in range(3):
                    writer.write({"phase": "call", "tool": "list_vms", "caller": "test", "args": {"i": i,
                                  "burst": burst}})
                _wait_covered(reader, commands[0])
            assert len(reader.checkpoints()) >= 5
            assert reader.verify(checkpoints=True,
                                 public_key=load_or_create_signing_key(key_file).public_key()).ok
        assert _duplicates(pg_url) == []
    finally:
        for command in commands:
            assert command.stop() == 0, command.output()
    assert _duplicates(pg_url) == [], "the closing checkpoints signed a tree size twice"


# ------------------------------------------------------------------------ the sinks' guard, pure threads


def test_concurrent_postgres_checkpoints_sign_one_head_once(pg_url: str, tmp_path: Path) -> None:
    """Eight threads on two sinks (two pools: two replicas) ask for a checkpoint of each new head."""
    stores = [PostgresStore(pg_url) for _ in range(2)]
    sinks = [PgAuditSink(s, key_file=tmp_path / "signing.key", checkpoint_rows=10_000) for s in stores]
    try:
        for round_ in range(5):
            sinks[round_ % 2].write({"phase": "call", "caller": "ann", "args": {"round": round_}})
            barrier = threading.Barrier(8)
            written: list[dict[str, Any] | None] = []

            def ask(sink: PgAuditSink, barrier: threading.Barrier, written: list[Any]) -> None:
                barrier.wait(30)
                written.append(sink.checkpoint())

            threads = [threading.Thread(target=ask, args=(sinks[n % 2], barrier, written)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert sum(entry is not None for entry in written) == 1, written
        assert _duplicates(pg_url) == []
    finally:
        for sink, store in zip(sinks, stores, strict=True):
            sink.close()
            store.close()
    assert _duplicates(pg_url) == []


def test_file_checkpoint_of_a_signed_head_writes_nothing(tmp_path: Path) -> None:
    """Two processes' sinks on one file (two sinks here): a head already signed is not signed again."""
    path = tmp_path / "audit.jsonl"
    key = tmp_path / "k.key"
    with AuditSink(path, key_file=key) as one, AuditSink(path, key_file=key) as two:
        one.write({"phase": "call", "caller": "ann"})
        assert one.checkpoint() is not None
        assert two.checkpoint() is None and one.checkpoint() is None
        two.write({"phase": "call", "caller": "bob"})
        assert two.checkpoint() is not None and one.checkpoint() is None
    seqs = [e["seq"] for e in FileAuditReader(path).checkpoints()]
    assert seqs == sorted(set(seqs)) == [1, 2]


def test_the_timer_signs_without_rows_arriving_and_stops(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditSink(path, key_file=tmp_path / "k.key") as sink:
        sink.write({"phase": "call", "caller": "ann"})
        timer = CheckpointTimer(sink, 0.2).start()
        try:
            wait_for(lambda: timer.written >= 1, "the timer's checkpoint", 10)
            wait_for(lambda: timer.ticks >= timer.written + 2, "two more ticks", 10)
            assert timer.written == 1, "a signed head is not signed again"
        finally:
            timer.stop()
        assert not timer.running
    assert [e["seq"] for e in FileAuditReader(path).checkpoints()] == [1]


def test_the_timer_survives_a_failing_sink() -> None:
    class Failing:
        calls = 0

        def checkpoint(self, *, timeout: float | None = None) -> dict[str, Any] | None:
            self.calls += 1
            from gateway.errors import AuditUnavailable

            raise AuditUnavailable("the disk is gone")

    sink = Failing()
    timer = CheckpointTimer(sink, 0.1).start()
    try:
        wait_for(lambda: timer.failures >= 3, "three failed ticks", 10)
        assert timer.running
    finally:
        timer.stop()
    assert not timer.running and sink.calls == timer.ticks


def test_the_servers_lifespan_starts_the_timer_and_stops_it(sim_vc1: Simulator, tmp_path: Path) -> None:
    """The real HTTPS server (uvicorn, in this process): the timer runs while it serves, signs the
    rows its start wrote without any call, and its thread is gone once the server stopped."""
    from support.httpserver import build_gateway, serve

    gateway = build_gateway(tmp_path, sim_vc1, audit_checkpoint_seconds=0.5)
    served = serve(tmp_path, gateway)
    try:
        timer = gateway.checkpoint_timer
        assert timer is not None and timer.running and timer.seconds == 0.5
        reader = gateway.backends.reader
        wait_for(lambda: _covers_every_row(reader) is not None, "a checkpoint of the start's rows", 10)
    finally:
        served.stop()
    assert not timer.running, "the checkpoint timer outlived the server"


def test_serve_refuses_to_start_with_a_bad_interval(sim_vc1: Simulator, tmp_path: Path) -> None:
    """The real `gateway serve`: a clear startup error naming the variable, no traceback."""
    home = tmp_path / "home"
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "GATEWAY_AUDIT_CHECKPOINT_SECONDS": "-5"})
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    code = command.process.wait(60)
    output = command.output()
    assert code != 0, output
    assert "GATEWAY_AUDIT_CHECKPOINT_SECONDS=-5" in output and "Traceback" not in output, output


def test_the_postgres_sink_takes_the_interval_from_the_settings(pg_url: str, tmp_path: Path) -> None:
    base = Settings.from_env({"GATEWAY_HOME": str(tmp_path)})
    with closing(PostgresStore(pg_url)) as store:
        with PgAuditSink.for_settings(store, replace(base, audit_checkpoint_seconds=5.0)) as sink:
            assert sink.checkpoint_seconds == 5.0 and sink.key_file == base.signing_key_file
        with pytest.raises(ConfigError, match="GATEWAY_AUDIT_CHECKPOINT_SECONDS"):
            PgAuditSink.for_settings(store, replace(base, audit_checkpoint_seconds=0.0))
