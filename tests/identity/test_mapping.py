"""Verified claims -> a caller (``gateway.identity.mapping``): kind, name, key, role, scopes and what the
audit keeps, as tables of plain claims. Every refusal carries its stable reason."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.auth.principal import CallerKey
from gateway.identity.config import IssuerConfig
from gateway.identity.mapping import (
    SCOPES,
    identity_of,
    is_application,
    required_scope,
    role_of,
    scopes_of,
)
from gateway.identity.verify import TokenRefused
from gateway.vocabulary import Category, Kind

ISSUER = IssuerConfig(issuer="https://idp.example", audience="https://gw/mcp", principal_claim="email",
                      roles_claim="groups", roles=(("ops", "operator"), ("readers", "reader")))
LAX = IssuerConfig(issuer="https://idp.example", audience="https://gw/mcp", principal_claim="sub",
                   roles_claim="roles", roles=(("admins", "admin"),), enforce_scopes=False,
                   application_claims=(("client_type", "service"),))


@pytest.mark.parametrize(("category", "scope"), [(Category.READ, "vsphere:read"),
                                                 (Category.WRITE, "vsphere:write"),
                                                 (Category.DESTRUCTIVE, "vsphere:destructive")])
def test_each_category_needs_its_scope(category: Category, scope: str) -> None:
    assert required_scope(category) == scope
    assert SCOPES[category] == scope


@pytest.mark.parametrize(("claims", "scopes"), [
    ({"scope": "vsphere:read vsphere:write"}, {"vsphere:read", "vsphere:write"}),
    ({"scope": ""}, set()),
    ({"scp": ["vsphere:read", 5, "x"]}, {"vsphere:read", "x"}),
    ({"scp": "a b"}, {"a", "b"}),
    ({"scope": "a", "scp": ["b"]}, {"a"}),
    ({"scope": 7, "scp": ["b"]}, {"b"}),
    ({}, set()),
])
def test_scopes_of(claims: dict[str, Any], scopes: set[str]) -> None:
    assert scopes_of(claims) == frozenset(scopes)


@pytest.mark.parametrize(("groups", "role"), [
    (["ops"], "operator"),
    (["readers", "ops"], "operator"),  # the file's order wins, not the token's
    ("readers", "reader"),
    (["other", "readers"], "reader"),
])
def test_role_of_is_the_first_mapping_entry_carried(groups: Any, role: str) -> None:
    assert role_of({"groups": groups}, ISSUER) == role


@pytest.mark.parametrize("groups", [None, [], ["other"], 42, [["ops"]], {"ops": True}])
def test_no_mapped_group_is_refused_as_unmapped(groups: Any) -> None:
    with pytest.raises(TokenRefused) as caught:
        role_of({"groups": groups}, ISSUER)
    assert caught.value.reason == "unmapped"
    assert "identity.yaml maps only ops, readers" in str(caught.value)


def test_the_unmapped_message_shows_at_most_ten_groups_sorted() -> None:
    with pytest.raises(TokenRefused) as caught:
        role_of({"groups": [f"g{i:02d}" for i in range(15, 0, -1)]}, ISSUER)
    assert "carries g01, g02, g03, g04, g05, g06, g07, g08, g09, g10, and" in str(caught.value)


@pytest.mark.parametrize(("claims", "marks", "application"), [
    ({"idtyp": "app"}, (), True),
    ({"client_id": "bot"}, (), True),           # subject equals the client id
    ({"azp": "bot"}, (), True),
    ({"appid": "bot"}, (), True),
    ({"aud": ["x", "bot"]}, (), True),           # an ID token naming its own client
    ({"aud": "bot"}, (), True),
    ({"client_type": "service"}, (("client_type", "service"),), True),
    ({"client_type": ["web", "service"]}, (("client_type", "service"),), True),
    ({"client_type": "web"}, (("client_type", "service"),), False),
    ({"client_id": "claude", "aud": "https://gw/mcp"}, (), False),
    ({}, (), False),
])
def test_is_application(claims: dict[str, Any], marks: tuple[tuple[str, str], ...],
                        application: bool) -> None:
    assert is_application(claims, "bot", claims.get("client_id"), marks) is application


def test_a_client_credentials_token_is_an_agent_keyed_by_its_client() -> None:
    identity = identity_of({"sub": "bot", "client_id": "bot", "groups": ["ops"], "scope": "vsphere:read"},
                           ISSUER, surface="https")
    principal = identity.principal
    assert (principal.name, principal.kind, principal.role, principal.surface) == (
        "bot", Kind.AGENT, "operator", "https")
    assert principal.key == CallerKey.client("https://idp.example", "bot")
    assert principal.acting_for is None and principal.acting_for_key is None
    assert principal.scopes == frozenset({"vsphere:read"})
    assert (identity.issuer, identity.subject, identity.client_id) == ("https://idp.example", "bot", "bot")


def test_a_token_without_a_subject_is_its_clients() -> None:
    principal = identity_of({"azp": "bot", "groups": ["ops"]}, ISSUER, surface="https").principal
    assert principal.name == "bot"
    assert principal.key == CallerKey.client("https://idp.example", "bot")


def test_a_persons_token_used_by_a_client_is_an_agent_acting_for_them() -> None:
    identity = identity_of({"sub": "u-1", "email": "rita@example.com", "client_id": "claude",
                            "groups": ["ops"]}, ISSUER, surface="https")
    principal = identity.principal
    assert principal.name == "rita@example.com via claude"
    assert principal.kind is Kind.AGENT
    assert principal.acting_for == "rita@example.com"
    assert principal.key == CallerKey.client("https://idp.example", "claude", for_subject="u-1")
    assert principal.acting_for_key == CallerKey.person("https://idp.example", "u-1")
    assert principal.person_key == principal.acting_for_key


def test_the_key_follows_sub_not_the_email_shown() -> None:
    first = identity_of({"sub": "u-1", "email": "old@x", "client_id": "c", "groups": ["ops"]}, ISSUER,
                        surface="https")
    second = identity_of({"sub": "u-1", "email": "new@x", "client_id": "c", "groups": ["ops"]}, ISSUER,
                         surface="https")
    assert first.principal.key == second.principal.key
    assert first.principal.name != second.principal.name


def test_a_person_signing_in_on_the_page_is_a_person() -> None:
    identity = identity_of({"sub": "u-1", "email": "rita@example.com", "aud": "gateway-page",
                            "groups": ["readers"]}, ISSUER, surface="web", person=True)
    principal = identity.principal
    assert (principal.name, principal.kind, principal.role) == ("rita@example.com", Kind.PERSON, "reader")
    assert principal.key == CallerKey.person("https://idp.example", "u-1")


@pytest.mark.parametrize("claims", [
    {"email": "rita@x", "groups": ["ops"]},                               # no subject
    {"sub": "app", "aud": "app", "email": "a@x", "groups": ["ops"]},      # the client's own login
    {"sub": "u", "idtyp": "app", "email": "a@x", "groups": ["ops"]},
])
def test_an_application_cannot_sign_in_as_a_person(claims: dict[str, Any]) -> None:
    with pytest.raises(TokenRefused) as caught:
        identity_of(claims, ISSUER, surface="web", person=True)
    assert caught.value.reason == "agent_identity"


def test_the_issuers_app_marker_makes_an_application() -> None:
    claims = {"sub": "u-9", "client_id": "svc", "client_type": "service", "roles": ["admins"]}
    principal = identity_of(claims, LAX, surface="https").principal
    assert principal.key == CallerKey.client("https://idp.example", "svc")
    assert principal.acting_for is None


@pytest.mark.parametrize(("claims", "person"), [
    ({"sub": "u", "client_id": "c", "groups": ["ops"]}, False),            # no email to show
    ({"sub": "u", "email": "", "client_id": "c", "groups": ["ops"]}, False),
    ({"sub": "u", "email": "rita@x", "groups": ["ops"]}, False),           # no client id
    ({"sub": "u", "email": "a\nb", "client_id": "c", "groups": ["ops"]}, False),
    ({"sub": "u", "email": "x" * 129, "client_id": "c", "groups": ["ops"]}, False),
    ({"sub": "u", "email": "a via b", "client_id": "c", "groups": ["ops"]}, False),
    ({"sub": "u", "email": "rita@x", "client_id": "c via d", "groups": ["ops"]}, False),
    ({"sub": "u", "groups": ["ops"]}, True),
    ({"sub": "u", "email": 5, "groups": ["ops"]}, True),
])
def test_a_token_without_a_usable_name_is_refused(claims: dict[str, Any], person: bool) -> None:
    with pytest.raises(TokenRefused) as caught:
        identity_of(claims, ISSUER, surface="https", person=person)
    assert caught.value.reason == "missing_claim"


def test_the_role_is_checked_before_anything_else() -> None:
    with pytest.raises(TokenRefused) as caught:
        identity_of({"groups": ["nobody"]}, ISSUER, surface="https")
    assert caught.value.reason == "unmapped"


def test_scopes_are_none_when_the_issuer_does_not_enforce_them() -> None:
    principal = identity_of({"sub": "bot", "client_id": "bot", "roles": "admins", "scope": "x"}, LAX,
                            surface="https").principal
    assert principal.scopes is None


def test_audit_fields_keep_the_jti_digest_never_the_jti() -> None:
    identity = identity_of({"sub": "u-1", "email": "r@x", "client_id": "c", "groups": ["ops"],
                            "scope": "b a", "jti": "secret-jti"}, ISSUER, surface="https")
    fields = identity.audit_fields()
    assert fields == {"caller_key": str(identity.principal.key), "issuer": "https://idp.example",
                      "subject": "u-1", "client_id": "c",
                      "jti_sha256": hashlib.sha256(b"secret-jti").hexdigest(), "acting_for": "r@x",
                      "scopes": ["a", "b"]}
    assert "secret-jti" not in str(fields)


def test_audit_fields_without_jti_or_scopes() -> None:
    fields = identity_of({"azp": "bot", "roles": ["admins"]}, LAX, surface="https").audit_fields()
    assert (fields["jti_sha256"], fields["scopes"], fields["subject"]) == (None, None, None)
