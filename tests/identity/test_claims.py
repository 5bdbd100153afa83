"""identity.yaml's strict parsing (file:line problems) and the pure claims -> caller mapping, as tables; and
the decision's rule that a person never approves what an agent acting for them proposed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.auth.principal import CallerKey
from gateway.config import ConfigProblems
from gateway.guard.decision import Party, Proposed, TokenState, proposal_rights
from gateway.identity.config import IssuerConfig, load_identity
from gateway.identity.mapping import identity_of, scopes_of
from gateway.identity.verify import TokenRefused
from gateway.role import BUILTIN_ROLES
from gateway.vocabulary import Kind

GOOD = """resource: https://gateway.example.com/mcp
issuers:
  - issuer: https://login.example.com/realms/ops
    principal_claim: email
    roles_claim: groups
    roles: {vsphere-ops: lab-operator, vsphere-readers: reader}
web_sign_in:
  issuer: https://login.example.com/realms/ops
  client_id: vsphere-gateway
  client_secret_env: GATEWAY_OIDC_CLIENT_SECRET
"""


def test_a_good_file_loads(tmp_path: Path) -> None:
    (tmp_path / "identity.yaml").write_text(GOOD)
    config = load_identity(tmp_path / "identity.yaml")
    assert config is not None and config.issuers[0].audience == "https://gateway.example.com/mcp"
    assert config.issuers[0].roles == (("vsphere-ops", "lab-operator"), ("vsphere-readers", "reader"))
    assert config.web_sign_in is not None and config.web_sign_in.token_sign_in is True


def test_no_file_means_no_identity(tmp_path: Path) -> None:
    assert load_identity(tmp_path / "identity.yaml") is None


BROKEN = {
    "unknown key": (
        GOOD.replace("    roles_claim: groups\n", "    roles_claim: groups\n    colour: blue\n"),
        ":6:5: issuers[0]: unknown key 'colour'",
    ),
    "plain http": (
        GOOD.replace(
            "issuer: https://login.example.com/realms/ops\n    principal",
            "issuer: http://login.example.com/realms/ops\n    principal",
        ),
        ":3:5: issuers[0]: 'issuer' must use https",
    ),
    "missing roles": (
        GOOD.replace("    roles: {vsphere-ops: lab-operator, vsphere-readers: reader}\n", ""),
        ":3:5: issuers[0]: the key 'roles' is required",
    ),
    "web issuer not listed": (
        GOOD.replace(
            "  issuer: https://login.example.com/realms/ops\n  client_id",
            "  issuer: https://other.example.com\n  client_id",
        ),
        ":8:3: web_sign_in: 'issuer' 'https://other.example.com' is not one of",
    ),
    "secret in the file": (
        GOOD.replace("GATEWAY_OIDC_CLIENT_SECRET", "s3cr3t value"),
        ":10:3: web_sign_in: 'client_secret_env' must name an environment variable",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_problems_name_file_line_and_column(tmp_path: Path, case: str) -> None:
    text, expected = BROKEN[case]
    path = tmp_path / "identity.yaml"
    path.write_text(text)
    with pytest.raises(ConfigProblems) as caught:
        load_identity(path)
    assert any(
        p.startswith(f"{path}{expected.split(': ', 1)[0]}") and expected.split(": ", 1)[1] in p
        for p in caught.value.problems
    ), caught.value.problems


ISSUER = IssuerConfig(
    issuer="https://idp",
    audience="https://gw/mcp",
    principal_claim="email",
    roles_claim="groups",
    roles=(("ops", "lab-operator"), ("readers", "reader")),
)

CALLERS: list[tuple[str, dict[str, Any], tuple[str, Kind, str | None, str]]] = [
    (
        "client credentials (sub = client id)",
        {"sub": "bot", "client_id": "bot", "groups": ["ops"]},
        ("bot", Kind.AGENT, None, "lab-operator"),
    ),
    (
        "client credentials (no sub, azp)",
        {"azp": "bot", "groups": "readers"},
        ("bot", Kind.AGENT, None, "reader"),
    ),
    (
        "Entra app-only token",
        {"sub": "8f1e", "appid": "bot", "idtyp": "app", "groups": ["readers"]},
        ("bot", Kind.AGENT, None, "reader"),
    ),
    (
        "a person's token used by an MCP client",
        {"sub": "u1", "email": "rita@x", "client_id": "claude-code", "groups": ["readers", "ops"]},
        ("rita@x via claude-code", Kind.AGENT, "rita@x", "lab-operator"),
    ),  # first mapping entry wins
]


@pytest.mark.parametrize("case", [c[0] for c in CALLERS])
def test_claims_map_to_a_caller(case: str) -> None:
    _, claims, (name, kind, acting_for, role) = next(c for c in CALLERS if c[0] == case)
    p = identity_of(claims, ISSUER, surface="https").principal
    assert (p.name, p.kind, p.acting_for, p.role) == (name, kind, acting_for, role)


def test_an_unmapped_group_is_refused_never_defaulted() -> None:
    with pytest.raises(TokenRefused) as caught:
        identity_of({"sub": "bot", "client_id": "bot", "groups": ["marketing"]}, ISSUER, surface="https")
    assert caught.value.reason == "unmapped"


def test_an_id_token_without_a_person_is_refused_at_the_page() -> None:
    with pytest.raises(TokenRefused) as caught:
        identity_of({"azp": "bot", "groups": ["ops"]}, ISSUER, surface="web", person=True)
    assert caught.value.reason == "agent_identity"


def test_the_issuers_own_app_marker_makes_an_application(tmp_path: Path) -> None:
    """``application_claims``: a claim value that says the token is an application's own."""
    (tmp_path / "identity.yaml").write_text(GOOD.replace(
        "    roles: {vsphere-ops", "    application_claims: {client_type: service}\n    roles: {vsphere-ops"))
    config = load_identity(tmp_path / "identity.yaml")
    assert config is not None
    issuer = config.issuers[0]
    assert issuer.application_claims == (("client_type", "service"),)
    app = {"sub": "svc-1", "email": "svc@x", "client_type": "service", "azp": "page",
           "groups": ["vsphere-ops"]}
    with pytest.raises(TokenRefused) as caught:
        identity_of(app, issuer, surface="web", person=True)
    assert caught.value.reason == "agent_identity"
    agent = identity_of({**app, "client_id": "svc"}, issuer, surface="https").principal
    assert agent.acting_for_key is None and agent.key.space == "client"  # no person behind it
    person = identity_of({**app, "client_type": "confidential"}, issuer, surface="web", person=True)
    assert person.principal.kind is Kind.PERSON


