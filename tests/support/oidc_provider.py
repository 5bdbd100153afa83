"""A real OpenID provider for tests (tests/oidc/provider.mjs: the npm package oidc-provider under Node) and
a real gateway HTTPS server whose identity.yaml trusts it.

``OidcProvider`` runs the provider on a loopback port with signing keys this module generates (so a
test can also sign tokens of its own with them: wrong audience, expired, ...); ``rotate()`` restarts
it on the same port with a new first key. Without Node or the npm packages (``npm ci`` in tests/oidc,
which ``.ci/run`` does) the tests skip, and fail under CI=true (``processes.unavailable``).
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from gateway.auth.tokens import create_token
from gateway.server.edge.app import GatewayServer, build_app, uvicorn_config
from gateway.server.edge.middleware import EdgeConfig
from gateway.server.edge.tls import CertificatePaths, create_certificate, server_context
from support import tier
from support.httpserver import FAST_HASH, REPO
from support.processes import unavailable
from support.simulator import wait_until

OIDC_DIR = REPO / "tests" / "oidc"
AGENT_SECRET = "agent-ops-secret-" + "x" * 16
WEB_SECRET = "gateway-web-secret-" + "y" * 16
#: clients: ops (groups vsphere-ops, read+write scopes), reader (vsphere-readers, read only),
#: stranger (a group nothing maps)
CLIENT_GROUPS = {
    "agent-ops": ["vsphere-ops"],
    "agent-reader": ["vsphere-readers"],
    "agent-stranger": ["marketing"],
}
USERS: dict[str, dict[str, Any]] = {
    "rita": {"email": "rita@example.com", "groups": ["vsphere-approvers"]},
    "mallory": {"email": "mallory@example.com", "groups": ["marketing"]},
    "olga": {"email": "olga@example.com", "groups": ["vsphere-approvers"]},
    #: an ID token whose subject is the page's own client id: an application's, not a person's
    "gateway-web": {"email": "app@example.com", "groups": ["vsphere-approvers"]},
    #: an ID token that says it is an application's (Entra ID's idtyp)
    "app-bot": {"email": "bot@example.com", "groups": ["vsphere-approvers"], "extra": {"idtyp": "app"}},
}
ROLES = """roles:
  lab-operator: {tools: read, allow_write: [power_on_vm, power_off_vm], allow_destructive: [], targets: "*",
                 approve: none}
  approver: {tools: read, allow_write: [], allow_destructive: [], targets: "*", approve: any}
