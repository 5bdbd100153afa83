"""The gateway as an OAuth 2.1 resource server against a real OpenID provider (oidc-provider under Node,
tests/oidc/provider.mjs) on loopback: the MCP SDK's own OAuth client from nothing, protected resource
metadata, the challenges, and each refusal (tokens the provider issues, and tokens signed here with the
provider's own keys when a claim must be wrong)."""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from support.httpserver import audit_rows
from support.oidc_provider import AGENT_SECRET, IdentityServed, OidcProvider, identity_gateway
from support.simulator import Simulator
from support.tier import needs

pytestmark = pytest.mark.anyio


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@pytest.fixture(scope="module")
@needs("oidc")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityServed]:
    with identity_gateway(tmp_path_factory.mktemp("identity"), sim_vc1) as running:
        yield running


def http(served: IdentityServed, token: str | None = None, **kwargs: Any) -> httpx2.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.AsyncClient(
        base_url=served.base,
        verify=ssl.create_default_context(cafile=str(served.cert.cert)),
        headers=headers,
        timeout=30,
        **kwargs,
    )


def oauth_client(
    served: IdentityServed, client_id: str, scope: str | None = None
) -> ClientCredentialsOAuthProvider:
    return ClientCredentialsOAuthProvider(
        f"{served.base}/mcp",
        MemoryStorage(),
        client_id,
        AGENT_SECRET,
        scope=scope,
        issuer=served.provider.issuer,
    )


async def tools_of(served: IdentityServed, auth: httpx2.Auth) -> list[str]:
    """tools/list, then one read (list_targets) through the whole call path."""
    async with http(served, auth=auth) as client:
        transport = streamable_http_client(f"{served.base}/mcp", http_client=client)
        async with Client(transport) as mcp:
            names = sorted(t.name for t in (await mcp.list_tools()).tools)
            result = await mcp.call_tool("list_targets", {})
            assert not result.is_error and "vc1" in result.content[0].text
            return names


#: the first message of a session: answered 200 once the caller is authenticated
LIST = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
MCP_HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": "2025-11-25",
}


async def post_mcp(served: IdentityServed, token: str | None, body: Any = LIST) -> httpx2.Response:
    async with http(served, token) as client:
        return await client.post("/mcp", json=body, headers=MCP_HEADERS)


def call(tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": tool, "arguments": args or {}},
    }


# ---------------------------------------------------------------------------- discovery


async def test_protected_resource_metadata_names_the_provider_and_scopes(served: IdentityServed) -> None:
    async with http(served) as client:
        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            answer = await client.get(path)
            assert answer.status_code == 200, (path, answer.text)
            doc = answer.json()
            assert doc["resource"] == f"{served.base}/mcp"
            assert doc["authorization_servers"] == [served.provider.issuer]
            assert doc["scopes_supported"] == ["vsphere:read", "vsphere:write", "vsphere:destructive",
                                               "vsphere:audit"]


async def test_every_401_points_at_the_metadata(served: IdentityServed) -> None:
    expected = f'resource_metadata="{served.base}/.well-known/oauth-protected-resource/mcp"'
    for token in (
        None,
        "gwt_aaaaaaaaaaaa_" + "b" * 43,
        "not-a-jwt",
        served.provider.sign(served.provider.claims(aud="https://elsewhere.example/mcp")),
    ):
        answer = await post_mcp(served, token)
        assert answer.status_code == 401, answer.text
        challenge = answer.headers["www-authenticate"]
        assert (
            challenge.startswith("Bearer ") and expected in challenge and 'scope="vsphere:read"' in challenge
        )


# ---------------------------------------------------------------------------- the SDK's client from nothing


async def test_sdk_oauth_client_connects_from_nothing_and_sees_its_roles_tools(
    served: IdentityServed,
) -> None:
    ops = await tools_of(served, oauth_client(served, "agent-ops"))
    reader = await tools_of(served, oauth_client(served, "agent-reader"))
    assert "power_on_vm" in ops and "list_vms" in ops  # lab-operator: reads plus two writes
    assert "list_vms" in reader and "power_on_vm" not in reader  # reader: reads only
    rows = [r for r in audit_rows(served.gateway) if r.get("phase") == "identity_verified"]
    mine = [r for r in rows if r["caller"] == "agent-ops"]
    assert mine and mine[-1]["issuer"] == served.provider.issuer and mine[-1]["client_id"] == "agent-ops"
    assert mine[-1]["role"] == "lab-operator" and len(mine[-1]["jti_sha256"]) == 64
    calls = [r for r in audit_rows(served.gateway) if r.get("tool") == "list_targets"]
    assert {"agent-ops", "agent-reader"} <= {r.get("caller") for r in calls}
    log = served.gateway.settings.audit_log.read_text()
    assert served.provider.output and "eyJ" not in log  # no JWT ever reaches the audit


async def test_identity_yaml_load_is_audited(served: IdentityServed) -> None:
    loads = [r for r in audit_rows(served.gateway, config_loads=True) if r.get("phase") == "config_reload"]
    assert any(r.get("file") == "identity" and r.get("outcome") == "loaded" for r in loads), loads