def test_scopes_from_scope_or_scp() -> None:
    assert scopes_of({"scope": "vsphere:read vsphere:write"}) == {"vsphere:read", "vsphere:write"}
    assert scopes_of({"scp": ["vsphere:read"]}) == {"vsphere:read"}
    assert scopes_of({}) == frozenset()


def test_a_person_cannot_approve_what_an_agent_acting_for_them_proposed() -> None:
    """Decided on keys: the agent's ``acting_for_key`` is the person's (issuer, sub) key, so the person is
    refused whatever name either shows, and another person showing the same email is not."""
    admin = BUILTIN_ROLES["admin"]
    agent = identity_of({"sub": "u1", "email": "rita@x", "client_id": "claude-code", "groups": ["ops"]},
                        ISSUER, surface="https").principal
    rita = identity_of({"sub": "u1", "email": "rita@new", "groups": ["ops"]}, ISSUER, surface="web",
                       person=True).principal
    proposed = Proposed(proposer=agent.name, target="vc1", id="p1", proposer_key=str(agent.key),
                        acting_for_key=str(agent.acting_for_key))
    party = Party(rita.name, TokenState.USABLE, admin, Kind.PERSON, key=str(rita.key),
                  person_key=str(rita.key))
    rights = proposal_rights(party, proposed)
    assert (
        rights.see and rights.approve is not None and rights.approve.details["reason_code"] == "own_proposal"
    )
    someone = str(CallerKey.person("https://idp", "u2"))
    other = Party("rita@x", TokenState.USABLE, admin, Kind.PERSON, key=someone, person_key=someone)
    assert proposal_rights(other, proposed).approve is None  # same email, another person: may


KEYS: list[tuple[str, dict[str, Any], bool, CallerKey, CallerKey | None]] = [
    ("a client named like a local token", {"sub": "idadmin", "client_id": "idadmin", "groups": ["ops"]},
     False, CallerKey.client("https://idp", "idadmin"), None),
    ("a client named like the gateway", {"azp": "gateway", "groups": ["ops"]}, False,
     CallerKey.client("https://idp", "gateway"), None),
    ("a client named os:root", {"client_id": "os:root", "groups": ["ops"]}, False,
     CallerKey.client("https://idp", "os:root"), None),
    ("a person's token used by a client",
     {"sub": "u1", "email": "rita@x", "client_id": "cc", "groups": ["ops"]}, False,
     CallerKey.client("https://idp", "cc", for_subject="u1"), CallerKey.person("https://idp", "u1")),
    ("a person at the page", {"sub": "u1", "email": "rita@x", "groups": ["ops"]}, True,
     CallerKey.person("https://idp", "u1"), None),
    ("the same person with a new email", {"sub": "u1", "email": "rita@new", "groups": ["ops"]}, True,
     CallerKey.person("https://idp", "u1"), None),
]


