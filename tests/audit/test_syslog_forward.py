"""Audit rows forwarded to a SIEM (``gateway.audit.syslog_forward``): RFC 5424 framing as plain table
tests, then the real thing against Debian's rsyslogd on loopback with TLS (tests/support/rsyslog.py): a row
arrives with its seq and hash, an outage loses nothing the bounded backlog held (the drops beyond it
counted in /metrics), and no write waits on a dead receiver."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.rsyslog import Rsyslog
from support.simulator import complete_rules_text

from gateway.audit.file_sink import AuditSink
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.query import read_rows
from gateway.audit.syslog_config import SyslogConfig
from gateway.audit.syslog_forward import Forwarder, message, octet_counted, sd_escape
from gateway.server.base.audit_trail import AuditTrail, forward_to_syslog
from gateway.server.base.metrics import Metrics
from gateway.server.edge.tls import create_certificate
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.store.postgres import PostgresStore

CONFIG = SyslogConfig(host="127.0.0.1", hostname="gw1")
ROW: dict[str, Any] = {"ts": "2026-12-01T12:00:00.123Z", "seq": 7, "phase": "call", "tool": "list_vms",
                       "prev": "a" * 64, "hash": "b" * 64}


# ------------------------------------------------------------------------------------------ framing


def test_a_row_is_one_rfc5424_message_with_the_chain_in_structured_data() -> None:
    text = message(ROW, CONFIG, "4242").decode()
    line = json.dumps(ROW, separators=(",", ":"))
    leaf = base64.b64encode(hashlib.sha256(b"\x00" + line.encode()).digest()).decode()
    assert text == (f'<110>1 2026-12-01T12:00:00.123Z gw1 vsphere-mcp-gateway 4242 call '
                    f'[audit@32473 seq="7" hash="{"b" * 64}" prev="{"a" * 64}" leaf="6" leaf_hash="{leaf}"] '
                    ) + line


@pytest.mark.parametrize(("row", "pri", "msgid"), [
    (ROW, "<110>", "call"),  # facility 13 (log audit) * 8 + info
    ({**ROW, "error_code": "DENIED"}, "<109>", "call"),  # a refusal or failure: notice
    ({**ROW, "phase": "has space"}, "<110>", "-"),  # MSGID is printable ASCII without spaces, or -
    ({**ROW, "phase": "p" * 33}, "<110>", "-"),  # ... at most 32 characters
    ({k: v for k, v in ROW.items() if k != "phase"}, "<110>", "-"),
])
def test_priority_and_msgid(row: dict[str, Any], pri: str, msgid: str) -> None:
    fields = message(row, CONFIG, "1").decode().split(" ")
    assert fields[0].startswith(pri) and fields[5] == msgid


def test_a_malformed_timestamp_is_the_nil_value() -> None:
    assert message({**ROW, "ts": "yesterday"}, CONFIG, "1").decode().split(" ")[1] == "-"


@pytest.mark.parametrize(("raw", "escaped"), [
    ('a"b', 'a\\"b'), ("a]b", "a\\]b"), ("a\\b", "a\\\\b"), ("plain", "plain"),
])
def test_param_values_are_escaped(raw: str, escaped: str) -> None:
    assert sd_escape(raw) == escaped


def test_octet_counting_counts_bytes_not_characters() -> None:
    msg = message({**ROW, "caller": "zoë"}, CONFIG, "1")
    framed = octet_counted(msg)
    length, _, rest = framed.partition(b" ")
    assert int(length) == len(rest) == len(msg) and len(msg) > len(msg.decode())


def test_a_row_is_sent_as_stored_with_its_text_in_utf8() -> None:
    msg = message({**ROW, "caller": "zoë"}, CONFIG, "1")
    assert msg.endswith(json.dumps({**ROW, "caller": "zoë"}, separators=(",", ":"),
                                   ensure_ascii=False).encode())


# ------------------------------------------------------------------------------- against rsyslogd


@pytest.fixture
def siem(tmp_path: Path) -> Iterator[Rsyslog]:
    server = Rsyslog(tmp_path / "siem").start()
    try:
        yield server
    finally:
        server.stop()


def _trail(tmp_path: Path, config: SyslogConfig) -> tuple[AuditTrail, Forwarder]:
    trail = AuditTrail(AuditSink(tmp_path / "audit.jsonl"), tmp_path / "audit.jsonl")
    forwarder = trail.forward_to(Forwarder(config).start())
    return trail, forwarder


def _config(siem: Rsyslog, **options: Any) -> SyslogConfig:
    return replace(SyslogConfig(host="127.0.0.1", port=siem.port, ca_file=siem.ca_file, hostname="gw1"),
                   **options)


def _chain(received: dict[str, Any]) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', received["sd"]))


def _seqs(messages: list[dict[str, Any]]) -> set[int]:
    return {int(_chain(m)["seq"]) for m in messages}


def test_a_written_row_arrives_at_rsyslog_with_its_seq_and_hash(tmp_path: Path, siem: Rsyslog) -> None:
    trail, forwarder = _trail(tmp_path, _config(siem))
    try:
        trail.write_row({"phase": "call", "tool": "list_vms", "caller": "ann",
                         "args": {"password": "hunter2-secret"}})
        got = siem.wait_for(lambda m: len(m) >= 1)
    finally:
        forwarder.close()
    stored = read_rows(tmp_path / "audit.jsonl")[0]
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    line = next(raw for raw in lines if json.loads(raw) == stored)
    leaf = base64.b64encode(hashlib.sha256(b"\x00" + line).digest()).decode()  # RFC 6962 leaf of the line
    assert _chain(got[0]) == {"seq": str(stored["seq"]), "hash": stored["hash"], "prev": stored["prev"],
                              "leaf": str(stored["seq"] - 1), "leaf_hash": leaf}
    assert json.loads(got[0]["msg"]) == stored  # the row exactly as the audit log holds it
    assert "hunter2-secret" not in json.dumps(got)  # redacted by the sink before it was sent
    assert (got[0]["app"], got[0]["hostname"], got[0]["msgid"]) == ("vsphere-mcp-gateway", "gw1", "call")


def _families(forwarder: Forwarder) -> str:
    metrics = Metrics()
    metrics.add_collector("syslog", forwarder.families)
    return metrics.render()


def _poll(condition: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def test_an_outage_loses_nothing_the_backlog_held(tmp_path: Path, siem: Rsyslog) -> None:
    trail, forwarder = _trail(tmp_path, _config(siem, backlog=5, max_backoff_seconds=0.2))
    try:
        trail.write_row({"phase": "call", "n": 0})
        siem.wait_for(lambda m: _seqs(m) == {1})
        siem.stop()
        for n in range(1, 9):  # 8 rows while the receiver is down; the backlog holds 5
            trail.write_row({"phase": "call", "n": n})
        _poll(lambda: forwarder.stats()["dropped"] == 3)
        text = _families(forwarder)
        for line in ("gateway_syslog_dropped_total 3.0", "gateway_syslog_backlog 5.0",
                     "gateway_syslog_backlog_limit 5.0", "gateway_syslog_connected 0.0",
                     "gateway_syslog_forwarded_total 1.0"):
            assert line in text, text
        siem.start()
        got = siem.wait_for(lambda m: _seqs(m) >= {5, 6, 7, 8, 9})
        _poll(lambda: forwarder.stats()["backlog"] == 0)
    finally:
        forwarder.close()
    stored = {row["seq"]: row for row in read_rows(tmp_path / "audit.jsonl")}
    assert _seqs(got) == {1, 5, 6, 7, 8, 9}  # the oldest three beyond the bound were the ones dropped
    for received in got:
        chain = _chain(received)
        assert chain["hash"] == stored[int(chain["seq"])]["hash"]
    assert "gateway_syslog_forwarded_total 6.0" in _families(forwarder)


def test_no_write_waits_on_a_receiver_that_never_answers(tmp_path: Path, silent_port: int) -> None:
    # the TCP handshake completes in the kernel, the TLS handshake never does: the sender is stuck
    # for connect_timeout_seconds; the writes must not be
    config = SyslogConfig(host="127.0.0.1", port=silent_port, ca_file=None, connect_timeout_seconds=60.0)
    trail, forwarder = _trail(tmp_path, config)
    try:
        started = time.monotonic()
        for n in range(50):
            trail.write_row({"phase": "call", "n": n})
        elapsed = time.monotonic() - started
        stats = forwarder.stats()
    finally:
        forwarder.close(drain_seconds=0.1)
    assert elapsed < 30.0, f"50 writes took {elapsed:.1f}s: a write waited on the receiver"
    assert len(read_rows(tmp_path / "audit.jsonl")) == 50
    assert (stats["forwarded"], stats["backlog"], stats["connected"]) == (0, 50, 0)
    assert forwarder.stats()["dropped"] == 50  # left at shutdown: counted, never silent


def test_syslog_yaml_forwards_the_gateway_trail_and_its_own_load(tmp_path: Path, siem: Rsyslog) -> None:
    path = tmp_path / "syslog.yaml"
    path.write_text(f"syslog:\n  host: 127.0.0.1\n  port: {siem.port}\n  ca_file: {siem.ca_file}\n"
                    "  server_name: localhost\n")
    trail = AuditTrail(AuditSink(tmp_path / "audit.jsonl"), tmp_path / "audit.jsonl")
    forwarder = forward_to_syslog(trail, path)
    assert forwarder is not None
    try:
        got = siem.wait_for(lambda m: len(m) >= 1)
    finally:
        forwarder.close()
    row = json.loads(got[0]["msg"])
    assert (row["phase"], row["file"], row["outcome"]) == ("config_reload", "syslog", "loaded")
    assert forward_to_syslog(trail, tmp_path / "absent.yaml") is None


def test_a_built_gateway_forwards_its_rows_and_shows_the_forwarder_in_metrics(
    tmp_path: Path, siem: Rsyslog
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "targets.yaml").write_text("targets:\n  - {name: vc1, host: 127.0.0.1, port: 9, "
                                       "credential_env_prefix: VC1}\n")
    (home / "rules.yaml").write_text(complete_rules_text("defaults: {read: allow}\n"))
    (home / "syslog.yaml").write_text(f"syslog:\n  host: 127.0.0.1\n  port: {siem.port}\n"
                                      f"  ca_file: {siem.ca_file}\n  hostname: gw-test\n")
    gateway = Gateway.build(Settings.from_env({"GATEWAY_HOME": str(home), "VC1_USER": "u",
                                               "VC1_PASSWORD": "p"}))
    try:
        written = {row["seq"] for row in read_rows(home / "audit.jsonl")}  # build() wrote these
        got = siem.wait_for(lambda m: _seqs(m) == written)  # every one arrives, and nothing else
        assert {"syslog", "targets", "rules"} <= {json.loads(m["msg"]).get("file") for m in got}
        assert {m["hostname"] for m in got} == {"gw-test"}
        _poll(lambda: "gateway_syslog_forwarded_total" in gateway.metrics.render())
        assert "gateway_syslog_connected 1.0" in gateway.metrics.render()
    finally:
        asyncio.run(gateway.close())
    assert gateway.trail.forwarder is not None and gateway.trail.forwarder.stats()["backlog"] == 0


def test_a_row_in_the_postgres_chain_arrives_with_its_seq_and_hash(pg_url: str, siem: Rsyslog) -> None:
    with PostgresStore(pg_url) as store:
        trail = AuditTrail(PgAuditSink(store), "the audit table")
        forwarder = trail.forward_to(Forwarder(_config(siem)).start())
        try:
            trail.write_row({"phase": "call", "tool": "list_vms"})
            trail.write_row({"phase": "call", "tool": "list_hosts"})
            got = siem.wait_for(lambda m: _seqs(m) == {1, 2})
        finally:
            forwarder.close()
        with psycopg.connect(pg_url) as conn:
            stored = {seq: json.loads(body) if isinstance(body, str) else body
                      for seq, body in conn.execute("SELECT seq, body FROM audit_rows")}
    for received in got:
        chain = _chain(received)
        row = stored[int(chain["seq"])]
        assert (chain["hash"], chain["prev"]) == (row["hash"], row["prev"])
        assert json.loads(received["msg"]) == row


def test_a_receiver_requiring_a_client_certificate_gets_the_rows_of_a_forwarder_with_one(
    tmp_path: Path
) -> None:
    client = create_certificate(tmp_path / "client", ["gateway-client"])
    siem = Rsyslog(tmp_path / "siem", client_ca=client.cert).start()
    try:
        without = Forwarder(_config(siem, connect_timeout_seconds=5.0)).start()
        without.offer({**ROW, "seq": 1})
        _poll(lambda: without.stats()["connect_failures"] + without.stats()["send_failures"] >= 1)
        without.close(drain_seconds=0.1)
        with_cert = Forwarder(_config(siem, client_cert_file=client.cert, client_key_file=client.key)).start()
        try:
            with_cert.offer({**ROW, "seq": 2})
            got = siem.wait_for(lambda m: 2 in _seqs(m))
        finally:
            with_cert.close()
    finally:
        siem.stop()
    assert _seqs(got) == {2}  # the forwarder without a certificate was refused


def test_rows_written_through_the_trail_as_a_sink_are_forwarded_too(tmp_path: Path, siem: Rsyslog) -> None:
    # the edge's refused-token rows and the web page's sign-in rows take the trail as their sink
    trail, forwarder = _trail(tmp_path, _config(siem))
    try:
        stored = trail.write({"phase": "token_refused", "caller": "-", "reason": "revoked", "count": 3})
        got = siem.wait_for(lambda m: len(m) >= 1)
    finally:
        forwarder.close()
    assert stored == read_rows(tmp_path / "audit.jsonl")[0]
    assert (got[0]["msgid"], _chain(got[0])["hash"]) == ("token_refused", stored["hash"])
