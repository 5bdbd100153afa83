"""``identity.yaml`` (``gateway.identity.config``): where it is found, what a valid file gives with its
defaults, and each problem of a broken file reported with its place, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigProblems, load_yaml
from gateway.identity.config import IdentityConfig, identity_file, load_identity, parse_identity

MINIMAL = """resource: https://gw.example/mcp
issuers:
  - issuer: https://idp.example/realms/ops
    principal_claim: email
    roles_claim: groups
    roles: {ops: operator, readers: reader}
"""
WEB = """web_sign_in:
  issuer: https://idp.example/realms/ops
  client_id: vsphere-gateway
  client_secret_env: GATEWAY_OIDC_CLIENT_SECRET
"""


def _parse(text: str) -> IdentityConfig:
    return parse_identity(load_yaml(text, "identity.yaml"), "identity.yaml")


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigProblems) as caught:
        _parse(text)
    return caught.value.problems


def test_identity_file_defaults_under_the_home(tmp_path: Path) -> None:
    assert identity_file(tmp_path, {}) == tmp_path / "identity.yaml"


def test_identity_file_follows_the_variable(tmp_path: Path) -> None:
    assert identity_file(tmp_path, {"GATEWAY_IDENTITY_FILE": "/etc/gw/id.yaml"}) == Path("/etc/gw/id.yaml")
    assert identity_file(tmp_path, {"GATEWAY_IDENTITY_FILE": "~/id.yaml"}) == Path.home() / "id.yaml"
    assert identity_file(tmp_path, {"GATEWAY_IDENTITY_FILE": ""}) == tmp_path / "identity.yaml"


def test_no_file_is_no_identity(tmp_path: Path) -> None:
    assert load_identity(tmp_path / "identity.yaml") is None


def test_an_unreadable_file_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "identity.yaml").mkdir()
    with pytest.raises(ConfigProblems, match="cannot read identity file"):
        load_identity(tmp_path / "identity.yaml")


def test_a_minimal_file_and_its_defaults(tmp_path: Path) -> None:
    (tmp_path / "identity.yaml").write_text(MINIMAL)
    config = load_identity(tmp_path / "identity.yaml")
    assert config is not None
    assert config.resource == "https://gw.example/mcp"
    assert config.web_sign_in is None
    (issuer,) = config.issuers
    assert issuer.issuer == "https://idp.example/realms/ops"
    assert issuer.audience == "https://gw.example/mcp"  # the resource unless given
    assert (issuer.principal_claim, issuer.roles_claim) == ("email", "groups")
    assert issuer.roles == (("ops", "operator"), ("readers", "reader"))
    assert (issuer.ca_file, issuer.enforce_scopes, issuer.keys_max_age_seconds) == (None, True, 3600.0)
    assert issuer.application_claims == ()
    assert issuer.role_places == (f"{tmp_path / 'identity.yaml'}:6:13", f"{tmp_path / 'identity.yaml'}:6:28")


def test_every_optional_issuer_key(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    config = _parse(MINIMAL + f"""    audience: api://gateway
    ca_file: {ca}
    enforce_scopes: false
    keys_max_age_seconds: 120
    application_claims: {{client_type: service}}
