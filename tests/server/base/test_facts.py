"""``FactsNow``: the caller, the proposer, the role, the target and the rules as the stores say at the
moment each is asked, over SQLite and plain values."""

from __future__ import annotations

import os
import time
from dataclasses import replace

from support.gateway_env import role, write_roles
from support.server_parts import AGENT, READER, Parts, proposal_of

from gateway.auth.tokens import Principal, create_token
from gateway.guard.decision import Entry, TokenState
from gateway.server.base.facts import EDGE_READ_SECONDS
from gateway.vocabulary import Category, Kind


def test_a_caller_without_a_token_is_the_role_its_surface_gave_it(parts: Parts) -> None:
    party = parts.facts.party(READER)
    assert (party.name, party.token, party.role and party.role.name, party.kind) == \
        ("watcher", TokenState.USABLE, "reader", Kind.AGENT)


def test_a_token_caller_is_its_token_as_stored_now(parts: Parts) -> None:
    _plain, record = create_token(parts.backends.store, "bot", "reader", expires_in=None, now=parts.clock())
    caller = Principal(name="bot", role="admin", token_id=record.token_id, surface="test")  # a stale role
    assert parts.facts.party(caller).role.name == "reader"  # type: ignore[union-attr]
    parts.backends.store.update_token("bot", revoked=True)
    assert parts.facts.party(caller).token is TokenState.REVOKED


def test_the_edge_read_of_a_token_stands_for_the_store_within_its_request(parts: Parts) -> None:
    _plain, record = create_token(parts.backends.store, "bot", "reader", expires_in=None, now=parts.clock())
    caller = Principal(name="bot", role="admin", token_id=record.token_id, surface="test", as_read=record,
                       read_at=time.monotonic())
    parts.backends.store.update_token("bot", revoked=True)  # after the edge read it: the next request sees it
    parts.roles.roles()  # loaded, as a server's are from its start
    known = parts.facts.party_known(caller)
    assert known is not None and known.token is TokenState.USABLE and known.role is not None
    assert known.role.name == "reader" and known.key == parts.facts.party(caller).key
    assert parts.facts.party(caller).token is TokenState.REVOKED


def test_an_old_or_foreign_edge_read_is_not_used(parts: Parts) -> None:
    _plain, record = create_token(parts.backends.store, "bot", "reader", expires_in=None, now=parts.clock())
    old = Principal(name="bot", role="reader", token_id=record.token_id, surface="test", as_read=record,
                    read_at=time.monotonic() - EDGE_READ_SECONDS - 1)
    other = Principal(name="bot", role="reader", token_id="t-other", surface="test", as_read=record,
                      read_at=time.monotonic())
    unread = Principal(name="bot", role="reader", token_id=record.token_id, surface="test")
    parts.roles.roles()  # loaded, as a server's are from its start
    assert [parts.facts.party_known(p) for p in (old, other, unread)] == [None, None, None]
    assert parts.facts.party_known(READER) == parts.facts.party(READER)  # no token: nothing to read


def test_the_edge_read_never_reloads_the_roles_file_on_the_event_loop(parts: Parts) -> None:
    """``party_known`` runs on the event loop: the roles file as loaded is used; edited since, it is not
    read there (None: ``party``, off the loop, reloads it), and after that reload the edge read is used
    again."""
    def roles_file(allowed: tuple[str, ...]) -> None:
        write_roles(parts.tmp, {"ops": role(write=allowed)})
        past = time.time() - 60  # not a file written this instant, which is always read again
        os.utime(parts.tmp / "roles.yaml", (past, past))

    roles_file(())
    _plain, record = create_token(parts.backends.store, "bot", "ops", expires_in=None, now=parts.clock())
    caller = Principal(name="bot", role="ops", token_id=record.token_id, surface="test", as_read=record,
                       read_at=time.monotonic())
    assert parts.roles.get("ops") is not None  # loaded
    known = parts.facts.party_known(caller)
    assert known is not None and known.role is not None and known.role.allow_write == frozenset()
    roles_file(("power_on_vm",))
    assert parts.facts.party_known(caller) is None  # edited: not read on the loop
    assert parts.roles.get_loaded("ops") == (False, None)  # ... nor reloaded
    reloaded = parts.facts.party(caller).role
    assert reloaded is not None and "power_on_vm" in reloaded.allow_write
    again = parts.facts.party_known(caller)
    assert again is not None and again.role == reloaded


def test_a_token_the_store_does_not_know_has_no_role(parts: Parts) -> None:
    party = parts.facts.party(Principal(name="ghost", role="admin", token_id="t-missing", surface="test"))
    assert (party.token, party.role) == (TokenState.UNKNOWN, None)


def test_an_expired_token_is_expired_by_the_facts_clock(parts: Parts) -> None:
    _plain, record = create_token(parts.backends.store, "brief", "admin", expires_in=60, now=parts.clock())
    caller = Principal(name="brief", role="admin", token_id=record.token_id, surface="test")
    assert parts.facts.party(caller).token is TokenState.USABLE
    parts.clock.now += 61
    assert parts.facts.party(caller).token is TokenState.EXPIRED


def test_a_proposal_stored_without_a_key_has_an_owner_nobody_matches(parts: Parts) -> None:
    owner = parts.facts.owner(replace(proposal_of(parts), caller_key=None))
    assert (owner.token, owner.role) == (TokenState.UNKNOWN, None)


def test_a_proposal_owner_is_found_by_the_key_it_holds(parts: Parts) -> None:
    owner = parts.facts.owner(proposal_of(parts, caller=AGENT))
    assert (owner.name, owner.token) == ("agent-1", TokenState.USABLE)
    assert owner.role is not None and owner.role.name == "admin"


def test_tools_follow_the_role(parts: Parts) -> None:
    readers = {spec.kind for spec in parts.facts.tools_for(READER)}
    assert readers == {Category.READ}
    assert len(parts.facts.tools_for(AGENT)) > len(parts.facts.tools_for(READER))
    assert parts.facts.tools_for(Principal(name="x", role="no-such-role", surface="test")) == []


def test_change_tools_are_the_changes_without_the_proposal_tools(parts: Parts) -> None:
    names = {name for name, _kind in parts.facts.change_tools}
    assert "delete_vm" in names and "power_off_vm" in names
    assert not names & {"confirm_action", "cancel_action", "list_pending_actions", "get_vm_details"}


def test_facts_name_the_target_its_tags_and_the_rules_read_now(parts: Parts) -> None:
    spec = parts.registry.get("power_off_vm")
    assert spec is not None
    facts = parts.facts.facts(Entry.WRITE, parts.facts.party(AGENT), spec, {"target": "vc1"}, target="vc1")
    assert (facts.target_known, facts.target_tags, facts.category) == (True, ("lab",), Category.WRITE)
    assert facts.rules is not None and facts.rules_error is None
    unknown = parts.facts.facts(Entry.WRITE, parts.facts.party(AGENT), spec, {}, target="vc9")
    assert (unknown.target_known, unknown.target_tags) == (False, ())


def test_facts_before_resolving_do_not_read_the_rules(parts: Parts) -> None:
    spec = parts.registry.get("list_vms")
    assert spec is not None
    facts = parts.facts.facts(Entry.READ, parts.facts.party(READER), spec, {}, target="vc1", resolved=False)
    assert (facts.rules, facts.resolved) == (None, False)
