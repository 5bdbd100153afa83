"""/readyz tells a stranger its status and nothing else: no count of targets or open breakers, no reasons;
a valid token whose role has the /metrics right (and, for a JWT, the scope vsphere:audit) reads the
detail; /healthz answers everyone. Against the real HTTPS server and a loopback issuer."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator

import httpx2
import pytest
from support.httpserver import FAST_HASH, audit_rows
from support.jwks_issuer import IssuerServed, issuer_gateway
from support.simulator import Simulator, wait_until

from gateway.auth.tokens import create_token


@pytest.fixture(scope="module")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IssuerServed]:
    with issuer_gateway(tmp_path_factory.mktemp("readyz"), sim_vc1) as running:
        yield running


def get(served: IssuerServed, path: str, token: str | None = None) -> httpx2.Response:
    tls = ssl.create_default_context(cafile=str(served.cert.cert))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx2.Client(base_url=served.base, verify=tls, timeout=30) as http:
        return http.get(path, headers=headers)


def test_without_a_token_the_status_and_nothing_else(served: IssuerServed) -> None:
    """Used to carry circuit_breakers: {targets, open} for anyone."""
    answer = get(served, "/readyz")
    assert answer.status_code == 200 and answer.json() == {"status": "ready"}, answer.text


def test_a_token_with_the_metrics_right_reads_the_detail(served: IssuerServed) -> None:
    answer = get(served, "/readyz", served.token)
    assert answer.status_code == 200
    rules = {"status": "ok", "file": str(served.gateway.policy.path)}
    assert answer.json() == {"status": "ready", "circuit_breakers": {"targets": 1, "open": 0}, "rules": rules}
    jwt = served.issuer.sign(served.issuer.claims(scope="vsphere:audit"))
    assert get(served, "/readyz", jwt).json()["circuit_breakers"] == {"targets": 1, "open": 0}


def test_a_token_without_the_right_gets_the_status_only(served: IssuerServed) -> None:
    ghost = create_token(served.gateway.store, "ghost-ready", "ghost", expires_in=None, now=time.time(),
                         hasher=FAST_HASH)[0]
    assert get(served, "/readyz", ghost).json() == {"status": "ready"}
    no_scope = served.issuer.sign(served.issuer.claims(scope="vsphere:read"))
    assert get(served, "/readyz", no_scope).json() == {"status": "ready"}


def test_a_refused_token_gets_the_status_only_and_is_audited(served: IssuerServed) -> None:
    def refused() -> int:
        return sum(r.get("count", 0) for r in audit_rows(served.gateway) if r.get("phase") == "token_refused")

    before = refused()
    assert get(served, "/readyz", "gwt_" + "x" * 40).json() == {"status": "ready"}
    expired = served.issuer.sign(served.issuer.claims(exp=int(time.time()) - 600, iat=int(time.time()) - 900))
    assert get(served, "/readyz", expired).json() == {"status": "ready"}
    wait_until(lambda: refused() >= before + 2, timeout=20, what="the token_refused rows")


def test_not_ready_says_why_only_to_a_token_with_the_right(served: IssuerServed) -> None:
    served.gateway.draining = True
    try:
        anonymous = get(served, "/readyz")
        detail = get(served, "/readyz", served.token)
    finally:
        served.gateway.draining = False
    assert anonymous.status_code == 503 and anonymous.json() == {"status": "not ready"}
    assert detail.status_code == 503 and detail.json()["reasons"] == ["shutting down"]


def test_the_gateway_may_add_to_the_detail(served: IssuerServed) -> None:
    """The place for the policy file's state (``readiness_detail``): shown with the detail only."""
    served.gateway.readiness_detail = lambda: {"rules": {"state": "broken", "since": 1.0},
                                               "status": "overridden?"}
    try:
        detail = get(served, "/readyz", served.token).json()
        anonymous = get(served, "/readyz").json()
    finally:
        del served.gateway.readiness_detail
    assert detail["rules"] == {"state": "broken", "since": 1.0} and detail["status"] == "ready"
    assert anonymous == {"status": "ready"}


@pytest.mark.parametrize("token", [None, "gwt_nonsense", "not.a.jwt"])
def test_healthz_answers_everyone(served: IssuerServed, token: str | None) -> None:
    answer = get(served, "/healthz", token)
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}


def test_a_broken_rules_edit_is_not_ready_and_the_detail_says_since_when(served: IssuerServed) -> None:
    """A rules.yaml broken by an edit refuses every decided call (fail closed), so the replica is not
    ready; the detail names the file, the line and since when; a stranger still reads the status alone."""
    path = served.gateway.policy.path
    good = path.read_text() if path.exists() else None
    try:
        path.write_text("rules:\n  - deny: [power_off_vm\n")
        answer = get(served, "/readyz", served.token)
        assert answer.status_code == 503, answer.text
        rules = answer.json()["rules"]
        assert rules["status"] == "broken" and rules["since"] and f"{path}:" in rules["error"], rules
        assert get(served, "/readyz").json() == {"status": "not ready"}
    finally:
        if good is None:
            path.unlink()
        else:
            path.write_text(good)
    assert get(served, "/readyz", served.token).json()["rules"]["status"] == "ok"
