"""People are people, and a person is their (issuer, ``sub``): in headless Chromium through the real
OpenID provider's own login page (oidc-provider under Node) in front of the real HTTPS server and the
simulator.

- with ``principal_claim: email``, a person who approved, then signs in again after their email claim
  changed (same issuer and ``sub``), cannot give the second of two approvals; nothing runs;
- a reason of zero-width spaces is no reason where the rule wants one (refused, audited);
- an ID token that is an application's (``sub`` equal to the page's client id, or ``idtyp: app``) does
  not sign in to the page.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from playwright.sync_api import Browser, Page
from support import httpserver, oidc_provider
from support.answers import answer_of
from support.httpserver import audit_rows
from support.oidc_provider import IdentityServed, identity_gateway
from support.simulator import MakeSimulator, count_vms_named, pyvmomi_connect

pytestmark = [pytest.mark.browser, pytest.mark.oidc]
VM = "DC0_C0_RP0_VM0"
GATED = {"defaults": {"read": "allow", "write": "allow", "destructive": "allow"},
         "targets": {"vc1": {"require_web_approval": True, "approvals_required": 2, "reason_required": True}}}
ANN = {"email": "ann@old.example", "groups": ["vsphere-approvers"]}


@contextmanager
def gated_gateway(tmp: Path, sim: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[IdentityServed]:
    """The identity gateway with the page, ``principal_claim: email``, and vc1 needing two approvals with
    a reason each; the person ``ann`` at the provider."""
    from support.simulator import complete_rules

    plain_yaml, plain_build = oidc_provider.identity_yaml, httpserver.build_gateway

    def by_email(provider: Any, resource: str, **kw: Any) -> str:
        return plain_yaml(provider, resource, **{**kw, "principal_claim": "email"})

    def gated(tmp: Path, sim: Any, rules: Any = None, **kw: Any) -> Any:
        return plain_build(tmp, sim, complete_rules(GATED), **kw)

    monkeypatch.setattr(oidc_provider, "identity_yaml", by_email)
    monkeypatch.setattr(httpserver, "build_gateway", gated)
    monkeypatch.setitem(oidc_provider.USERS, "ann", dict(ANN))
    for user, claims in {"gateway-web": {"email": "app@example.com", "groups": ["vsphere-approvers"]},
                         "app-bot": {"email": "bot@example.com", "groups": ["vsphere-approvers"],
                                     "extra": {"idtyp": "app"}}}.items():
        monkeypatch.setitem(oidc_provider.USERS, user, claims)
    with identity_gateway(tmp, sim, web=True) as served:
        yield served


def propose_delete(served: IdentityServed) -> dict[str, Any]:
    """The gateway's admin token proposes deleting ``VM`` over MCP (in a thread of its own: the browser's
    API is synchronous)."""
    async def go() -> dict[str, Any]:
        http = httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(served.cert.cert)), timeout=60,
                                  headers={"Authorization": f"Bearer {served.token}"})
        transport = streamable_http_client(f"{served.base}/mcp", http_client=http)
        async with http, Client(transport, mode="legacy") as client:
            return answer_of(await client.call_tool("delete_vm", {"target": "vc1", "vm": VM,
                                                                  "force_power_off": True}))

    with ThreadPoolExecutor(1) as pool:
        body = pool.submit(asyncio.run, go()).result()
    assert body.get("state") == "pending", body
    return body


def sso_login(browser: Browser, served: IdentityServed, login: str) -> Page:
    context = browser.new_context(base_url=served.base, ignore_https_errors=True)
    page = context.new_page()
    page.goto("/ui/")
    page.click("#sso-sign-in")
    page.wait_for_url(f"{served.provider.issuer}/**")  # the provider's own login page
    page.fill("input[name=login]", login)
    page.fill("input[name=password]", "any password")
    page.click("button[type=submit]")
    if page.url.startswith(served.provider.issuer):  # its consent page
        page.click("button[type=submit]")
    page.wait_for_url(f"{served.base}/ui/**")
    return page


def approve(page: Page, proposal_id: str, reason: str) -> dict[str, Any]:
    """Approve through the page's own API, as its button does: status and body."""
    answer: dict[str, Any] = page.evaluate(
        """async ([pid, reason]) => {
            const session = await (await fetch('api/session')).json();
            const r = await fetch(`api/proposals/${pid}/approve`, {method: 'POST',
                headers: {'content-type': 'application/json', 'x-csrf-token': session.csrf},
                body: JSON.stringify({reason})});
            return {status: r.status, body: await r.json()};
        }""", [proposal_id, reason])
    return answer