"""


def new_key(kid: str | None = None) -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key))
    jwk.update({"kid": kid or secrets.token_hex(8), "alg": "RS256", "use": "sig"})
    return key, jwk


def node() -> str:
    tier.start("oidc")
    found = shutil.which("node")
    if found is None:
        unavailable("node is missing (Debian package nodejs); the identity tests need a real OpenID provider")
    if not (OIDC_DIR / "node_modules" / "oidc-provider").is_dir():
        unavailable("the npm package oidc-provider is not installed: run `npm ci` in tests/oidc")
    return found


@dataclass
class OidcProvider:
    """The provider process; ``issuer`` is its URL, ``keys`` its private keys (the first signs)."""

    workdir: Path
    resource: str
    web_redirect: str = "https://localhost/ui/sso/callback"
    keys: list[tuple[rsa.RSAPrivateKey, dict[str, Any]]] = field(default_factory=list)
    port: int = 0
    issuer: str = ""
    process: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)

    def config(self) -> dict[str, Any]:
        clients = [
            {
                "client_id": cid,
                "client_secret": AGENT_SECRET,
                "grant_types": ["client_credentials"],
                "response_types": [],
                "redirect_uris": [],
                "scope": "vsphere:read" if cid == "agent-reader" else "vsphere:read vsphere:write",
            }
            for cid in CLIENT_GROUPS
        ]
        clients.append(
            {
                "client_id": "gateway-web",
                "client_secret": WEB_SECRET,
                "grant_types": ["authorization_code"],
                "response_types": ["code"],
                "redirect_uris": [self.web_redirect],
                "scope": "openid email groups",
            }
        )
        return {
            "port": self.port,
            "resource": self.resource,
            "jwks": {"keys": [j for _, j in self.keys]},
            "clients": clients,
            "users": USERS,
            "client_groups": CLIENT_GROUPS,
            "web_client": "gateway-web",
        }

    def start(self) -> None:
        if not self.keys:
            self.keys.append(new_key())
        path = self.workdir / "provider.json"
        path.write_text(json.dumps(self.config()))
        self.output = []
        self.process = subprocess.Popen(
            [node(), str(OIDC_DIR / "provider.mjs"), str(path)],
            cwd=OIDC_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready = threading.Event()

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line.rstrip())
                if line.startswith("READY "):
                    self.issuer = line.split()[1]
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        wait_until(
            lambda: ready.is_set() or self.process is None or self.process.poll() is not None,
            timeout=30,
            what="the OpenID provider to start",
        )
        if not ready.is_set():
            unavailable("the OpenID provider did not start: " + " | ".join(self.output[-10:]))
        self.port = int(self.issuer.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def rotate(self) -> dict[str, Any]:
        """Restart on the same port with a new first key (the old one still published); the new JWK."""
        self.stop()
        self.keys.insert(0, new_key())
        self.start()
        return self.keys[0][1]

    def sign(
        self,
        claims: Mapping[str, Any],
        *,
        key: int = 0,
        headers: Mapping[str, Any] | None = None,
        algorithm: str = "RS256",
    ) -> str:
        private, jwk = self.keys[key]
        return jwt.encode(
            dict(claims), private, algorithm=algorithm, headers={"kid": jwk["kid"], **(headers or {})}
        )

    def restart(self) -> None:
        """Stop and start again on the same port with the same keys, reading ``USERS`` anew (a person
        whose email claim changed signs in again)."""
        self.stop()
        self.start()

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """Claims of a valid access token for ``agent-ops`` (override any)."""
        now = int(time.time())
        base = {
            "iss": self.issuer,
            "aud": self.resource,
            "sub": "agent-ops",
            "client_id": "agent-ops",
            "groups": ["vsphere-ops"],
            "scope": "vsphere:read vsphere:write",
            "iat": now,
            "exp": now + 300,
            "jti": secrets.token_hex(8),
        }
        return {**base, **overrides}


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def identity_yaml(provider: OidcProvider, resource: str, *, token_sign_in: bool = True, **issuer: Any) -> str:
    """identity.yaml trusting ``provider``; ``issuer`` overrides keys of its entry (``principal_claim``,
    ``roles``, ...)."""
    entry = {
        "issuer": provider.issuer,
        "principal_claim": "sub",
        "roles_claim": "groups",
        "roles": {
            "vsphere-ops": "lab-operator",
            "vsphere-readers": "reader",
            "vsphere-approvers": "approver",
        },
        **issuer,
    }
    doc = {
        "resource": resource,
        "issuers": [entry],
        "web_sign_in": {
            "issuer": provider.issuer,
            "client_id": "gateway-web",
            "client_secret_env": "GATEWAY_OIDC_CLIENT_SECRET",
            "scope": "openid email groups",
            "token_sign_in": token_sign_in,
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class IdentityServed:
    server: GatewayServer
    thread: threading.Thread
    gateway: Any
    cert: CertificatePaths
    provider: OidcProvider
    token: str  # a gateway token (admin) besides the identity provider's
    port: int

    @property
    def base(self) -> str:
        return f"https://localhost:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@contextmanager
def identity_gateway(
    tmp: Path,
    sim: Any,
    *,
    web: bool = False,
    keys_max_age: float | None = None,
    token_sign_in: bool = True,
    provider: OidcProvider | None = None,
    issuer: Mapping[str, Any] | None = None,
    rules: Mapping[str, Any] | None = None,
) -> Iterator[IdentityServed]:
    """A gateway over ``sim`` trusting a fresh provider (or ``provider``), served over HTTPS on loopback;
    ``issuer`` overrides keys of identity.yaml's issuer entry, ``rules`` replaces rules.yaml's allow-all."""
    from gateway.web.app import build_web_app
    from support.httpserver import build_gateway

    sock = free_socket()
    port = sock.getsockname()[1]
    resource = f"https://localhost:{port}/mcp"
    own = provider is None
    if provider is None:
        provider = OidcProvider(tmp, resource, web_redirect=f"https://localhost:{port}/ui/sso/callback")
        provider.start()
    try:
        extra = {} if keys_max_age is None else {"keys_max_age_seconds": keys_max_age}
        extra.update(issuer or {})
        (tmp / "identity.yaml").write_text(
            identity_yaml(provider, resource, token_sign_in=token_sign_in, **extra)
        )
        (tmp / "roles.yaml").write_text(ROLES)
        (tmp / "roles.yaml").chmod(0o600)
        secret = {"identity_env": {"GATEWAY_OIDC_CLIENT_SECRET": WEB_SECRET}} if web else {}
        gateway = build_gateway(tmp, sim, rules, web_ui=web, **secret)
        token = create_token(
            gateway.store, "ops-admin", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH
        )[0]
        cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
        config = EdgeConfig.for_https([f"localhost:{port}"])
        app = build_app(gateway, config, web=build_web_app(gateway) if web else None)
        uv = uvicorn_config(
            app, config, host="127.0.0.1", port=0, ssl_context=server_context(cert.cert, cert.key)
        )
        server = GatewayServer(uv, gateway, app.state.in_flight)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="gateway-idp", daemon=True
        )
        thread.start()
        wait_until(lambda: server.started or not thread.is_alive(), timeout=20, what="server start")
        assert server.started, "the server failed to start (see the log)"
        served = IdentityServed(server, thread, gateway, cert, provider, token, port)
        try:
            yield served
        finally:
            served.stop()
    finally:
        sock.close()
        if own:
            provider.stop()