async def test_gateway_tokens_keep_working_beside(served: IdentityServed) -> None:
    answer = await post_mcp(served, served.token)
    assert answer.status_code == 200, answer.text


# ---------------------------------------------------------------------------- scopes


async def test_missing_scope_is_403_with_a_step_up_challenge(served: IdentityServed) -> None:
    p = served.provider
    token = p.sign(p.claims(scope="vsphere:read"))
    refused = await post_mcp(served, token, call("power_on_vm", {"target": "vc1", "vm": "x"}))
    assert refused.status_code == 403, refused.text
    assert refused.headers["www-authenticate"].startswith('Bearer error="insufficient_scope"')
    assert 'scope="vsphere:write"' in refused.headers["www-authenticate"]
    allowed = await post_mcp(served, p.sign(p.claims()), call("power_on_vm", {"target": "vc1", "vm": "x"}))
    assert allowed.status_code != 403, allowed.text  # the scope is there: the gateway decides from here


# ---------------------------------------------------------------------------- refusals


def _unsigned(claims: dict[str, Any]) -> str:
    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def _hs256_with_public_key(p: OidcProvider) -> str:
    """The classic confusion: HMAC keyed with the provider's public key (PEM)."""
    from cryptography.hazmat.primitives import serialization

    pem = (
        p.keys[0][0]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "kid": p.keys[0][1]["kid"]}).encode())
    body = base64.urlsafe_b64encode(json.dumps(p.claims()).encode())
    signing = header.rstrip(b"=") + b"." + body.rstrip(b"=")
    import hashlib
    import hmac

    mac = base64.urlsafe_b64encode(hmac.new(pem, signing, hashlib.sha256).digest()).rstrip(b"=")
    return (signing + b"." + mac).decode()


