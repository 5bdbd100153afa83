"""What an identity provider's JWT costs per request over a gateway token already proven in this process.

Plain script: ``python bench/jwt_auth.py [--iterations N]``. In one run and one event loop, interleaved:
``TokenAuthenticator.authenticate`` of a cached ``gwt_`` token (what the edge does for every request
after the first), and ``IdentityService.authenticate`` of an RS256 access token (signature, iss, aud,
exp/nbf, claims -> role and scopes) with its issuer's keys cached: they were fetched once, over real
HTTP, from a small issuer this script serves on loopback (metadata and JWKS). Prints p50 and p90 of
each and the added p50 of the JWT path.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from gateway.auth.tokens import TokenAuthenticator, create_token
from gateway.identity.config import IdentityConfig, IssuerConfig
from gateway.identity.service import IdentityService
from gateway.store import SqliteStore


def _issuer(jwk: dict[str, Any]) -> tuple[http.server.ThreadingHTTPServer, str]:
    documents: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = documents.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    issuer = f"http://127.0.0.1:{server.server_address[1]}"
    documents["/.well-known/openid-configuration"] = json.dumps(
        {"issuer": issuer, "jwks_uri": f"{issuer}/jwks"}).encode()
    documents["/jwks"] = json.dumps({"keys": [jwk]}).encode()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, issuer


async def _run(iterations: int) -> dict[str, list[float]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = {**json.loads(RSAAlgorithm.to_jwk(key)), "kid": "bench", "alg": "RS256", "use": "sig"}
    public = {k: v for k, v in jwk.items() if k not in ("d", "p", "q", "dp", "dq", "qi")}
    server, issuer = _issuer(public)
    resource = "https://gateway.example.com/mcp"
    service = IdentityService(IdentityConfig(resource, (IssuerConfig(
        issuer=issuer, audience=resource, principal_claim="sub", roles_claim="groups",
        roles=(("ops", "reader"),)),)))
    now = int(time.time())
    access = jwt.encode({"iss": issuer, "aud": resource, "sub": "bot", "client_id": "bot", "groups": ["ops"],
                         "scope": "vsphere:read", "iat": now, "exp": now + 3600, "jti": "j"}, key,
                        algorithm="RS256", headers={"kid": "bench"})
    samples: dict[str, list[float]] = {"gwt_ token (cached)": [], "JWT (keys cached)": []}
    try:
        with tempfile.TemporaryDirectory() as tmp, SqliteStore(Path(tmp) / "state.db") as store:
            token, _rec = create_token(store, "bench", "reader", expires_in=None, now=time.time())
            tokens = TokenAuthenticator(store)
            assert (await tokens.authenticate(token, "bench")).principal is not None  # argon2 once
            assert (await service.authenticate(access, surface="https")).principal.name == "bot"  # keys once
            for _ in range(iterations):
                start = time.perf_counter()
                await tokens.authenticate(token, "bench")
                samples["gwt_ token (cached)"].append(time.perf_counter() - start)
                start = time.perf_counter()
                await service.authenticate(access, surface="https")
                samples["JWT (keys cached)"].append(time.perf_counter() - start)
            assert service.keys[issuer].fetches == 1, "the keys were fetched more than once"
    finally:
        service.close()
        server.shutdown()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3000, help="requests of each kind to time")
    args = parser.parse_args(argv)
    samples = asyncio.run(_run(args.iterations))
    print(f"{'path':<24}{'p50':>12}{'p90':>12}")
    p50 = {}
    for label, values in samples.items():
        values.sort()
        p50[label] = statistics.median(values)
        print(f"{label:<24}{p50[label] * 1e6:>9.1f} us{values[int(len(values) * 0.9)] * 1e6:>9.1f} us")
    added = p50["JWT (keys cached)"] - p50["gwt_ token (cached)"]
    print(f"a JWT-authenticated request adds {added * 1e6:.1f} us (p50) over a cached gateway token check "
          f"({args.iterations} of each, interleaved, one run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
