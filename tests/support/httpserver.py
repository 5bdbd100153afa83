"""A real gateway HTTPS server for tests: uvicorn on a free loopback port with a generated certificate,
tokens for three roles, and the SDK's MCP client pointed at it; or the real `gateway serve` command in
a child process (``run_serve``)."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from argon2 import PasswordHasher
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette

from gateway.auth.tokens import create_token
from gateway.server.edge.app import GatewayServer, build_app, uvicorn_config
from gateway.server.edge.middleware import EdgeConfig
from gateway.server.edge.tls import CertificatePaths, create_certificate, server_context
from support.simulator import wait_until, write_targets

#: argon2 parameters that keep token creation fast in tests (production uses the library's defaults)
FAST_HASH = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
REPO = Path(__file__).resolve().parents[2]
GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"  # the `gateway` command


@dataclass
class Served:
    server: GatewayServer
    thread: threading.Thread
    app: Starlette
    gateway: Any
    cert: CertificatePaths
    tokens: dict[str, str]

    @property
    def port(self) -> int:
        port: int = self.server.servers[0].sockets[0].getsockname()[1]
        return port

    @property
    def base(self) -> str:
        return f"https://localhost:{self.port}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert.cert))

    def http(self, token: str | None = None, headers: Mapping[str, str] | None = None) -> httpx2.AsyncClient:
        sent = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        return httpx2.AsyncClient(base_url=self.base, verify=self.tls(), headers=sent, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not stop"


def serve(tmp: Path, gateway: Any, edge: Mapping[str, Any] | None = None, *,
          tokens: Mapping[str, str] | None = None, **server_options: Any) -> Served:
    """``gateway`` over HTTPS; ``tokens`` of another ``Served`` on the same database (a second replica)
    instead of new ones."""
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
    tokens = dict(tokens) if tokens is not None else {
        name: create_token(gateway.store, name, role, expires_in=None, now=time.time(), hasher=FAST_HASH)[0]
        for name, role in (("alice", "admin"), ("bob", "reader"), ("carol", "vc1-reader"))
    }
    limits = {"max_body_bytes": 64 * 1024, "max_header_bytes": 8 * 1024, **(edge or {})}
    config = EdgeConfig.for_https(["localhost"], **limits)
    app = build_app(gateway, config)
    uv = uvicorn_config(
        app, config, host="127.0.0.1", port=0, ssl_context=server_context(cert.cert, cert.key)
    )
    server = GatewayServer(uv, gateway, app.state.in_flight, **server_options)
    thread = threading.Thread(target=server.run, name="gateway-https", daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=20, what="server start")
    assert server.started, "the server failed to start (see the log)"
    return Served(server, thread, app, gateway, cert, tokens)


@asynccontextmanager
async def mcp_client(
    served: Served,
    token: str,
    mode: str,
    headers: Mapping[str, str] | None = None,
    **options: Any,
) -> AsyncIterator[Client]:
    """The SDK's client over HTTPS; ``options`` go to ``mcp.Client`` (``elicitation_callback``, say)."""
    http = served.http(token, headers)
    transport = streamable_http_client(f"{served.base}/mcp", http_client=http)
    async with http, Client(transport, mode=mode, **options) as client:
        yield client


def build_gateway(
    tmp: Path,
    sim: Any,
    rules: Mapping[str, Any] | None = None,
    *,
    database_url: str | None = None,
    target: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """A gateway over ``sim`` (target ``vc1``) built as ``gateway serve`` builds it, its home ``tmp``:
    the file audit and SQLite, or PostgreSQL for both with ``database_url``; destructive tools on;
    ``rules`` (default: everything allowed) written to rules.yaml; ``target`` overrides keys of vc1's
    targets.yaml entry (a relay's port, say)."""
    from dataclasses import replace

    import yaml

    from gateway.dev.simulators import write_targets
    from gateway.server.runtime import Gateway
    from gateway.settings import Settings
    from support.simulator import complete_rules

    env = write_targets(tmp / "targets.yaml", {"vc1": sim}, {"vc1": dict(target or {})})
    allow = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow"}}
    (tmp / "rules.yaml").write_text(yaml.safe_dump(complete_rules(rules if rules is not None else allow)))
    if database_url is not None:
        env["GATEWAY_DATABASE_URL"] = database_url
    base = Settings.from_env({"GATEWAY_HOME": str(tmp), **env})
    return Gateway.build(replace(base, **{"enable_destructive": True, **settings}))


@asynccontextmanager
async def served_gateway(tmp: Path, sim: Any, rules: Mapping[str, Any] | None = None,
                         **settings: Any) -> AsyncIterator[Served]:
    """``build_gateway`` over ``sim`` served over HTTPS, stopped and closed on the way out."""
    gateway = build_gateway(tmp, sim, rules, **settings)
    served = serve(tmp, gateway)
    try:
        yield served
    finally:
        served.stop()
        await gateway.close()


READER_ROLES = """roles:
  vc1-reader: {tools: read, allow_write: [], allow_destructive: [], targets: [vc1], approve: none}
"""


def real_gateway(sim: Any, tmp: Path) -> Any:
    """A gateway over ``sim`` (target ``vc1``) from its settings' defaults, its home tmp/home holding one
    extra role, ``vc1-reader``."""
    from gateway.server.runtime import Gateway
    from gateway.settings import Settings

    env = write_targets(tmp / "targets.yaml", {"vc1": sim})
    home = tmp / "home"
    home.mkdir(mode=0o700)
    (home / "roles.yaml").write_text(READER_ROLES)
    (home / "roles.yaml").chmod(0o600)
    return Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp / "targets.yaml")))


def audit_rows(gateway: Any, *, config_loads: bool = False) -> list[dict[str, Any]]:
    """Every audit row the gateway's engine holds (the file or the PostgreSQL table), oldest first; the
    rows of its configuration loads (``config_reload``) only with ``config_loads``."""

    rows = gateway.backends.reader.rows()
    return [row for row in rows if config_loads or row.get("phase") != "config_reload"]


# ---------------------------------------------------------------------------- gateway serve: the real command


@dataclass
class Command:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise

    def base(self) -> str:
        """Wait until the server listens; its https://localhost:PORT address."""
        found = wait_until(lambda: self.process.poll() is not None or
                           re.search(r"running on https://127\.0\.0\.1:(\d+)", self.output()), timeout=60,
                           what="gateway serve to listen")
        assert isinstance(found, re.Match), self.output()
        return f"https://localhost:{found.group(1)}"


def run_serve(tmp: Path, env: Mapping[str, str], *argv: str, umask: int = -1) -> Command:
    """``gateway serve ARGV`` in a child process (with ``umask`` when given), logging to tmp/serve.log."""
    log = tmp / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, "serve", *argv], cwd=REPO,
                                   env={**env, "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")},
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   umask=umask)
    return Command(process, log)


def serve_home(tmp: Path, sims: Mapping[str, Any]) -> tuple[Path, dict[str, str]]:
    """A private ``GATEWAY_HOME`` under ``tmp`` and the environment for ``run_serve`` with one target
    per entry of ``sims`` (name -> simulator): the targets file, its credentials, the home."""
    home = tmp / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp / "targets.yaml", sims)
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml")})
    return home, env


def https_argv(cert: CertificatePaths) -> list[str]:
    return ["--transport", "https", "--cert", str(cert.cert), "--key", str(cert.key),
            "--public-name", "localhost", "--host", "127.0.0.1", "--port", "0", "--grace-seconds", "10"]