#: each refusal: the token, and what the refusal must say (the reason, not just "401")
REFUSALS = {
    "wrong_audience": (
        lambda p: p.sign(p.claims(aud="https://other.example/mcp")),
        "not meant for this gateway",
    ),
    "wrong_issuer": (lambda p: p.sign(p.claims(iss="https://login.evil.example")), "are not trusted here"),
    "expired": (
        lambda p: p.sign(p.claims(exp=int(time.time()) - 600, iat=int(time.time()) - 900)),
        "has expired",
    ),
    "not_yet_valid": (lambda p: p.sign(p.claims(nbf=int(time.time()) + 600)), "not valid yet"),
    "alg_none": (lambda p: _unsigned(p.claims()), "signed with 'none' are refused"),
    "hs256_public_key": (_hs256_with_public_key, "signed with 'HS256' are refused"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
async def test_refused_tokens(served: IdentityServed, case: str) -> None:
    make, why = REFUSALS[case]
    answer = await post_mcp(served, make(served.provider))
    assert answer.status_code == 401, answer.text
    assert 'error="invalid_token"' in answer.headers["www-authenticate"]
    assert answer.json()["error"]["code"] == "unauthorized" and why in answer.json()["error"]["message"]


async def test_unmapped_group_is_403(served: IdentityServed) -> None:
    p = served.provider
    answer = await post_mcp(served, p.sign(p.claims(groups=["marketing"])))
    assert answer.status_code == 403, answer.text
    assert "maps to no role" in answer.json()["error"]["message"]
    auth = oauth_client(served, "agent-stranger")
    async with http(served, auth=auth) as client:
        real = await client.post("/mcp", json=LIST, headers=MCP_HEADERS)
    assert real.status_code == 403, real.text  # the provider's own token for a group nothing maps
    body, _type = served.gateway.metrics.exposition(None)
    assert 'gateway_auth_failures_total{reason="idp_unmapped"}' in body.decode()


async def test_acting_for_a_person_is_named_for_them(served: IdentityServed) -> None:
    p = served.provider
    token = p.sign(p.claims(sub="rita", client_id="claude-code", groups=["vsphere-ops"]))
    assert (await post_mcp(served, token)).status_code == 200
    rows = [r for r in audit_rows(served.gateway) if r.get("phase") == "identity_verified"]
    assert any(r["caller"] == "rita via claude-code" and r["acting_for"] == "rita" for r in rows)


# ---------------------------------------------------------------------------- keys: rotation, outage


def _keys(served: IdentityServed) -> Any:
    return served.gateway.identity.keys[served.provider.issuer]


@pytest.mark.oidc
async def test_unknown_kid_after_rotation_refetches_once_then_accepts(
    sim_vc1: Simulator, tmp_path: Path
) -> None:
    with identity_gateway(tmp_path, sim_vc1) as served:
        p = served.provider
        assert (await post_mcp(served, p.sign(p.claims()))).status_code == 200
        fetches = _keys(served).fetches
        p.rotate()
        answer = await post_mcp(served, p.sign(p.claims()))
        assert answer.status_code == 200, answer.text
        assert _keys(served).fetches == fetches + 1
        # a kid nobody publishes: no second refetch within the interval, refused
        stray = p.sign(p.claims(), headers={"kid": "nobody-publishes-this"})
        assert (await post_mcp(served, stray)).status_code == 401
        assert _keys(served).fetches == fetches + 1


@pytest.mark.oidc
async def test_issuer_unreachable_cached_keys_until_they_expire_then_503(
    sim_vc1: Simulator, tmp_path: Path
) -> None:
    with identity_gateway(tmp_path, sim_vc1, keys_max_age=3) as served:
        p = served.provider
        assert (await post_mcp(served, p.sign(p.claims()))).status_code == 200
        fetched = time.monotonic()
        p.stop()
        assert (await post_mcp(served, p.sign(p.claims()))).status_code == 200  # cached keys still verify
        assert time.monotonic() - fetched < 3

        async def status() -> int:
            return (await post_mcp(served, p.sign(p.claims()))).status_code

        deadline = time.monotonic() + 20
        last = 200
        while time.monotonic() < deadline and last == 200:
            last = await status()
        assert last == 503
        answer = await post_mcp(served, p.sign(p.claims()))
        assert answer.status_code == 503 and p.issuer in answer.json()["error"]["message"]
        assert answer.headers["retry-after"]


@pytest.mark.oidc
async def test_no_keys_ever_is_503_naming_the_issuer(sim_vc1: Simulator, tmp_path: Path) -> None:
    with identity_gateway(tmp_path, sim_vc1) as served:
        p = served.provider
        p.stop()
        answer = await post_mcp(served, p.sign(p.claims()))
        assert answer.status_code == 503, answer.text
        assert p.issuer in answer.json()["error"]["message"]


async def test_gateway_serve_starts_with_identity_yaml_and_no_gateway_token(
    sim_vc1: Simulator, tmp_path: Path
) -> None:
    """The real `gateway serve --web`: identity.yaml is enough to start (no gwt_ token exists), and the
    metadata is served; the provider need not be up for that."""
    import yaml
    from support.httpserver import https_argv, run_serve
    from support.simulator import complete_rules, write_targets

    from gateway.server.edge.tls import create_certificate

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    (home / "rules.yaml").write_text(yaml.safe_dump(complete_rules({"defaults": {"read": "allow"}})))
    issuer = "https://login.example.com/realms/ops"
    (home / "identity.yaml").write_text(
        yaml.safe_dump(
            {
                "resource": "https://localhost/mcp",
                "issuers": [
                    {
                        "issuer": issuer,
                        "principal_claim": "sub",
                        "roles_claim": "groups",
                        "roles": {"ops": "reader"},
                    }
                ],
                "web_sign_in": {
                    "issuer": issuer,
                    "client_id": "gw",
                    "client_secret_env": "GATEWAY_OIDC_CLIENT_SECRET",
                },
            }
        )
    )
    env.update(
        {
            "GATEWAY_HOME": str(home),
            "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
            "GATEWAY_OIDC_CLIENT_SECRET": "s3cret-value",
        }
    )
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert), "--web")
    try:
        base = command.base()
        tls = ssl.create_default_context(cafile=str(cert.cert))
        async with httpx2.AsyncClient(base_url=base, verify=tls) as client:
            doc = (await client.get("/.well-known/oauth-protected-resource/mcp")).json()
            assert doc["authorization_servers"] == [issuer]
            page = (await client.get("/ui/api/session")).json()
            assert page["sso"] is True
    finally:
        command.stop()
    assert "s3cret-value" not in command.output()


async def test_sso_state_is_bound_to_the_browser_and_used_once(served: IdentityServed) -> None:
    """The page's code flow against the real provider's metadata: PKCE S256, state and nonce in the
    request; a wrong state, a replayed binding or a foreign one never reach the code exchange."""
    from urllib.parse import parse_qs, urlsplit

    from support.oidc_provider import WEB_SECRET

    from gateway.identity.service import IdentityRefusal
    from gateway.identity.sso import SignOn, pkce_challenge

    identity = served.gateway.identity
    sign_on = SignOn(identity, identity.config.web_sign_in, WEB_SECRET)
    url, binding = await sign_on.begin(f"{served.base}/ui/sso/callback")
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert url.startswith(served.provider.issuer) and query["code_challenge_method"] == "S256"
    pending = sign_on._pending[binding]
    assert query["code_challenge"] == pkce_challenge(pending.verifier) and query["nonce"] == pending.nonce
    with pytest.raises(IdentityRefusal, match="state does not match"):
        await sign_on.finish(binding, "not-the-state", "some-code")
    with pytest.raises(IdentityRefusal, match="not started in this browser"):
        await sign_on.finish(binding, query["state"], "some-code")  # the binding was taken once already
    _url, other = await sign_on.begin(f"{served.base}/ui/sso/callback")
    with pytest.raises(IdentityRefusal, match="not started in this browser"):
        await sign_on.finish("a-binding-of-another-browser", query["state"], "some-code")
    assert other in sign_on._pending