def test_one_person_under_a_new_email_gives_one_approval(
    browser: Browser, tmp_path: Path, make_simulator: MakeSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_simulator(vms=2)
    with gated_gateway(tmp_path, sim, monkeypatch) as served:
        proposal = propose_delete(served)
        first = sso_login(browser, served, "ann")
        once = approve(first, proposal["proposal_id"], "ticket OPS-1")
        first.context.close()
        monkeypatch.setitem(oidc_provider.USERS, "ann", {**ANN, "email": "ann@new.example"})
        served.provider.stop()
        served.provider.start()  # same port and keys; ann's email claim now says ann@new.example
        again = sso_login(browser, served, "ann")
        shown = again.evaluate("fetch('api/session').then(r => r.json())")
        twice = approve(again, proposal["proposal_id"], "ticket OPS-1 again")
        again.context.close()
        stored = served.gateway.store.get_proposal(proposal["proposal_id"])
        rows = audit_rows(served.gateway)
        issuer = served.provider.issuer
    assert once["status"] == 200, once
    assert shown["name"] == "ann@new.example", shown  # the new email is what the page shows
    assert twice["status"] == 403 and twice["body"]["error"]["reason_code"] == "already_approved", twice
    assert stored is not None and stored.state == "pending"
    assert count_vms_named(pyvmomi_connect(sim), VM) == 1  # nothing ran
    signed = [r for r in rows if r.get("phase") == "web_sign_in" and r.get("via") == "sso"]
    assert {r["caller"] for r in signed} == {"ann@old.example", "ann@new.example"}
    assert {r.get("subject") for r in signed} == {"ann"} and {r.get("issuer") for r in signed} == {issuer}


def test_a_reason_of_zero_width_spaces_is_no_reason(
    browser: Browser, tmp_path: Path, make_simulator: MakeSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = make_simulator(vms=2)
    with gated_gateway(tmp_path, sim, monkeypatch) as served:
        proposal = propose_delete(served)
        page = sso_login(browser, served, "ann")
        blank = approve(page, proposal["proposal_id"], "\u200b\u200b")
        page.context.close()
        stored = served.gateway.store.get_proposal(proposal["proposal_id"])
        rows = [r for r in audit_rows(served.gateway) if r.get("proposal_id") == proposal["proposal_id"]]
    assert blank["status"] in (400, 403) and blank["body"]["error"]["code"] == "reason_required", blank
    assert stored is not None and stored.approvals == ()
    assert any(r.get("error_code") == "reason_required" for r in rows), rows


@pytest.mark.parametrize("login", ["gateway-web", "app-bot"], ids=["sub is the client id", "idtyp app"])
def test_an_applications_id_token_does_not_sign_in_to_the_page(
    browser: Browser, tmp_path: Path, make_simulator: MakeSimulator, monkeypatch: pytest.MonkeyPatch,
    login: str,
) -> None:
    sim = make_simulator(vms=1)
    with gated_gateway(tmp_path, sim, monkeypatch) as served:
        page = sso_login(browser, served, login)
        text = page.content()
        info = page.evaluate("fetch('/ui/api/session').then(r => r.json())")
        page.context.close()
        refused = [r for r in audit_rows(served.gateway) if r.get("phase") == "web_sign_in_refused"]
    assert info["signed_in"] is False, info
    assert "application, not a person" in text
    assert refused and refused[-1]["reason_code"] == "agent_identity"
