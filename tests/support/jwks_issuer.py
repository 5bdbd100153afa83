"""A small identity provider for tests whose JWKS keys carry no ``alg`` (as Entra ID publishes them), and a
real gateway HTTPS server whose identity.yaml trusts it.

``JwksIssuer`` serves OpenID discovery and a JWKS over loopback HTTP (the gateway accepts ``http://`` for a
loopback issuer) from a thread: one RSA, one EC P-256 and one Ed25519 signing key, none naming its
algorithm, so only the key's type can say what it verifies. ``sign`` makes tokens with any of them (and
any header). ``issuer_gateway`` runs the gateway over a simulator with the approval page and a short
refused-token audit interval, so ``token_refused`` rows are written within a second.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from gateway.auth.tokens import create_token
from gateway.server.edge.app import GatewayServer, build_app, uvicorn_config
from gateway.server.edge.middleware import EdgeConfig
from gateway.server.edge.tls import CertificatePaths, create_certificate, server_context
from support.oidc_provider import free_socket
from support.simulator import wait_until

#: groups -> roles: ops a role without the audit right, auditors the built-in reader (audit: own), admins
GROUPS = {"ops": "lab-operator", "auditors": "reader", "admins": "admin"}
ROLES = """roles:
  lab-operator: {tools: read, allow_write: [], allow_destructive: [], targets: "*", approve: none}
"""


def _public_jwk(private: Any, kid: str) -> dict[str, Any]:
    if isinstance(private, rsa.RSAPrivateKey):
        doc = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    elif isinstance(private, ec.EllipticCurvePrivateKey):
        doc = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    else:
        doc = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
    doc.pop("alg", None)  # the point: nothing but the key's type says what it verifies
    return {**doc, "kid": kid, "use": "sig"}


@dataclass
class JwksIssuer:
    """The provider: ``issuer`` its URL once started, ``keys`` kid -> private key."""

    resource: str
    keys: dict[str, Any] = field(default_factory=dict)
    issuer: str = ""
    _server: ThreadingHTTPServer | None = None

    def documents(self) -> dict[str, Any]:
        return {
            "/.well-known/openid-configuration": {
                "issuer": self.issuer,
                "jwks_uri": f"{self.issuer}/jwks",
                "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token",
                "response_types_supported": ["code"],
            },
            "/jwks": {"keys": [_public_jwk(k, kid) for kid, k in self.keys.items()]},
        }

    def start(self) -> None:
        if not self.keys:
            self.keys = {
                "rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
                "ec-1": ec.generate_private_key(ec.SECP256R1()),
                "ed-1": ed25519.Ed25519PrivateKey.generate(),
            }
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                doc = issuer.documents().get(self.path)
                body = json.dumps(doc).encode() if doc is not None else b"{}"
                self.send_response(200 if doc is not None else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="jwks-issuer", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def claims(self, **overrides: Any) -> dict[str, Any]:
        """A valid access token's claims for the agent ``agent-audit`` (group auditors, scope vsphere:read
        and vsphere:audit); override any."""
        now = int(time.time())
        base = {"iss": self.issuer, "aud": self.resource, "sub": "agent-audit", "client_id": "agent-audit",
                "groups": ["auditors"], "scope": "vsphere:read vsphere:audit", "iat": now, "exp": now + 300,
                "jti": secrets.token_hex(8)}
        return {**base, **overrides}

    def sign(self, claims: Mapping[str, Any], *, kid: str = "rsa-1", algorithm: str | None = None,
             headers: Mapping[str, Any] | None = None) -> str:
        private = self.keys[kid]
        alg = algorithm or {"rsa": "RS256", "ec-": "ES256"}.get(kid[:3], "EdDSA")
        return jwt.encode(dict(claims), private, algorithm=alg, headers={"kid": kid, **(headers or {})})


def identity_yaml(issuer: JwksIssuer, resource: str, **options: Any) -> str:
    entry = {"issuer": issuer.issuer, "principal_claim": "sub", "roles_claim": "groups", "roles": GROUPS,
             **options}
    return yaml.safe_dump({"resource": resource, "issuers": [entry]}, sort_keys=False)


@dataclass
class IssuerServed:
    server: GatewayServer
    thread: threading.Thread
    gateway: Any
    cert: CertificatePaths
    issuer: JwksIssuer
    token: str  # a gateway token (admin) besides the identity provider's
    port: int

    @property
    def base(self) -> str:
        return f"https://localhost:{self.port}"


@contextmanager
def issuer_gateway(tmp: Path, sim: Any, **issuer_options: Any) -> Iterator[IssuerServed]:
    """A gateway over ``sim`` (with the approval page) trusting a fresh ``JwksIssuer``, over HTTPS on
    loopback, auditing refused tokens every 0.2 s."""
    from gateway.web.app import build_web_app
    from support.httpserver import FAST_HASH, build_gateway

    sock = free_socket()
    port = sock.getsockname()[1]
    resource = f"https://localhost:{port}/mcp"
    issuer = JwksIssuer(resource)
    issuer.start()
    try:
        (tmp / "identity.yaml").write_text(identity_yaml(issuer, resource, **issuer_options))
        (tmp / "roles.yaml").write_text(ROLES)
        (tmp / "roles.yaml").chmod(0o600)
        gateway = build_gateway(tmp, sim, web_ui=True)
        token = create_token(gateway.store, "ops-admin", "admin", expires_in=None, now=time.time(),
                             hasher=FAST_HASH)[0]
        cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
        config = EdgeConfig.for_https([f"localhost:{port}"], refusal_audit_seconds=0.2)
        app = build_app(gateway, config, web=build_web_app(gateway))
        uv = uvicorn_config(app, config, host="127.0.0.1", port=0,
                            ssl_context=server_context(cert.cert, cert.key))
        server = GatewayServer(uv, gateway, app.state.in_flight)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="gateway-jwks",
                                  daemon=True)
        thread.start()
        wait_until(lambda: server.started or not thread.is_alive(), timeout=20, what="server start")
        assert server.started, "the server failed to start (see the log)"
        try:
            yield IssuerServed(server, thread, gateway, cert, issuer, token, port)
        finally:
            server.should_exit = True
            thread.join(30)
    finally:
        sock.close()
        issuer.stop()
