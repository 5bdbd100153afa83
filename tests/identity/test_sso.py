"""Single sign-on on the approval page, in headless Chromium through the real OpenID provider's own login
page (oidc-provider under Node, tests/oidc/provider.mjs): a person signs in, gets the page's usual
session cookie, signs out; a person whose groups map to no role is refused; an agent's access token
pasted into the token sign-in is refused and audited."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from playwright.sync_api import Browser, Page, expect
from support.httpserver import audit_rows
from support.oidc_provider import IdentityServed, identity_gateway
from support.simulator import Simulator
from support.tier import needs

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
@needs("oidc")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityServed]:
    with identity_gateway(tmp_path_factory.mktemp("identity-web"), sim_vc1, web=True) as running:
        yield running


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
    return page


def test_a_person_signs_in_with_sso_and_out_again(browser: Browser, served: IdentityServed) -> None:
    page = sso_login(browser, served, "rita")
    page.wait_for_url(f"{served.base}/ui/**")
    expect(page.locator("#who")).to_contain_text("rita")
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["__Host-gw_session"]
    assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Strict"
    info = page.evaluate("fetch('api/session').then(r => r.json())")
    assert info["signed_in"] and info["kind"] == "person" and info["role"] == "approver" and info["csrf"]
    rows = [
        r for r in audit_rows(served.gateway) if r.get("phase") == "web_sign_in" and r.get("via") == "sso"
    ]
    assert rows and rows[-1]["caller"] == "rita" and rows[-1]["issuer"] == served.provider.issuer
    page.click("#sign-out")
    expect(page.locator("#sso-sign-in")).to_be_visible()
    after = page.evaluate("fetch('api/session').then(r => r.json())")
    assert after["signed_in"] is False
    page.context.close()


def test_a_person_whose_groups_map_to_no_role_is_refused(browser: Browser, served: IdentityServed) -> None:
    page = sso_login(browser, served, "mallory")
    page.wait_for_url(f"{served.base}/ui/sso/callback**")
    assert "maps to no role" in page.content()
    info = page.evaluate("fetch('/ui/api/session').then(r => r.json())")
    assert info["signed_in"] is False
    page.context.close()


def test_an_agent_identity_cannot_sign_in_to_the_page(served: IdentityServed) -> None:
    p = served.provider
    token = p.sign(p.claims())  # a client-credentials access token: an agent
    tls = ssl.create_default_context(cafile=str(served.cert.cert))
    with httpx2.Client(base_url=served.base, verify=tls) as client:
        answer = client.post(
            "/ui/api/sign-in",
            json={"token": token},
            headers={"origin": served.base, "sec-fetch-site": "same-origin"},
        )
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["reason_code"] == "agent_identity"
    refused = [r for r in audit_rows(served.gateway) if r.get("phase") == "web_sign_in_refused"]
    assert refused and refused[-1]["reason_code"] == "agent_identity" and refused[-1]["caller"] == "agent-ops"


@pytest.mark.oidc
def test_token_sign_in_can_be_switched_off(sim_vc1: Simulator, tmp_path: Path) -> None:
    with identity_gateway(tmp_path, sim_vc1, web=True, token_sign_in=False) as served:
        tls = ssl.create_default_context(cafile=str(served.cert.cert))
        with httpx2.Client(base_url=served.base, verify=tls) as client:
            info = client.get("/ui/api/session").json()
            assert info["sso"] is True and info["token_sign_in"] is False
            answer = client.post(
                "/ui/api/sign-in",
                json={"token": served.token},
                headers={"origin": served.base, "sec-fetch-site": "same-origin"},
            )
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["reason_code"] == "token_sign_in_off"