@pytest.mark.parametrize("case", [c[0] for c in KEYS])
def test_claims_give_a_key_no_claim_can_forge(case: str) -> None:
    """The key comes from issuer and sub/client id, never from the name shown; never a token or system key."""
    _, claims, person, key, acting_for = next(c for c in KEYS if c[0] == case)
    p = identity_of(claims, ISSUER, surface="web" if person else "https", person=person).principal
    assert (p.key, p.acting_for_key) == (key, acting_for)
    assert p.key.space in ("person", "client")


@pytest.mark.parametrize("claims", [
    {"sub": "app1", "azp": "app1", "email": "app@x", "groups": ["ops"]},
    {"sub": "8f1e", "azp": "page", "idtyp": "app", "email": "app@x", "groups": ["ops"]},
    {"sub": "svc", "appid": "svc", "azp": "page", "email": "svc@x", "groups": ["ops"]},
    {"sub": "page", "aud": "page", "email": "page@x", "groups": ["ops"]},
], ids=["sub is the client id", "idtyp app", "sub is the appid", "sub is the ID token's audience"])
def test_an_application_id_token_is_refused_at_the_page(claims: dict[str, Any]) -> None:
    with pytest.raises(TokenRefused) as caught:
        identity_of(claims, ISSUER, surface="web", person=True)
    assert caught.value.reason == "agent_identity"


def test_gateway_check_validates_identity_yaml_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.simulator import complete_rules_text

    from gateway.cli import main

    (tmp_path / "targets.yaml").write_text("targets:\n  - {name: vc1, host: h, credential_env_prefix: VC1}\n")
    (tmp_path / "rules.yaml").write_text(complete_rules_text("defaults: {destructive: deny}\n"))
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    monkeypatch.delenv("GATEWAY_IDENTITY_FILE", raising=False)
    identity = tmp_path / "identity.yaml"
    identity.write_text(
        GOOD.replace("    roles_claim: groups\n", "    roles_claim: groups\n    colour: blue\n")
    )
    assert main(["check", "--home", str(tmp_path)]) == 1
    assert f"{identity}:6:5: issuers[0]: unknown key 'colour'" in capsys.readouterr().err
    identity.write_text(GOOD)  # lab-operator is not defined here (no roles.yaml)
    assert main(["check", "--home", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{identity}:6:13: issuer https://login.example.com/realms/ops: roles: 'vsphere-ops' maps" in err
    assert "to the role 'lab-operator', which is not defined" in err
    identity.write_text(GOOD.replace("lab-operator", "admin"))
    assert main(["check", "--home", str(tmp_path)]) == 0
    assert f"identity: {identity} ok" in capsys.readouterr().out


def test_the_example_file_is_valid() -> None:
    config = load_identity(Path(__file__).resolve().parents[2] / "identity.example.yaml")
    assert (
        config is not None and config.web_sign_in is not None and config.issuers[0].principal_claim == "email"
    )


@pytest.mark.anyio
async def test_the_person_an_agent_acted_for_cannot_approve_its_proposal(env: Any) -> None:
    """Through the gateway itself (the decision every surface asks): a real proposal on the simulator."""
    from support.gateway_env import VM0, propose_delete

    from gateway.auth.tokens import Principal
    from gateway.errors import Forbidden

    gw = env.build()
    rita_key = CallerKey.person("https://idp", "u1")
    agent = Principal("rita@x via claude-code", "admin", surface="https", acting_for="rita@x",
                      key=CallerKey.client("https://idp", "claude-code", for_subject="u1"),
                      acting_for_key=rita_key)
    proposal = await propose_delete(gw, VM0, who=agent)
    stored = gw.store.get_proposal(proposal["proposal_id"])
    rita = Principal("rita@new", "admin", surface="web", kind=Kind.PERSON, key=rita_key)  # a new email
    _deny, approve = gw.actions.decision_rights(stored, rita)
    assert not approve.allowed and approve.details["reason_code"] == "own_proposal"
    with pytest.raises(Forbidden) as refused:
        await gw.actions.approve(proposal["proposal_id"], rita)
    assert refused.value.details["reason_code"] == "own_proposal"
    olga = Principal("rita@x", "admin", surface="web", kind=Kind.PERSON,
                     key=CallerKey.person("https://idp", "u2"))  # another person showing rita's old email
    assert gw.actions.decision_rights(stored, olga)[1].allowed  # another person with the right may
