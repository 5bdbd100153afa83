"""/metrics and /audit/* need the role's right and, for a scope-limited JWT, the scope vsphere:audit: a JWT
with an empty scope (or only vsphere:read) gets 403 ``insufficient_scope`` with the step-up challenge and
an audited ``refused`` row; a gateway token, or a JWT from an issuer that does not enforce scopes, is
judged by its role alone. Against the real HTTPS server and a loopback issuer whose keys carry no alg."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from support.httpserver import FAST_HASH, audit_rows
from support.jwks_issuer import IssuerServed, issuer_gateway
from support.simulator import Simulator

from gateway.auth.tokens import create_token

AUDIT_PATHS = ("/audit/checkpoint", "/audit/proof/inclusion?seq=1", "/audit/proof/consistency?old_size=1")


@pytest.fixture(scope="module")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IssuerServed]:
    with issuer_gateway(tmp_path_factory.mktemp("scopes"), sim_vc1) as running:
        yield running


def get(served: IssuerServed, path: str, token: str) -> httpx2.Response:
    tls = ssl.create_default_context(cafile=str(served.cert.cert))
    with httpx2.Client(base_url=served.base, verify=tls, timeout=30) as http:
        return http.get(path, headers={"Authorization": f"Bearer {token}"})


def jwt_for(served: IssuerServed, **claims: object) -> str:
    return served.issuer.sign(served.issuer.claims(**claims))


def refused_rows(served: IssuerServed, path: str) -> list[dict[str, object]]:
    return [r for r in audit_rows(served.gateway) if r.get("phase") == "refused" and r.get("path") == path]


@pytest.mark.parametrize("scope", ["", "vsphere:read", "vsphere:read vsphere:write vsphere:destructive"])
@pytest.mark.parametrize("path", ["/metrics", *AUDIT_PATHS])
def test_a_jwt_without_the_audit_scope_is_403_insufficient_scope(served: IssuerServed, path: str,
                                                                 scope: str) -> None:
    """The role (reader: audit own) allows it; the token's scope does not. Used to be 200."""
    before = len(refused_rows(served, path.split("?")[0]))
    answer = get(served, path, jwt_for(served, scope=scope))
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "insufficient_scope" and "vsphere:audit" in error["message"], error
    challenge = answer.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="vsphere:audit"' in challenge, challenge
    assert "resource_metadata=" in challenge
    rows = refused_rows(served, path.split("?")[0])
    assert len(rows) == before + 1 and rows[-1]["error_code"] == "insufficient_scope", rows[-1:]
    assert rows[-1]["caller"] == "agent-audit" and "caller_key" in rows[-1]


@pytest.mark.parametrize("path", ["/metrics", *AUDIT_PATHS])
def test_the_audit_scope_and_the_role_right_let_it_read(served: IssuerServed, path: str) -> None:
    answer = get(served, path, jwt_for(served, scope="vsphere:read vsphere:audit"))
    assert answer.status_code != 403 and answer.status_code < 500, answer.text  # 404 until a checkpoint


@pytest.mark.parametrize("path", AUDIT_PATHS)
def test_the_scope_does_not_replace_the_roles_right(served: IssuerServed, path: str) -> None:
    """lab-operator has no audit right: the scope alone is not enough."""
    answer = get(served, path, jwt_for(served, groups=["ops"], scope="vsphere:audit"))
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden", answer.text


def test_a_gateway_token_is_judged_by_its_role_alone(served: IssuerServed) -> None:
    assert get(served, "/metrics", served.token).status_code == 200
    ghost = create_token(served.gateway.store, "ghost-holder", "ghost", expires_in=None, now=time.time(),
                         hasher=FAST_HASH)[0]
    answer = get(served, "/metrics", ghost)
    assert answer.status_code == 403 and "'ghost' is not defined" in answer.json()["error"]["message"]
    assert refused_rows(served, "/metrics")[-1]["caller"] == "ghost-holder"


def test_the_protected_resource_metadata_names_the_audit_scope(served: IssuerServed) -> None:
    tls = ssl.create_default_context(cafile=str(served.cert.cert))
    with httpx2.Client(base_url=served.base, verify=tls, timeout=30) as http:
        doc = http.get("/.well-known/oauth-protected-resource/mcp").json()
    assert "vsphere:audit" in doc["scopes_supported"]


def test_an_issuer_that_does_not_enforce_scopes_leaves_it_to_the_role(sim_vc1: Simulator,
                                                                      tmp_path: Path) -> None:
    """enforce_scopes: false means no scope narrows anything (Principal.scopes is None): the role decides,
    as for tools."""
    with issuer_gateway(tmp_path, sim_vc1, enforce_scopes=False) as served:
        assert get(served, "/metrics", jwt_for(served, scope="")).status_code == 200
        denied = get(served, "/audit/checkpoint", jwt_for(served, groups=["ops"], scope=""))
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
