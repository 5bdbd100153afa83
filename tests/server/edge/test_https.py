"""The HTTPS server for real: uvicorn on loopback with a generated certificate, the real gateway in
front of a simulated vCenter, the SDK's client in both protocol revisions, and raw httpx2 requests
for the edge cases a well-behaved client never sends. Two mechanisms that need a call to behave on
cue (progress relay, an orderly stop around a call in progress) use a stand-in pipeline.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import (
    FAST_HASH,
    GATEWAY_MAIN,
    READER_ROLES,
    REPO,
    Served,
    audit_rows,
    build_gateway,
    https_argv,
    mcp_client,
    real_gateway,
    run_serve,
    serve,
)
from support.processes import free_port, unavailable
from support.simulator import MakeSimulator, Simulator, wait_until, write_targets

from gateway.answer import Answer
from gateway.audit.query import read_rows
from gateway.auth.tokens import Principal, TokenAuthenticator, create_token
from gateway.cli import serve as serve_cli
from gateway.cli import settings_from
from gateway.config import Target
from gateway.errors import ConfigError, InvalidArgument, NotFound
from gateway.server.base.metrics import Metrics
from gateway.server.edge.mcp import ProgressSink
from gateway.server.edge.middleware import EdgeConfig
from gateway.server.edge.tls import CertificatePaths, create_certificate
from gateway.server.runtime import Gateway
from gateway.store.sqlite import SqliteStore
from gateway.tools.spec import TARGETS, ToolSpec
from gateway.vocabulary import Category, Risk

pytestmark = pytest.mark.anyio
MODES = ("legacy", "2026-07-28")


# ---------------------------------------------------------------------------- gateways


READ = ToolSpec("list_vms", "List VMs.", Category.READ, Risk.LOW, params=(TARGETS,), target_mode="fanout")
SLOW = ToolSpec("slow_read", "Waits for the test.", Category.READ, Risk.LOW, params=(TARGETS,))


class _Role:
    all_targets = True
    tools = "*"  # an admin's: shown the targets' addresses


class StandInGateway:
    """A pipeline whose one slow tool waits for the test, and which reports progress when asked."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.metrics = Metrics(targets=["vc1"], tools=["list_vms", "slow_read"])
        self.authenticator = TokenAuthenticator(store)
        self.draining = False
        self.release = threading.Event()
        self.entered = threading.Event()

    @property
    def scheduler(self) -> StandInGateway:
        return self

    def stats(self) -> dict[str, dict[str, int]]:
        return {"vc1": {"queued": 0, "running": 0, "slots": 2, "sessions": 0, "in_use": 0}}

    @property
    def facts(self) -> StandInGateway:  # what the caller may see and use: this stand-in answers it
        return self

    @property
    def calls(self) -> StandInGateway:  # where tool calls are answered: this stand-in too
        return self

    @property
    def registry(self) -> dict[str, ToolSpec]:  # the tools by name (which may stream their answer)
        return {spec.name: spec for spec in (READ, SLOW)}

    def tools_of(self, role: Any) -> list[ToolSpec]:
        return [READ, SLOW]

    async def answer(self, principal: Principal, name: str, args: Mapping[str, Any] | None, *,
                     progress: ProgressSink | None = None, correlation_id: str | None = None) -> Answer:
        if name == "slow_read":
            self.entered.set()
            await anyio.to_thread.run_sync(self.release.wait, 30)
        elif name != "list_vms":
            raise NotFound(f"unknown tool '{name}'")
        if progress is not None:
            await progress(0.5, "halfway")
        self.metrics.observe_call(name, "vc1", "ok", 0.01)
        return Answer.of({"caller": principal.name, "surface": principal.surface,
                          "correlation_id": correlation_id, "vms": ["vm-a", "vm-b"]})

    async def role_now(self, principal: Principal) -> _Role:
        return _Role()

    def visible_targets(self, role: Any) -> list[Target]:
        return [Target("vc1", "vc1.example.com", "VC1")]

    def readiness(self) -> list[str]:
        return ["shutting down"] if self.draining else []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- a running server


