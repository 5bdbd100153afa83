"""The approval page over real HTTPS for tests: the real gateway (targets prod-vc and its alias prod-alias
on one simulator, lab-vc on another, lab-down that nobody answers for) served by uvicorn with the page
at /ui, tokens for people and agents, and one-call MCP helpers (``mcp_call``, ``propose_delete``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.auth.tokens import create_token
from gateway.server.edge.app import GatewayServer, build_app, uvicorn_config
from gateway.server.edge.middleware import EdgeConfig
from gateway.server.edge.tls import CertificatePaths, create_certificate, server_context
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.vocabulary import Kind
from gateway.web.app import build_web_app
from support.answers import answer_of
from support.httpserver import FAST_HASH
from support.simulator import (
    Simulator,
    closed_port,
    credential_prefix,
    credentials_env,
    start_simulator,
    target_entry,
    wait_until,
)

ROLES_YAML = """\
roles:
  agent:
    tools: "*"
    allow_write: []
    allow_destructive: []
    targets: "*"
    approve: none
  lead:
    tools: "*"
    allow_write: []
    allow_destructive: []
    targets: "*"
    approve: others
  lab-approver:
    tools: read
    allow_write: []
    allow_destructive: []
    targets: ["lab-*"]
    approve: any
    audit: all
"""
RULES_YAML = """\
defaults:
  destructive: allow
  max_calls_per_minute:
    write: null
    destructive: null
targets:
  "prod-*":
    require_web_approval: true
protected: []
rules: []
maintenance_windows: []
"""
#: N of M (tests/server/proposals/test_approvals_served.py, tests/web/test_approvals_browser.py): ``prod-*``
#: needs two distinct people, ``lab-vc`` a reason; a bulk call on three or more VMs asks for three
#: approvals (``big-bulk``)
N_OF_M_RULES = """\
defaults:
  destructive: allow
  max_calls_per_minute:
    write: null
    destructive: null
targets:
  "prod-*":
    require_web_approval: true
    approvals_required: 2
  "lab-vc":
    require_web_approval: true
    reason_required: true
protected: []
rules:
  - name: big-bulk
    match:
      tools: [bulk_vm_action]
      min_affected_objects: 3
    action: require_approval
    approvals_required: 3
maintenance_windows: []
"""
#: token name -> role
PEOPLE = {"agent": "agent", "alice": "admin", "rita": "reader", "olga": "lead", "lara": "lab-approver",
          "adam": "admin"}
#: the tokens of people (``--kind person``: they may sign in to the page); the others are agents'
PERSONS = frozenset({"alice", "rita", "olga", "lara"})
_unique = itertools.count(1)


# ---------------------------------------------------------------------------- a running gateway with /ui


@dataclass
class WebServer:
    """uvicorn on loopback: the real gateway (targets prod-vc and its alias prod-alias on one simulator,
    lab-vc on another) with the page at /ui. ``advance(s)`` moves the gateway's clock forward."""

    server: GatewayServer
    thread: threading.Thread
    gateway: Gateway
    cert: CertificatePaths
    tokens: dict[str, str]
    sims: dict[str, Simulator]
    offset: list[float] = field(default_factory=lambda: [0.0])
    #: the credentials' environment and the files, for a CLI run against the same gateway
    env: dict[str, str] = field(default_factory=dict)
    tmp: Path | None = None

    def cli_flags(self) -> list[str]:
        """``--home/--targets/--rules/--roles`` of this gateway, for ``gateway.cli.main``."""
        assert self.tmp is not None
        return ["--home", str(self.tmp / "home"), "--targets", str(self.tmp / "targets.yaml"),
                "--rules", str(self.tmp / "rules.yaml"), "--roles", str(self.tmp / "roles.yaml")]

    @property
    def port(self) -> int:
        port: int = self.server.servers[0].sockets[0].getsockname()[1]
        return port

    @property
    def origin(self) -> str:
        return f"https://localhost:{self.port}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert.cert))

    def http(self, headers: Mapping[str, str] | None = None) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.origin, verify=self.tls(), headers=dict(headers or {}),
                                  timeout=60)

    def advance(self, seconds: float) -> None:
        self.offset[0] += seconds

    def audit_rows(self) -> list[dict[str, Any]]:
        lines = self.gateway.settings.audit_log.read_text().splitlines()
        return [json.loads(line) for line in lines]

    def proposal_state(self, proposal_id: str) -> str:
        proposal = self.gateway.store.get_proposal(proposal_id)
        assert proposal is not None
        return proposal.state

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not stop"


