"""gateway.web.sso_routes: who an SSO session signs in, its cookies' names and paths, and refused sign-ins."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from starlette.requests import Request

from gateway.auth.principal import CallerKey
from gateway.errors import ConfigError
from gateway.vocabulary import Kind
from gateway.web.session import SessionStore, WebSession
from gateway.web.sso_routes import BINDING_COOKIE, SSO_SESSION, SsoRoutes, sign_on_for, sso_principal

ALICE = CallerKey.person("https://idp.example", "alice")


def web_session(token_id: str, caller_key: str | None) -> WebSession:
    return WebSession(id="sid", token_id=token_id, name="Alice", csrf="c", created_at=0.0, expires_at=10.0,
                      last_seen=0.0, caller_key=caller_key)


def test_an_sso_session_signs_in_its_person_with_the_mapped_role() -> None:
    person = sso_principal(web_session(f"{SSO_SESSION}lead", str(ALICE)), "web")
    assert person is not None
    assert (person.name, person.role, person.token_id, person.surface) == ("Alice", "lead", None, "web")
    assert person.kind is Kind.PERSON and person.key == ALICE


@pytest.mark.parametrize(("token_id", "caller_key"), [
    ("tok1", str(ALICE)),                              # a token's session
    (f"{SSO_SESSION}lead", None),                      # kept before keys were
    (f"{SSO_SESSION}lead", str(CallerKey.token("t"))),  # not a person's key
    (f"{SSO_SESSION}lead", "garbage"),
])
def test_other_sessions_sign_in_no_sso_person(token_id: str, caller_key: str | None) -> None:
    assert sso_principal(web_session(token_id, caller_key), "web") is None


def test_no_identity_or_no_web_sign_in_means_no_sso() -> None:
    assert sign_on_for(None, {}) is None
    assert sign_on_for(SimpleNamespace(config=SimpleNamespace(web_sign_in=None)), {}) is None  # type: ignore[arg-type]


def test_web_sign_in_without_its_secret_is_a_config_error() -> None:
    web = SimpleNamespace(client_secret_env="GW_SSO")
    identity = SimpleNamespace(config=SimpleNamespace(web_sign_in=web))
    with pytest.raises(ConfigError) as raised:
        sign_on_for(identity, {"GW_SSO": ""})  # type: ignore[arg-type]
    assert raised.value.message == ("identity.yaml's web_sign_in needs the client secret in GW_SSO; set it "
                                    "in the gateway's environment")


# --------------------------------------------------------------------------- the routes


def request(query: str = "", *, scheme: str = "http", host: str = "gw.example:8443", root: str = "/ui",
            cookies: str = "") -> Request:
    headers = [(b"host", host.encode())] + ([(b"cookie", cookies.encode())] if cookies else [])
    scope = {"type": "http", "method": "GET", "scheme": scheme, "path": "/ui/sso/callback", "root_path": root,
             "headers": headers, "query_string": query.encode(), "server": ("gw.example", 8443)}
    return Request(scope)


class Audit:
    def __init__(self) -> None:
        self.rows: list[tuple[str, Any, dict[str, Any]]] = []

    async def __call__(self, phase: str, principal: Any, **fields: Any) -> None:
        self.rows.append((phase, principal, fields))


def routes(secure: bool, audit: Audit | None = None) -> SsoRoutes:
    return SsoRoutes(None, SessionStore(), secure=lambda _r: secure,  # type: ignore[arg-type]
                     cookie_path=lambda _r: "/ui", audit=audit or Audit(), role_known=lambda _p: True)


def test_the_routes() -> None:
    assert [(r.path, r.methods) for r in routes(False).routes()] == [
        ("/sso/start", {"GET", "HEAD"}), ("/sso/callback", {"GET", "HEAD"})]


@pytest.mark.parametrize(("secure", "name"), [(True, f"__Host-{BINDING_COOKIE}"), (False, BINDING_COOKIE)])
def test_the_binding_cookie_is_host_pinned_on_https(secure: bool, name: str) -> None:
    assert routes(secure)._binding_name(request()) == name


@pytest.mark.parametrize(("scheme", "host", "root", "uri"), [
    ("https", "gw.example", "/ui", "https://gw.example/ui/sso/callback"),
    ("http", "localhost:8080", "", "http://localhost:8080/sso/callback"),
])
def test_the_redirect_uri_is_the_pages_own(scheme: str, host: str, root: str, uri: str) -> None:
    assert routes(False)._redirect_uri(request(scheme=scheme, host=host, root=root)) == uri


def test_a_provider_error_is_refused_and_audited() -> None:
    audit = Audit()
    response = anyio.run(routes(False, audit).callback, request("error=access_denied&state=s"))
    assert response.status_code == 401
    body = json.loads(bytes(response.body))
    message = "the identity provider did not sign you in (access_denied); try again"
    assert body == {"error": {"code": "unauthorized", "reason_code": "sso_failed", "message": message}}
    ((phase, who, fields),) = audit.rows
    assert phase == "web_sign_in_refused" and who.kind is Kind.PERSON and who.surface == "web"
    assert fields == {"error_code": "unauthorized", "reason_code": "sso_failed"}


def test_a_long_provider_error_is_cut() -> None:
    response = anyio.run(routes(True).callback, request("error=" + "x" * 500))
    message = json.loads(bytes(response.body))["error"]["message"]
    assert f"({'x' * 80})" in message