@pytest.fixture(scope="module")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("https")
    running = serve(tmp, real_gateway(sim_vc1, tmp))
    yield running
    running.stop()


def stand_in(tmp: Path, **server_options: Any) -> Served:
    return serve(tmp, StandInGateway(SqliteStore(tmp / "state.db")), **server_options)


# ---------------------------------------------------------------------------- MCP over HTTPS


@pytest.mark.parametrize("mode", MODES)
async def test_client_lists_and_calls_in_both_protocol_revisions(
    served: Served, sim_vc1: Simulator, mode: str,
) -> None:
    request_id = f"it-{mode}"
    traced = {"X-Request-ID": request_id}
    async with mcp_client(served, served.tokens["alice"], mode, headers=traced) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        tools = (await client.list_tools()).tools
        result = await client.call_tool("list_vms", {"target": "vc1"})
    assert any(t.annotations and not t.annotations.read_only_hint for t in tools), "admin sees changes"
    assert not result.is_error, result.content
    assert all(name in json.dumps(answer_of(result)) for name in sim_vc1.vm_names())
    rows = [json.loads(line) for line in served.gateway.settings.audit_log.read_text().splitlines()]
    mine = [r for r in rows if r.get("correlation_id") == request_id]
    assert mine and mine[-1]["tool"] == "list_vms"
    assert (mine[-1]["caller"], mine[-1]["surface"]) == ("alice", "https")


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_takes_the_caller_as_the_edge_read_it_for_the_request(
    served: Served, mode: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The edge reads the token's record for every request; the call behind it uses that read (no
    second read of the store, no second trip off the event loop) on both revisions."""
    facts = served.gateway.facts
    past = time.time() - 60  # a roles file not written this instant (one just written is always read again)
    os.utime(served.gateway.settings.roles_file, (past, past))
    facts.roles.get("admin")  # loaded again: the roles in memory are the file as it is now
    read_again: list[str] = []
    store_read = facts.party

    def party(principal: Principal) -> Any:
        read_again.append(principal.name)
        return store_read(principal)

    monkeypatch.setattr(facts, "party", party)
    async with mcp_client(served, served.tokens["alice"], mode) as client:
        for tool, args in (("list_targets", {}), ("list_vms", {"target": "vc1"}), ("list_targets", {})):
            result = await client.call_tool(tool, args)
            assert not result.is_error, result.content
    assert read_again == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_roles_edit_applies_to_the_next_listing_and_is_read_off_the_event_loop(
    sim_vc1: Simulator, tmp_path: Path, mode: str,
) -> None:
    """carol's role cut to one tool: the next session's tools/list offers that tool only, and a call of
    another is refused, audited. The edit is read at once, in a worker thread: the suite's guard
    (tests/support/loop_reads.py) fails a test whose server reads roles.yaml on its event loop while
    serving a request, as tools/list, the instructions and the Mcp-Param schema look-up did."""
    running = serve(tmp_path, real_gateway(sim_vc1, tmp_path))
    try:
        async with mcp_client(running, running.tokens["carol"], mode) as before:
            offered = {t.name for t in (await before.list_tools()).tools}
        roles = running.gateway.settings.roles_file
        roles.write_text(READER_ROLES.replace("tools: read", "tools: [list_targets]"))
        async with mcp_client(running, running.tokens["carol"], mode) as after:
            now_offered = {t.name for t in (await after.list_tools()).tools}
            refused = await after.call_tool("list_vms", {"target": "vc1"})
        rows = audit_rows(running.gateway)
    finally:
        running.stop()
        await running.gateway.close()
    assert {"list_targets", "list_vms"} <= offered
    assert now_offered == {"list_targets"}
    assert refused.is_error and answer_of(refused)["error"]["code"] == "not_found", refused.content
    (row,) = [r for r in rows if r.get("tool") == "list_vms"]
    assert (row["phase"], row["caller"], row["decision"]["rule"]) == ("denied", "carol", "role:vc1-reader")


async def test_a_reader_is_offered_read_tools_only(served: Served) -> None:
    async with mcp_client(served, served.tokens["bob"], "legacy") as reader:
        tools = (await reader.list_tools()).tools
        refused = await reader.call_tool("power_off_vm", {"target": "vc1", "vm": "DC0_H0_VM0"})
    assert tools and all(t.annotations and t.annotations.read_only_hint for t in tools)
    assert refused.is_error and answer_of(refused)["error"]["code"] == "not_found"


async def test_target_addresses_are_shown_only_to_roles_with_every_target(
    served: Served, sim_vc1: Simulator,
) -> None:
    async with mcp_client(served, served.tokens["alice"], "legacy") as admin, \
            mcp_client(served, served.tokens["carol"], "legacy") as narrow:
        guides = {"admin": admin.instructions or "", "narrow": narrow.instructions or ""}
    assert f"vc1 ({sim_vc1.address})" in guides["admin"]
    assert "confirm_action" in guides["narrow"] and sim_vc1.address not in guides["narrow"]


@pytest.mark.parametrize("mode", MODES)
async def test_progress_reaches_the_client_in_both_revisions(tmp_path: Path, mode: str) -> None:
    reported: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reported.append((progress, total, message))

    running = stand_in(tmp_path)
    try:
        async with mcp_client(running, running.tokens["alice"], mode) as client:
            quiet = await client.call_tool("list_vms", {"target": "vc1"})
            result = await client.call_tool("list_vms", {"target": "vc1"}, progress_callback=on_progress)
    finally:
        running.stop()
    assert not quiet.is_error and not result.is_error
    assert reported == [(0.5, 1.0, "halfway")]
    assert answer_of(result)["caller"] == "alice"


async def _initialize(http: httpx2.AsyncClient) -> str:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "1"}}}
    response = await http.post("/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 200, response.text
    session: str = response.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    headers = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": session,
               "MCP-Protocol-Version": "2025-11-25"}
    assert (await http.post("/mcp", json=note, headers=headers)).status_code == 202
    return session


async def test_a_session_belongs_to_the_token_that_opened_it(served: Served) -> None:
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    async with served.http(served.tokens["alice"]) as alice, served.http(served.tokens["bob"]) as bob:
        session = await _initialize(alice)
        headers = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": session,
                   "MCP-Protocol-Version": "2025-11-25"}
        stolen = await bob.post("/mcp", json=listing, headers=headers)
        own = await alice.post("/mcp", json=listing, headers=headers)
        assert stolen.status_code == 404
        assert own.status_code == 200 and "list_vms" in own.text
        assert (await bob.delete("/mcp", headers=headers)).status_code == 404
        assert (await alice.delete("/mcp", headers=headers)).status_code == 200


# ---------------------------------------------------------------------------- the edge on the wire


async def test_no_or_bad_token_is_401_with_a_bearer_challenge(served: Served) -> None:
    async with served.http() as anonymous, served.http("gwt_aaaaaaaaaaaa_" + "A" * 43) as forged:
        missing = await anonymous.post("/mcp", json={})
        wrong = await forged.post("/mcp", json={})
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer ")
    assert wrong.status_code == 401 and 'error="invalid_token"' in wrong.headers["www-authenticate"]


async def test_failures_from_one_address_throttle_it(served: Served) -> None:
    # 127.0.0.2 is loopback too; throttling it leaves the other tests' 127.0.0.1 alone
    transport = httpx2.AsyncHTTPTransport(verify=served.tls(), local_address="127.0.0.2")
    async with httpx2.AsyncClient(base_url=served.base, transport=transport) as client:
        statuses = []
        for _ in range(15):
            response = await client.get("/metrics", headers={"Authorization": "Bearer gwt_nonsense"})
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
        assert statuses[0] == 401 and statuses[-1] == 429
        assert int(response.headers["retry-after"]) >= 1
        good = await client.get("/metrics", headers={"Authorization": f"Bearer {served.tokens['alice']}"})
        assert good.status_code == 200, "a valid token is never refused for others' mistakes"


async def test_token_in_the_query_string_is_refused(served: Served) -> None:
    async with served.http() as client:
        response = await client.get(f"/mcp?access_token={served.tokens['alice']}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "token_in_query"


async def test_host_and_origin_allow_lists(served: Served) -> None:
    async with served.http(served.tokens["alice"]) as client:
        bad_host = await client.get("/metrics", headers={"Host": "rebound.attacker.example"})
        bad_origin = await client.get("/metrics", headers={"Origin": "https://attacker.example"})
        good = await client.get("/metrics", headers={"Origin": f"https://localhost:{served.port}"})
        health = await client.get("/healthz", headers={"Host": "10.9.8.7"})
    assert bad_host.status_code == 421 and bad_origin.status_code == 403 and good.status_code == 200
    assert health.status_code == 200 and health.json() == {"status": "ok"}


async def test_oversized_bodies_are_refused_declared_or_chunked(served: Served) -> None:
    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(66):
            yield b"x" * 1024

    async with served.http(served.tokens["alice"]) as client:
        json_type = {"Content-Type": "application/json"}
        declared = await client.post("/mcp", content=b"x" * (65 * 1024), headers=json_type)
        streamed = await client.post("/mcp", content=chunked(), headers=json_type)
    assert declared.status_code == 413
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "payload_too_large"


async def test_oversized_headers_are_refused(served: Served) -> None:
    async with served.http(served.tokens["alice"]) as client:
        response = await client.get("/healthz", headers={"X-Padding": "p" * 16 * 1024})
    assert response.status_code == 431


async def test_probes_and_metrics(served: Served) -> None:
    async with served.http() as anonymous, served.http(served.tokens["bob"]) as reader:
        stranger = await anonymous.get("/readyz")
        ready = await reader.get("/readyz")
        hidden = await anonymous.get("/metrics")
        metrics = await reader.get("/metrics", headers={"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"})
    assert stranger.status_code == 200 and stranger.json() == {"status": "ready"}  # no count for strangers
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["circuit_breakers"] == {"targets": 1, "open": 0}
    assert hidden.status_code == 401
    assert metrics.status_code == 200 and metrics.headers["x-correlation-id"] == "ab" * 16
    for family in ("gateway_tool_calls_total", "gateway_tool_call_duration_seconds",
                   "gateway_auth_failures_total", "gateway_target_queue_depth", "gateway_target_slots",
                   "gateway_target_sessions_in_use"):
        assert f"# TYPE {family} " in metrics.text
    assert 'gateway_target_slots{target="vc1"}' in metrics.text


def _tls11_handshake(port: int) -> str:
    """A TLS 1.1-only client (security level 0, so its own library does not refuse first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        return str(tls.version())


def _permissive_server(cert: CertificatePaths) -> tuple[int, threading.Thread]:
    """A one-shot TLS server that still accepts TLS 1.1: proves the client above can speak it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
        context.minimum_version = ssl.TLSVersion.TLSv1
    context.load_cert_chain(cert.cert, cert.key)
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_one() -> None:
        with listener:
            listener.settimeout(10)
            conn, _ = listener.accept()
            with conn, context.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=accept_one, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def test_tls_below_1_2_is_refused_by_the_server(served: Served) -> None:
    port, thread = _permissive_server(served.cert)
    try:
        assert _tls11_handshake(port) == "TLSv1.1"
    except ssl.SSLError as exc:
        # CI must prove the server's refusal, never skip it
        unavailable(f"this OpenSSL cannot negotiate TLS 1.1 at all ({exc})")
    finally:
        thread.join(10)
    # the same client just completed a TLS 1.1 handshake, so this refusal is the server's
    # (uvicorn's TLS layer may answer with an alert or just close the connection)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        _tls11_handshake(served.port)
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw, \
            served.tls().wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


# ---------------------------------------------------------------------------- an orderly stop


async def test_stop_fails_readiness_first_and_lets_calls_finish(tmp_path: Path) -> None:
    running = stand_in(tmp_path, drain_seconds=0.0, grace_seconds=30.0)
    try:
        result: dict[str, Any] = {}
        async with mcp_client(running, running.tokens["alice"], "2026-07-28") as client, \
                anyio.create_task_group() as tg:
            async def slow_call() -> None:
                outcome = await client.call_tool("slow_read", {"target": "vc1"})
                result["value"] = answer_of(outcome)

            # listed before the stop: the client validates a result against the listed output schema,
            # and a tools/list sent after the stop began would be a new request, refused with 503
            await client.list_tools()
            tg.start_soon(slow_call)
            await anyio.to_thread.run_sync(running.gateway.entered.wait, 30)
            running.server.begin_stop()
            async with running.http(running.tokens["bob"]) as probe:
                not_ready = await probe.get("/readyz")
            assert not_ready.status_code == 503 and not_ready.json()["reasons"] == ["shutting down"]
            async with running.http(running.tokens["bob"]) as late:
                refused = await late.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                          headers={"Accept": "application/json, text/event-stream"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
            assert running.thread.is_alive(), "the server must wait for the call in progress"
            running.gateway.release.set()
        assert result["value"]["vms"] == ["vm-a", "vm-b"]
        await anyio.to_thread.run_sync(running.thread.join, 30)
        assert not running.thread.is_alive()
    finally:
        running.gateway.release.set()
        if running.thread.is_alive():
            running.stop()


# ---------------------------------------------------------------------------- gateway serve: refusals


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize(("argv", "message"), [
    (["--transport", "https"], "https needs --cert, --key, --public-name"),
    (["--transport", "https", "--cert", "c.pem", "--key", "k.pem"], "https needs --public-name"),
    (["--transport", "http", "--host", "0.0.0.0"], "loopback address only"),
    (["--transport", "http", "--host", "192.0.2.1"], "loopback address only"),
    (["--transport", "http", "--port", "70000"], "between 1 and 65535"),
    (["--transport", "http", "--session-idle-seconds", "0"], "--session-idle-seconds: must be a positive"),
    (["--transport", "http", "--max-body-bytes", "-1"], "--max-body-bytes: must be a positive"),
    (["--transport", "http", "--max-sessions-per-token", "0"], "--max-sessions-per-token: must be a pos"),
    (["--transport", "http", "--header-timeout-seconds", "0"], "--header-timeout-seconds: must be a pos"),
])
def test_network_flags_are_checked_before_anything_starts(argv: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        serve_cli.check_network_args(serve_args(*argv))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_http_binds_loopback_addresses(host: str) -> None:
    assert serve_cli.check_network_args(serve_args("--transport", "http", "--host", host)) == host


def test_https_binds_every_interface_by_default() -> None:
    args = serve_args("--transport", "https", "--cert", "c", "--key", "k", "--public-name", "gw.example.com")
    assert serve_cli.check_network_args(args) == "0.0.0.0"
    config = serve_cli.edge_config(args)
    assert config.hosts[0].host == "gw.example.com"
    def limits(config: EdgeConfig) -> tuple[int, int, float]:
        return config.max_sessions, config.max_sessions_per_token, config.header_timeout_seconds

    assert limits(config) == (1000, 32, 10.0)
    limited = serve_cli.edge_config(serve_args(
        "--transport", "http", "--max-sessions", "50", "--max-sessions-per-token", "4",
        "--header-timeout-seconds", "2"))
    assert limits(limited) == (50, 4, 2.0)


def test_network_transports_need_a_usable_token(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "state.db") as store:
        with pytest.raises(ConfigError, match="gateway token create NAME --role admin"):
            serve_cli.require_token(store)
        create_token(store, "old", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
        store.update_token("old", revoked=True)
        with pytest.raises(ConfigError):
            serve_cli.require_token(store)
        create_token(store, "new", "reader", expires_in=None, now=time.time(), hasher=FAST_HASH)
        serve_cli.require_token(store)


@pytest.mark.parametrize(("env", "argv", "read_only"), [
    ({"GATEWAY_READ_ONLY": "false"}, ["--read-only"], True),
    ({"GATEWAY_READ_ONLY": "true"}, [], True),
    ({}, [], False),
])
def test_switches_on_the_command_line_win_over_the_environment(
    env: dict[str, str], argv: list[str], read_only: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.delenv("GATEWAY_READ_ONLY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = serve_args("--home", str(tmp_path), *argv)
    settings = settings_from(args, **serve_cli.switches(args))
    assert settings.read_only is read_only and settings.home == tmp_path


# ---------------------------------------------------------------------------- gateway serve: the real command


@pytest.fixture
def vc1_home(sim_vc1: Simulator, tmp_path: Path) -> tuple[dict[str, str], Path]:
    home = tmp_path / "home"
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml")})
    return env, home


async def test_serve_https_end_to_end_and_stop_on_sigterm(
    vc1_home: tuple[dict[str, str], Path], sim_vc1: Simulator, tmp_path: Path,
) -> None:
    env, home = vc1_home
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    home.mkdir(mode=0o700)
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    command = run_serve(tmp_path, env, *https_argv(cert))
    try:
        found = wait_until(lambda: command.process.poll() is not None or
                           re.search(r"running on https://127\.0\.0\.1:(\d+)", command.output()), timeout=60,
                           what="gateway serve to listen")
        assert isinstance(found, re.Match), command.output()
        assert "self-check passed" in command.output()
        base = f"https://localhost:{found.group(1)}"
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                  verify=ssl.create_default_context(cafile=str(cert.cert)))
        transport = streamable_http_client(f"{base}/mcp", http_client=http)
        async with http, Client(transport, mode="legacy") as client:
            assert "list_vms" in {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("list_vms", {"target": "vc1"})
        assert not result.is_error, result.content
        assert all(name in json.dumps(answer_of(result)) for name in sim_vc1.vm_names())
    finally:
        code = command.stop()
    assert code == 0, command.output()
    assert "stopping: readiness fails from now" in command.output()
    assert token not in command.output()


def test_a_log_reader_that_stops_reading_never_stalls_the_server(
    vc1_home: tuple[dict[str, str], Path], tmp_path: Path,
) -> None:
    """The server's stderr is a pipe its reader stops draining (a stuck log shipper): once the pipe is
    full only the log writer waits; the server answers every request meanwhile, and when the reader
    comes back the lines are there and the server stops cleanly."""
    env, home = vc1_home
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    home.mkdir(mode=0o700)
    with SqliteStore(home / "state.db") as store:
        create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    port = free_port()
    argv = [*https_argv(cert)[:-4], "--port", str(port), "--grace-seconds", "10"]
    assert https_argv(cert)[-4:-2] == ["--port", "0"]
    process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, "serve", *argv], cwd=REPO,
                               env={**env, "GATEWAY_LOG_LEVEL": "DEBUG", "PYTHONPATH": str(REPO),
                                    "PATH": os.environ.get("PATH", "")},
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(process.stdout.read()),  # type: ignore[union-attr]
                              daemon=True)
    try:
        with httpx2.Client(base_url=f"https://localhost:{port}", timeout=10,
                           verify=ssl.create_default_context(cafile=str(cert.cert))) as http:
            def answering() -> bool:
                assert process.poll() is None, "gateway serve exited"
                with contextlib.suppress(httpx2.TransportError):
                    return http.get("/healthz").status_code == 200
                return False

            wait_until(answering, timeout=60, what="gateway serve to listen")
            # a debug line per probe: far more than the pipe holds (64 KiB), nobody reading it
            for _ in range(1500):
                assert http.get("/healthz").status_code == 200
            reader.start()
            assert http.get("/healthz").status_code == 200
    finally:
        if reader.ident is None:
            reader.start()
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    reader.join(30)
    output = b"".join(read).decode(errors="replace")
    assert code == 0, output[-4000:]
    assert output.count("GET /healthz 200") > 100, output[-4000:]
    assert "stopping: readiness fails from now" in output, output[-4000:]


def test_serve_refuses_to_start_without_a_token(
    vc1_home: tuple[dict[str, str], Path], tmp_path: Path,
) -> None:
    env, _ = vc1_home
    cert = create_certificate(tmp_path / "tls", ["localhost"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    assert command.process.wait(60) == 1
    assert "gateway token create NAME --role admin" in command.output()


async def _list_vms_once(tmp_path: Path, gateway: Gateway) -> Any:
    """One list_vms on vc1 over HTTPS from a fresh server on ``gateway`` (stopped and closed after)."""
    running = serve(tmp_path, gateway)
    try:
        async with mcp_client(running, running.tokens["alice"], "legacy") as client:
            return await client.call_tool("list_vms", {"target": "vc1"})
    finally:
        running.stop()
        await running.gateway.close()


async def test_an_answer_over_one_mebibyte_reaches_the_default_client(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """The SDK client refuses server-sent events over 1 MiB: large answers must arrive as one JSON body."""
    sim = make_simulator(clusters=1, hosts_per_cluster=2, vms=6000, startup_timeout=240)
    result = await _list_vms_once(tmp_path, real_gateway(sim, tmp_path))
    assert not result.is_error, result.content
    assert answer_of(result)["count"] == 6000
    text = result.content[0].text  # type: ignore[union-attr]
    assert len(json.dumps(text)) > 1024 * 1024, "the answer as one event would exceed the client's limit"


async def test_the_audit_row_fingerprints_the_very_answer_the_client_received(
    sim_vc1: Simulator, tmp_path: Path
) -> None:
    gateway = real_gateway(sim_vc1, tmp_path)
    result = await _list_vms_once(tmp_path, gateway)
    assert not result.is_error, result.content
    received = result.content[0].text.encode()  # type: ignore[union-attr]
    (row,) = [r for r in read_rows(gateway.settings.audit_log) if r.get("tool") == "list_vms"]
    assert row["result_digest"] == hashlib.sha256(received).hexdigest()
    assert row["result_size"] == len(received)


def test_a_body_that_never_arrives_gets_408(sim_vc1: Simulator, tmp_path: Path) -> None:
    """A client that announces a body and stalls is cut off at the receive deadline, not held forever."""
    running = serve(tmp_path, real_gateway(sim_vc1, tmp_path), edge={"receive_timeout_seconds": 1.0})
    try:
        with socket.create_connection(("127.0.0.1", running.port)) as raw, \
                running.tls().wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
                        + running.tokens["alice"].encode() + b"\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100\r\n\r\n{")
            tls.settimeout(20)
            reply = tls.recv(4096)
    finally:
        running.stop()
        anyio.run(running.gateway.close)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]


async def test_an_idle_session_expires(
    sim_vc1: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    running = serve(tmp_path, real_gateway(sim_vc1, tmp_path), edge={"session_idle_seconds": 1.0})
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    try:
        with caplog.at_level(logging.INFO, logger="mcp"):
            async with running.http(running.tokens["alice"]) as alice:
                session = await _initialize(alice)
                headers = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": session,
                           "MCP-Protocol-Version": "2025-11-25"}
                assert (await alice.post("/mcp", json=listing, headers=headers)).status_code == 200
                # touching the session would keep it alive: wait for the server to reap it instead
                await anyio.to_thread.run_sync(lambda: wait_until(
                    lambda: f"Session {session} idle timeout" in caplog.text, timeout=30, what="idle reap"))
                after = await alice.post("/mcp", json=listing, headers=headers)
    finally:
        running.stop()
        await running.gateway.close()
    assert after.status_code == 404


async def test_the_audit_fingerprints_the_bytes_received_for_a_fan_out_a_write_and_a_confirm(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """Over HTTPS with the real MCP client: for a fan-out read, a write and a confirmed proposal, the
    audit row's ``result_digest`` is the SHA-256 of the very text the client received."""
    sim = make_simulator()  # a fresh simulator: this test deletes a VM
    off, gone = sorted(sim.vm_names())[:2]
    gateway = build_gateway(tmp_path, sim)
    running = serve(tmp_path, gateway)
    try:
        async with mcp_client(running, running.tokens["alice"], "legacy") as client:
            fanned = await client.call_tool("list_vms", {"target": "all"})
            wrote = await client.call_tool("power_off_vm", {"target": "vc1", "vm": off,
                                                            "guest_timeout_seconds": 0})
            proposed = answer_of(await client.call_tool("delete_vm", {"target": "vc1", "vm": gone,
                                                                      "force_power_off": True}))
            confirmed = await client.call_tool("confirm_action", {"token": proposed["token"]})
    finally:
        running.stop()
        await gateway.close()
    rows = audit_rows(gateway)
    picks = {
        "fan-out read": (fanned, lambda r: r.get("tool") == "list_vms" and r.get("phase") == "call"),
        "write": (wrote, lambda r: r.get("tool") == "power_off_vm" and r.get("phase") == "executed"),
        "confirm": (confirmed, lambda r: r.get("proposal_id") == proposed["proposal_id"]
                    and r.get("phase") == "executed"),
    }
    for what, (result, pick) in picks.items():
        assert not result.is_error, (what, result.content)
        received = result.content[0].text.encode()  # type: ignore[union-attr]
        (row,) = [r for r in rows if pick(r)]
        assert (row["result_digest"], row["result_size"]) == (hashlib.sha256(received).hexdigest(),
                                                              len(received)), what


# ---------------------------------------------------------------- /readyz never holds the event loop


async def test_healthz_answers_while_readiness_is_stuck(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """A state store that stops answering (a fault injected by replacing ``store.ping`` with one that
    blocks: neither SQLite nor the simulator can be made to hang on demand) must not stall /healthz,
    and /readyz answers 503 at its deadline instead of hanging."""
    gw = real_gateway(make_simulator(vms=1), tmp_path)
    entered, release = threading.Event(), threading.Event()

    calls: list[int] = []

    def stuck_store_ping_fault() -> bool:
        calls.append(1)
        entered.set()
        release.wait(60)
        return True

    served = serve(tmp_path, gw)
    try:
        gw.store.ping = stuck_store_ping_fault  # type: ignore[method-assign]
        answers: dict[str, httpx2.Response] = {}
        async with served.http(served.tokens["alice"]) as http:

            async def ready() -> None:
                answers["ready"] = await http.get("/readyz", timeout=30)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ready)
                with anyio.fail_after(20):
                    while not entered.is_set():
                        await anyio.sleep(0.02)
                async with served.http() as probe:
                    try:
                        health = await probe.get("/healthz", timeout=5)
                    except httpx2.TimeoutException:
                        pytest.fail("/healthz did not answer while a readiness check was stuck")
                assert health.status_code == 200
        assert answers["ready"].status_code == 503
        assert "did not answer" in " ".join(answers["ready"].json()["reasons"])
        async with served.http(served.tokens["alice"]) as http:
            again = await http.get("/readyz", timeout=30)
        assert again.status_code == 503 and calls == [1], "a later probe joins the stuck check"
    finally:
        release.set()
        served.stop()
        await gw.close()