def start_web_server(tmp: Path, prod: Simulator, lab: Simulator, *, dry_run: bool = False,
                     rules: str = RULES_YAML) -> WebServer:
    """The server for ``prod`` and ``lab``, plus ``lab-down``: a target nobody answers for. ``dry_run``:
    an approved change is planned and audited but not made; ``rules``: the rules file's text."""
    sims = {"prod-vc": prod, "prod-alias": prod, "lab-vc": lab}
    env = credentials_env(sims)
    prefix = credential_prefix("lab-down")
    down = {"name": "lab-down", "host": "127.0.0.1", "port": closed_port(), "insecure": True,
            "credential_env_prefix": prefix}
    env.update({f"{prefix}_USER": "nobody", f"{prefix}_PASSWORD": "nothing"})
    entries = [*(target_entry(name, sim) for name, sim in sims.items()), down]
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"targets": entries}, sort_keys=False))
    (tmp / "rules.yaml").write_text(rules)
    roles = tmp / "roles.yaml"
    roles.write_text(ROLES_YAML)
    roles.chmod(0o600)
    settings = Settings.from_env(env, home=str(tmp / "home"), targets=str(tmp / "targets.yaml"),
                                 rules=str(tmp / "rules.yaml"), roles=str(roles), enable_destructive=True,
                                 web_ui=True, dry_run=dry_run or None)
    gateway = Gateway.build(settings)
    offset = [0.0]
    gateway.clock = lambda: time.time() + offset[0]
    tokens = {name: create_token(gateway.store, name, role, expires_in=None, now=time.time(),
                                 hasher=FAST_HASH, kind=Kind.PERSON if name in PERSONS else Kind.AGENT)[0]
              for name, role in PEOPLE.items()}
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
    config = EdgeConfig.for_https(["localhost"])
    app = build_app(gateway, config, web=build_web_app(gateway))
    tls = server_context(cert.cert, cert.key)
    uv = uvicorn_config(app, config, host="127.0.0.1", port=0, ssl_context=tls)
    server = GatewayServer(uv, gateway, app.state.in_flight)
    thread = threading.Thread(target=server.run, name="gateway-web", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=20, what="server start")
    assert server.started, "the server failed to start (see the log)"
    return WebServer(server, thread, gateway, cert, tokens, {"prod": prod, "lab": lab}, offset, env, tmp)


@contextlib.contextmanager
def web_server(tmp: Path, vcsim_bin: Path, *, dry_run: bool = False, rules: str = RULES_YAML,
               vms: int = 2) -> Iterator[WebServer]:
    """Two fresh simulators (tests delete their VMs) and the server in front of them."""
    prod = start_simulator(binary=vcsim_bin, clusters=1, hosts_per_cluster=1, standalone_hosts=1, vms=vms)
    lab = start_simulator(binary=vcsim_bin, clusters=1, hosts_per_cluster=1, standalone_hosts=1, vms=vms)
    running = None
    try:
        running = start_web_server(tmp, prod, lab, dry_run=dry_run, rules=rules)
        yield running
    finally:
        if running is not None:
            running.stop()
        prod.stop()
        lab.stop()


async def mcp_call(
    server: WebServer, who: str, tool: str, args: Mapping[str, Any],
) -> tuple[bool, dict[str, Any]]:
    """One MCP tools/call as the caller ``who``: (is_error, structured content)."""
    http = httpx2.AsyncClient(verify=server.tls(), timeout=60,
                              headers={"Authorization": f"Bearer {server.tokens[who]}"})
    transport = streamable_http_client(f"{server.origin}/mcp", http_client=http)
    async with http, Client(transport, mode="2026-07-28") as client:
        result = await client.call_tool(tool, dict(args))
    return result.is_error, answer_of(result)


async def propose_delete(server: WebServer, who: str, target: str, vm: str) -> dict[str, Any]:
    """``who`` proposes deleting ``vm`` over MCP; the proposal (with its confirmation token)."""
    args = {"target": target, "vm": vm, "force_power_off": True, "timeout_seconds": 600 + next(_unique)}
    failed, body = await mcp_call(server, who, "delete_vm", args)
    assert not failed, body
    assert body["state"] == "pending", body
    return body


# ---------------------------------------------------------------------------- the page over HTTP


def change_headers(server: WebServer, csrf: str | None) -> dict[str, str]:
    headers = {"Origin": server.origin, "Content-Type": "application/json"}
    if csrf is not None:
        headers["X-CSRF-Token"] = csrf
    return headers


async def sign_in(client: httpx2.AsyncClient, server: WebServer, who: str) -> str:
    """Sign ``who`` in on ``client`` (its cookie jar keeps the session); return the CSRF token."""
    response = await client.post("/ui/api/sign-in", json={"token": server.tokens[who]},
                                 headers={"Origin": server.origin})
    assert response.status_code == 200, response.text
    csrf: str = response.json()["csrf"]
    return csrf


@contextlib.asynccontextmanager
async def signed_in(server: WebServer, who: str) -> AsyncIterator[tuple[httpx2.AsyncClient, str]]:
    async with server.http() as client:
        yield client, await sign_in(client, server, who)


async def decide(client: httpx2.AsyncClient, server: WebServer, csrf: str | None, proposal_id: str,
                 action: str, reason: str | None = None) -> httpx2.Response:
    body = {} if reason is None else {"reason": reason}
    return await client.post(f"/ui/api/proposals/{proposal_id}/{action}", json=body,
                             headers=change_headers(server, csrf))