""")
    issuer = config.issuers[0]
    assert (issuer.audience, issuer.ca_file, issuer.enforce_scopes) == ("api://gateway", str(ca), False)
    assert issuer.keys_max_age_seconds == 120.0
    assert issuer.application_claims == (("client_type", "service"),)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/realms/x", "http://localhost:9000", "http://[::1]:5556"])
def test_http_issuers_are_accepted_on_loopback_only(url: str) -> None:
    config = _parse(MINIMAL.replace("https://idp.example/realms/ops", url))
    assert config.issuers[0].issuer == url


def test_web_sign_in_and_its_defaults() -> None:
    web = _parse(MINIMAL + WEB).web_sign_in
    assert web is not None
    assert (web.issuer, web.client_id, web.client_secret_env) == (
        "https://idp.example/realms/ops", "vsphere-gateway", "GATEWAY_OIDC_CLIENT_SECRET")
    assert (web.token_sign_in, web.scope) == (True, "openid email profile")


def test_web_sign_in_options() -> None:
    web = _parse(MINIMAL + WEB + "  token_sign_in: false\n  scope: openid groups\n").web_sign_in
    assert web is not None
    assert (web.token_sign_in, web.scope) == (False, "openid groups")


def test_issuer_lookup_by_name() -> None:
    config = _parse(MINIMAL)
    assert config.issuer("https://idp.example/realms/ops") is config.issuers[0]
    assert config.issuer("https://other") is None


BROKEN = [
    ("a list", "- a\n", "identity.yaml:1:1: identity.yaml must be a mapping, got list"),
    ("no resource", MINIMAL.replace("resource: https://gw.example/mcp\n", ""),
     "identity.yaml: the key 'resource' is required"),
    ("unknown top key", MINIMAL + "colour: blue\n", "identity.yaml:7:1: identity.yaml: unknown key 'colour'"),
    ("resource not https", MINIMAL.replace("https://gw.example/mcp", "http://gw.example/mcp"),
     "identity.yaml:1:1: 'resource' must use https (http only on a loopback address)"),
    ("resource with query", MINIMAL.replace("https://gw.example/mcp", "https://gw.example/mcp?x=1"),
     "'resource' must be an https URL without query or fragment"),
    ("resource empty", MINIMAL.replace("https://gw.example/mcp", '""'), "'resource' must be a URL, got ''"),
    ("no issuers", "resource: https://gw.example/mcp\nissuers: []\n",
     "identity.yaml:2:1: 'issuers' must be a non-empty list of identity providers"),
    ("issuer not a mapping", "resource: https://gw.example/mcp\nissuers: [x]\n",
     "identity.yaml:2:11: issuers[0] must be a mapping, got str"),
    ("issuer over http", MINIMAL.replace("https://idp.example", "http://idp.example"),
     "issuers[0]: 'issuer' must use https"),
    ("missing roles_claim", MINIMAL.replace("    roles_claim: groups\n", ""),
     "identity.yaml:3:5: issuers[0]: the key 'roles_claim' is required"),
    ("unknown issuer key", MINIMAL + "    colour: blue\n", "issuers[0]: unknown key 'colour'"),
    ("bad claim name", MINIMAL.replace("principal_claim: email", "principal_claim: 'e mail'"),
     "issuers[0]: 'principal_claim' must be a claim name"),
    ("empty roles", MINIMAL.replace("{ops: operator, readers: reader}", "{}"),
     "issuers[0]: 'roles' must map claim values to role names"),
    ("role not text", MINIMAL.replace("{ops: operator, readers: reader}", "{ops: [a]}"),
     "issuers[0]: roles: 'ops': ['a'] must map a text value to a role name"),
    ("audience empty", MINIMAL + "    audience: ''\n",
     "issuers[0]: 'audience' must be the resource identifier tokens carry"),
    ("ca_file missing", MINIMAL + "    ca_file: /nonexistent/ca.pem\n",
     "issuers[0]: 'ca_file' '/nonexistent/ca.pem' is not a readable file"),
    ("scopes not a switch", MINIMAL + "    enforce_scopes: 'yes'\n",
     "issuers[0]: 'enforce_scopes' must be true or false"),
    ("max age zero", MINIMAL + "    keys_max_age_seconds: 0\n",
     "issuers[0]: 'keys_max_age_seconds' must be a positive number of seconds"),
    ("max age a switch", MINIMAL + "    keys_max_age_seconds: true\n",
     "'keys_max_age_seconds' must be a positive number of seconds"),
    ("app claims a list", MINIMAL + "    application_claims: [a]\n",
     "issuers[0]: 'application_claims' must map claim names to the value"),
    ("app claim empty value", MINIMAL + "    application_claims: {client_type: ''}\n",
     "issuers[0]: application_claims: 'client_type': '' must map a claim name to a text value"),
    ("issuer twice", MINIMAL + MINIMAL.split("issuers:\n")[1],
     "issuer 'https://idp.example/realms/ops' is listed twice; keep one entry"),
    ("web not a mapping", MINIMAL + "web_sign_in: yes\n", "web_sign_in must be a mapping, got bool"),
    ("web missing client", MINIMAL + WEB.replace("  client_id: vsphere-gateway\n", ""),
     "web_sign_in: the key 'client_id' is required"),
    ("web unknown issuer", MINIMAL + WEB.replace("https://idp.example/realms/ops", "https://other"),
     "web_sign_in: 'issuer' 'https://other' is not one of the issuers listed above"),
    ("web empty client", MINIMAL + WEB.replace("vsphere-gateway", "''"),
     "web_sign_in: 'client_id' must be the client id registered at the provider"),
    ("web secret variable not _SECRET", MINIMAL + WEB.replace("GATEWAY_OIDC_CLIENT_SECRET", "GATEWAY_OIDC"),
     "web_sign_in: 'client_secret_env' must name an environment variable ending in _SECRET"),
    ("web secret variable lower case", MINIMAL + WEB.replace("GATEWAY_OIDC_CLIENT_SECRET", "my_secret"),
     "'client_secret_env' must name an environment variable"),
    ("web scope without openid", MINIMAL + WEB + "  scope: email profile\n",
     "web_sign_in: 'scope' must be space-separated scopes including openid"),
    ("web token_sign_in not a switch", MINIMAL + WEB + "  token_sign_in: 1\n",
     "web_sign_in: 'token_sign_in' must be true or false"),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in BROKEN], ids=[c for c, _, _ in BROKEN])
def test_each_problem_is_reported_with_its_place(text: str, expected: str) -> None:
    problems = _problems(text)
    assert any(expected in p for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    text = MINIMAL.replace("principal_claim: email", "principal_claim: 'e mail'") + "    colour: x\n" + \
        WEB.replace("GATEWAY_OIDC_CLIENT_SECRET", "nope")
    assert len(_problems(text)) == 3


def test_an_empty_file_is_not_a_configuration() -> None:
    with pytest.raises(ConfigProblems, match="must be a mapping, got NoneType"):
        parse_identity(None, "identity.yaml")
