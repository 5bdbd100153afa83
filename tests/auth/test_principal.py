"""Who is calling (``gateway.auth.principal``): ``CallerKey``'s four namespaces and its one text form,
``Principal``'s default key and person, ``parse_key`` reading a key back, and the caller fields of a row."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.auth.principal import SPACES, CallerKey, Principal, caller_fields, parse_key
from gateway.vocabulary import Kind

ISSUER = "https://login.example.com/realms/ops"

KEYS = [
    (CallerKey.token("abc123def456"), "token::abc123def456"),
    (CallerKey.system("gateway"), "system::gateway"),
    (CallerKey.system("os:root"), "system::os%3Aroot"),
    (CallerKey.person(ISSUER, "u-1"), "person:https%3A%2F%2Flogin.example.com%2Frealms%2Fops:u-1"),
    (CallerKey.client(ISSUER, "mcp-client"),
     "client:https%3A%2F%2Flogin.example.com%2Frealms%2Fops:mcp-client"),
    (CallerKey.client(ISSUER, "mcp-client", for_subject="u-1"),
     "client:https%3A%2F%2Flogin.example.com%2Frealms%2Fops:mcp-client:u-1"),
]


@pytest.mark.parametrize(("key", "text"), KEYS, ids=[text for _, text in KEYS])
def test_a_key_has_one_text_form(key: CallerKey, text: str) -> None:
    assert str(key) == text


@pytest.mark.parametrize(("key", "text"), KEYS, ids=[text for _, text in KEYS])
def test_parse_key_reads_back_every_key(key: CallerKey, text: str) -> None:
    assert parse_key(text) == key


def test_spaces() -> None:
    assert SPACES == ("token", "person", "client", "system")


def test_a_name_with_colons_cannot_reach_another_namespace() -> None:
    spoof = CallerKey.system("token::abc")
    assert str(spoof) != str(CallerKey.token("abc"))
    assert parse_key(str(spoof)) == spoof


def test_keys_of_different_namespaces_never_compare_equal() -> None:
    assert CallerKey.person(ISSUER, "x") != CallerKey.client(ISSUER, "x")
    assert CallerKey.person(ISSUER, "x") != CallerKey.person(ISSUER + "/other", "x")
    assert CallerKey.client(ISSUER, "c") != CallerKey.client(ISSUER, "c", for_subject="u")


@pytest.mark.parametrize(("args", "message"), [
    (("robot", "x"), "unknown caller key space 'robot'"),
    (("token", ""), "needs a value"),
    (("person", "u-1"), "a person key needs issuer"),
    (("client", "c"), "a client key needs issuer"),
    (("token", "t", ISSUER), "a token key takes no issuer"),
    (("system", "gateway", ISSUER), "a system key takes no issuer"),
])
def test_a_malformed_key_is_refused(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CallerKey(*args)


@pytest.mark.parametrize("text", [
    None, "", "gateway", "token:abc", "a:b:c:d:e", "robot::x", "token::", "person::u-1",
    "token:https%3A%2F%2Fi:t", "token::a%3ab", "token::%61bc",
])
def test_parse_key_of_a_text_no_key_has_is_none(text: str | None) -> None:
    assert parse_key(text) is None


def test_a_principal_with_a_token_is_keyed_by_the_token_id() -> None:
    principal = Principal(name="ci", role="reader", token_id="abc123def456")
    assert principal.key == CallerKey.token("abc123def456")


def test_a_principal_without_a_token_is_in_the_system_namespace() -> None:
    principal = Principal(name="stdio:alice", role="admin")
    assert principal.key == CallerKey.system("stdio:alice")


def test_a_given_key_is_kept() -> None:
    key = CallerKey.person(ISSUER, "u-1")
    assert Principal(name="alice@example.com", role="admin", key=key).key is key


def test_principal_defaults() -> None:
    principal = Principal(name="ci", role="reader")
    assert (principal.surface, principal.kind, principal.acting_for, principal.scopes) == (
        "https", Kind.AGENT, None, None)


def test_the_person_behind_a_person_is_themself() -> None:
    key = CallerKey.person(ISSUER, "u-1")
    assert Principal(name="alice", role="admin", kind=Kind.PERSON, key=key).person_key == key


def test_the_person_behind_an_agent_is_who_it_acts_for() -> None:
    person = CallerKey.person(ISSUER, "u-1")
    agent = Principal(name="alice via mcp", role="admin", acting_for="alice",
                      key=CallerKey.client(ISSUER, "mcp", for_subject="u-1"), acting_for_key=person)
    assert agent.person_key == person


def test_an_agent_acting_for_nobody_has_no_person() -> None:
    assert Principal(name="ci", role="reader", token_id="t").person_key is None


def test_caller_fields_of_a_token_holder() -> None:
    assert caller_fields(Principal(name="ci", role="reader", token_id="abc")) == {
        "caller": "ci", "caller_key": "token::abc"}


def test_caller_fields_of_a_person_carry_issuer_and_subject() -> None:
    principal = Principal(name="alice@example.com", role="admin", kind=Kind.PERSON,
                          key=CallerKey.person(ISSUER, "u-1"))
    assert caller_fields(principal) == {"caller": "alice@example.com", "caller_key": str(principal.key),
                                        "issuer": ISSUER, "subject": "u-1"}


def test_caller_fields_of_an_application_carry_the_issuer_only() -> None:
    principal = Principal(name="backup-job", role="reader", key=CallerKey.client(ISSUER, "backup-job"))
    assert caller_fields(principal) == {"caller": "backup-job", "caller_key": str(principal.key),
                                        "issuer": ISSUER}


def test_caller_fields_of_an_agent_acting_for_a_person_carry_that_subject() -> None:
    principal = Principal(name="alice via mcp", role="admin",
                          key=CallerKey.client(ISSUER, "mcp", for_subject="u-1"))
    assert caller_fields(principal)["subject"] == "u-1"
