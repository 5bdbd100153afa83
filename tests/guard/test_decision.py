"""``authorize``: the one decision, table-tested with plain values (no I/O, no simulator)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.guard.decision import (
    Entry,
    Facts,
    Party,
    Proposed,
    TokenState,
    authorize,
    authorize_resolved,
    proposal_rights,
    sees_target_addresses,
    token_state,
    tool_permitted,
)
from gateway.guard.policy.parse import parse_policy_text
from gateway.role import BUILTIN_ROLES, Role
from gateway.vocabulary import AffectedObject, Category, Kind, Precondition, Risk

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ADMIN = BUILTIN_ROLES["admin"]
READER = BUILTIN_ROLES["reader"]
DELETER = Role("deleter", "read", frozenset({"power_off_vm"}), frozenset({"delete_vm"}), "*", "none")
BULKER = Role("bulker", "read", frozenset(), frozenset({"bulk_vm_action"}), "*", "none")
LAB = Role("lab", "read", frozenset({"power_off_vm"}), frozenset({"delete_vm"}), ("lab-*",), "none")
OTHERS = Role("approver", "read", frozenset(), frozenset(), "*", "others")
CHANGES = (
    ("power_off_vm", Category.WRITE),
    ("delete_vm", Category.DESTRUCTIVE),
    ("bulk_vm_action", Category.DESTRUCTIVE),
)
VM = AffectedObject("vm", "web-01", "vm-1")
PROTECTED = AffectedObject("vm", "vcsa-01", "vm-9")

PERMISSIVE = parse_policy_text(
    "defaults: {read: allow, write: allow, destructive: allow}\n"
    "protected: [{name: appliances, vm_patterns: ['vcsa-*']}]\n"
    "rules:\n"
    "  - {name: no-reads-for-watcher, action: deny, match: {tools: [read], callers: [watcher]}}\n"
    "  - {name: no-bulk-deletes-of-db, action: deny, match: {tools: [delete_vm], vm_patterns: ['db-*']}}\n",
    "rules.yaml",
)
GATED = parse_policy_text("defaults: {destructive: allow, require_web_approval: true}\n", "rules.yaml")
STRICT = parse_policy_text("defaults: {destructive: deny}\n", "rules.yaml")


def key(name: str) -> str:
    """The key text of the caller these tables call ``name`` (one caller per name here)."""
    return f"token::{name}"


def party(name: str = "agent", role: Role | None = ADMIN, token: TokenState = TokenState.USABLE) -> Party:
    return Party(name, token, role, key=key(name))


def person(name: str = "alice", role: Role | None = ADMIN, token: TokenState = TokenState.USABLE) -> Party:
    return Party(name, token, role, Kind.PERSON, key=key(name), person_key=key(name))


def facts(entry: Entry = Entry.WRITE, **kw: Any) -> Facts:
    values: dict[str, Any] = {
        "entry": entry,
        "actor": party(),
        "tool": "delete_vm",
        "category": Category.DESTRUCTIVE,
        "risk": Risk.CRITICAL,
        "now": NOW,
        "target": "vc1",
        "affected": (VM,),
        "object_count": 1,
        "rules": PERMISSIVE,
        "change_tools": CHANGES,
    }
    if entry in (Entry.CONFIRM, Entry.CANCEL, Entry.APPROVE, Entry.DENY):
        values["owner"] = party()
        values["proposal_id"] = "p1"
    values.update(kw)
    return Facts(**values)


READ = {"tool": "list_vms", "category": Category.READ, "risk": Risk.LOW, "affected": (), "object_count": 0}
BROKEN = {"rules": None, "rules_error": "policy file rules.yaml is unusable: line 3"}
POWERED_ON = (Precondition("VM 'web-01' is powered on; power it off first", {"vms": ["web-01"]}),)

# (case, facts, expected code (None: allowed), rule the verdict names)
CASES: list[tuple[str, Facts, str | None, str | None]] = [
    # 1. token
    ("usable token writes", facts(), None, None),
    ("revoked token", facts(actor=party(token=TokenState.REVOKED)), "forbidden", "token:revoked"),
    (
        "expired token reads",
        facts(Entry.READ, actor=party(token=TokenState.EXPIRED), **READ),
        "forbidden",
        "token:expired",
    ),
    (
        "revoked token before a broken role",
        facts(actor=party(role=None, token=TokenState.REVOKED)),
        "forbidden",
        "token:revoked",
    ),
    (
        "revoked human approves",
        facts(Entry.APPROVE, actor=person("alice", token=TokenState.REVOKED)),
        "forbidden",
        "token:revoked",
    ),
    # 2. role
    ("no role", facts(actor=party(role=None)), "not_found", None),
    ("reader writes", facts(actor=party(role=READER)), "not_found", "role:reader"),
    ("reader reads", facts(Entry.READ, actor=party(role=READER), **READ), None, None),
    ("target outside role", facts(actor=party(role=LAB)), "not_found", "role:lab"),
    ("target inside role", facts(actor=party(role=LAB), target="lab-1"), None, None),
    ("unknown target", facts(target="nope", target_known=False), "not_found", None),
    (
        "bulk delete without delete_vm",
        facts(
            actor=party(role=BULKER), tool="bulk_vm_action", reaches=(("delete_vm", Category.DESTRUCTIVE),)
        ),
        "forbidden",
        "role:bulker",
    ),
    (
        "bulk delete with delete_vm",
        facts(actor=party(role=ADMIN), tool="bulk_vm_action", reaches=(("delete_vm", Category.DESTRUCTIVE),)),
        None,
        None,
    ),
    (
        "confirm by another caller",
        facts(Entry.CONFIRM, actor=party("other")),
        "confirmation_invalid",
        "caller:bound",
    ),
    (
        "cancel by another caller",
        facts(Entry.CANCEL, actor=party("other")),
        "confirmation_invalid",
        "caller:bound",
    ),
    (
        "approve without the right",
        facts(Entry.APPROVE, actor=person("bob", role=READER)),
        "not_found",
        "role:reader",
    ),
    (
        "approve own with others",
        facts(Entry.APPROVE, actor=person("agent", role=OTHERS)),
        "forbidden",
        "approve:own",
    ),
    ("approve another's with others", facts(Entry.APPROVE, actor=person("bob", role=OTHERS)), None, None),
    ("deny without the right", facts(Entry.DENY, actor=person("bob", role=READER)), "not_found", None),
    ("admin agent approves", facts(Entry.APPROVE, actor=party("bot")), "forbidden", "kind:agent"),
    ("admin agent approves its own", facts(Entry.APPROVE), "forbidden", "kind:agent"),
    ("admin agent denies", facts(Entry.DENY, actor=party("bot")), "forbidden", "kind:agent"),
    ("admin person approves own", facts(Entry.APPROVE, actor=person("agent")), "forbidden", "approve:own"),
    ("admin person denies own", facts(Entry.DENY, actor=person("agent")), "forbidden", "approve:own"),
    ("approve with no proposer", facts(Entry.APPROVE, actor=person(), owner=None), "not_found", None),
    # 2b. the proposer, now
    (
        "confirm after revoke",
        facts(Entry.CONFIRM, actor=party(token=TokenState.REVOKED), owner=party(token=TokenState.REVOKED)),
        "forbidden",
        "token:revoked",
    ),
    (
        "approve after proposer revoked",
        facts(Entry.APPROVE, actor=person("alice"), owner=party(token=TokenState.REVOKED)),
        "forbidden",
        "token:revoked",
    ),
    (
        "approve after proposer demoted",
        facts(Entry.APPROVE, actor=person("alice"), owner=party(role=READER)),
        "forbidden",
        "role:reader",
    ),
    (
        "approve after proposer's role vanished",
        facts(Entry.APPROVE, actor=person("alice"), owner=party(role=None)),
        "forbidden",
        None,
    ),
    (
        "deny after proposer revoked",
        facts(Entry.DENY, actor=person("alice"), owner=party(token=TokenState.REVOKED)),
        None,
        None,
    ),
    # 3. policy
    ("strict destructive", facts(rules=STRICT), "policy_denied", None),
    ("protected VM", facts(affected=(PROTECTED,)), "policy_denied", "protected:appliances"),
    (
        "read deny rule",
        facts(Entry.READ, actor=party("watcher", role=READER), **READ),
        "policy_denied",
        "rule:no-reads-for-watcher",
    ),
    ("read under broken rules", facts(Entry.READ, **READ, **BROKEN), "policy_denied", "policy:error"),
    ("write under broken rules", facts(**BROKEN), "policy_denied", "policy:error"),
    ("agent confirms a gated call", facts(Entry.CONFIRM, rules=GATED), "approval_required", None),
    ("human approves a gated call", facts(Entry.APPROVE, actor=person("alice"), rules=GATED), None, None),
    ("confirm after rules turned strict", facts(Entry.CONFIRM, rules=STRICT), "policy_denied", None),
    ("cancel is never refused by policy", facts(Entry.CANCEL, rules=STRICT), None, None),
    (
        "bulk object as delete_vm",
        facts(Entry.BULK_OBJECT, affected=(AffectedObject("vm", "db-1", "vm-3"),)),
        "policy_denied",
        "rule:no-bulk-deletes-of-db",
    ),
    # 4. state, only after everything above
    ("powered on, allowed", facts(unmet=POWERED_ON), "invalid_state", "state"),
    ("powered on, protected", facts(affected=(PROTECTED,), unmet=POWERED_ON), "policy_denied", None),
    ("powered on, broken rules", facts(unmet=POWERED_ON, **BROKEN), "policy_denied", "policy:error"),
    ("powered on, role refused", facts(actor=party(role=READER), unmet=POWERED_ON), "not_found", None),
    (
        "used proposal",
        facts(Entry.CONFIRM, proposal_problem=("confirmation_invalid", "already used")),
        "confirmation_invalid",
        "proposal:state",
    ),
    (
        "expired proposal, revoked confirmer",
        facts(
            Entry.CONFIRM,
            actor=party(token=TokenState.REVOKED),
            proposal_problem=("confirmation_expired", "expired"),
        ),
        "forbidden",
        None,
    ),
    # the gate before resolving: token and role only, then the proposal's own state
    ("gate lets a strict-policy call on to resolution", facts(rules=STRICT, resolved=False), None, "gate"),
    ("gate refuses the role", facts(actor=party(role=READER), resolved=False), "not_found", None),
    (
        "gate answers a used proposal",
        facts(Entry.CONFIRM, resolved=False, proposal_problem=("confirmation_invalid", "already used")),
        "confirmation_invalid",
        None,
    ),
]


@pytest.mark.parametrize(("f", "code", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_authorize(f: Facts, code: str | None, rule: str | None) -> None:
    verdict = authorize(f)
    assert verdict.code == code, verdict.reason
    assert verdict.allowed is (code is None)
    if rule is not None:
        assert verdict.rule == rule


def test_a_denied_caller_never_hears_about_power_state() -> None:
    for f in (
        facts(affected=(PROTECTED,), unmet=POWERED_ON),
        facts(unmet=POWERED_ON, **BROKEN),
        facts(actor=party(role=READER), unmet=POWERED_ON),
    ):
        assert "power" not in authorize(f).reason.lower()


def test_a_refusal_raises_its_typed_error_with_the_verdict() -> None:
    from gateway.errors import Forbidden

    verdict = authorize(
        facts(actor=party(role=BULKER), tool="bulk_vm_action", reaches=(("delete_vm", Category.DESTRUCTIVE),))
    )
    with pytest.raises(Forbidden) as caught:
        verdict.raise_if_refused()
    assert caught.value.details["decision"]["rule"] == "role:bulker"
    assert "delete_vm" in caught.value.message


def test_the_gated_call_needs_a_human() -> None:
    verdict = authorize(facts(rules=GATED))
    assert verdict.allowed and verdict.require_approval


def test_an_agents_confirm_of_a_gated_call_says_it_requires_approval() -> None:
    from gateway.errors import ApprovalRequired

    verdict = authorize(facts(Entry.CONFIRM, rules=GATED))
    assert verdict.code == "approval_required" and verdict.to_dict()["require_approval"] is True
    with pytest.raises(ApprovalRequired) as caught:
        verdict.raise_if_refused()
    assert caught.value.details["decision"]["require_approval"] is True


@pytest.mark.parametrize(("role", "sees"), [
    (BUILTIN_ROLES["admin"], True),
    (BUILTIN_ROLES["reader"], False),  # covers every target, yet is no admin
    (Role("ops", tools="*", targets="*"), True),
    (Role("ops", tools="*", targets=("vc-*",)), False),
    (Role("ops", tools="read", allow_write=frozenset({"power_on_vm"}), targets="*"), False),
    (None, False),
])
def test_target_addresses_are_an_admins(role: Role | None, sees: bool) -> None:
    assert sees_target_addresses(role) is sees


def test_proposal_tools_come_with_the_first_change_tool() -> None:
    assert tool_permitted(DELETER, "confirm_action", Category.WRITE, CHANGES)
    assert not tool_permitted(READER, "confirm_action", Category.WRITE, CHANGES)
    assert tool_permitted(READER, "list_vms", Category.READ, CHANGES)


def test_token_state_of_records() -> None:
    from gateway.store.base import TokenRecord

    rec = TokenRecord("id", "n", "admin", "h", created_at=0.0, expires_at=100.0)
    assert token_state(None, 0.0) is TokenState.UNKNOWN
    assert token_state(rec, 50.0) is TokenState.USABLE
    assert token_state(rec, 100.0) is TokenState.EXPIRED
    assert token_state(replace(rec, revoked=True), 50.0) is TokenState.REVOKED


LAB_LEAD = Role("lab-lead", "read", frozenset(), frozenset(), ("lab-*",), "any")
#: (case, viewer, proposer, target, sees, approve refusal's reason code (None: may), deny's)
RIGHTS: list[tuple[str, Party, str, str, bool, str | None, str | None]] = [
    ("a person with approve: any, another's proposal", person("alice"), "bot", "vc1", True, None, None),
    ("a person with approve: any, their own proposal", person("alice"), "alice", "vc1", True,
     "own_proposal", "own_proposal"),
    ("a person with approve: others, their own proposal", person("olga", OTHERS), "olga", "vc1", True,
     "own_proposal", "own_proposal"),
    ("a person with approve: others, another's", person("olga", OTHERS), "bot", "vc1", True, None, None),
    ("an admin agent, another's proposal", party("bot2"), "bot", "vc1", True, "not_a_person", "not_a_person"),
    ("an admin agent, its own proposal", party("bot"), "bot", "vc1", True, "not_a_person", "not_a_person"),
    ("a reader person, another's proposal", person("rita", READER), "bot", "vc1", False,
     "not_visible", "not_visible"),
    ("a reader person, their own proposal", person("rita", DELETER), "rita", "vc1", True,
     "no_approve_right", "no_approve_right"),
    ("an agent without the right, its own", party("bot", DELETER), "bot", "vc1", True,
     "not_a_person", "not_a_person"),
    ("an agent without the right, another's", party("bot", DELETER), "bot2", "vc1", False,
     "not_visible", "not_visible"),
    ("a person approver outside the target", person("lara", LAB_LEAD), "bot", "prod-1", False,
     "not_visible", "not_visible"),
    ("a person approver inside the target", person("lara", LAB_LEAD), "bot", "lab-1", True, None, None),
    ("a proposer whose role lost the target", party("bot", LAB), "bot", "prod-1", False,
     "not_visible", "not_visible"),
    ("a person whose role is gone", person("gone", None), "bot", "vc1", False, "not_visible", "not_visible"),
    ("the OS user, a proposal of its agent session", person("os:ann"), "stdio:ann", "vc1", True, None, None),
    ("the OS user, its own proposal", person("os:ann"), "os:ann", "vc1", True,
     "own_proposal", "own_proposal"),
]


@pytest.mark.parametrize(("viewer", "proposer", "target", "sees", "approve", "deny"), [c[1:] for c in RIGHTS],
                         ids=[c[0] for c in RIGHTS])
def test_proposal_rights(viewer: Party, proposer: str, target: str, sees: bool, approve: str | None,
                         deny: str | None) -> None:
    rights = proposal_rights(viewer, Proposed(proposer, target, "p1", proposer_key=key(proposer)))
    assert rights.see is sees
    for refusal, expected in ((rights.approve, approve), (rights.deny, deny)):
        assert (refusal.details["reason_code"] if refusal is not None else None) == expected
        assert refusal is None or (not refusal.allowed and refusal.code in ("forbidden", "not_found"))


def test_authorize_asks_proposal_rights_for_approve_and_deny() -> None:
    """The verdicts of approve and deny carry the rights' reason code to the error (and the audit row)."""
    from gateway.errors import Forbidden

    verdict = authorize(facts(Entry.APPROVE, actor=person("agent")))
    with pytest.raises(Forbidden) as caught:
        verdict.raise_if_refused()
    assert caught.value.to_wire()["reason_code"] == "own_proposal"
# ------------------------------------------------------------------ the order on a resolved call

DB = AffectedObject("vm", "db-01", "vm-2")
NO_DISK = (Precondition("disk: VM 'vcsa-01' has no disk 'Hard disk 9'; its disks: Hard disk 1 (key 2000)",
                        {"field": "disk"}, "invalid_argument"),)
TWO_SNAPSHOTS = (
    Precondition("2 snapshots of VM 'web-01' are named 'a'", {"field": "snapshot"}, "ambiguous"),
)
BULK_DELETE = {"tool": "bulk_vm_action", "reaches": (("delete_vm", Category.DESTRUCTIVE),)}
REACHED_DELETE = (("delete_vm", Category.DESTRUCTIVE, Risk.CRITICAL),)
NOT_MALLORY = parse_policy_text(
    "defaults: {destructive: allow}\n"
    "rules: [{name: not-mallory, action: deny, match: {tools: [delete_vm], callers: [mallory]}}]\n",
    "rules.yaml",
)

# (case, facts, reached tools, expected code (None: allowed), rule the verdict names)
RESOLVED: list[tuple[str, Facts, tuple[tuple[str, Category, Risk], ...], str | None, str | None]] = [
    ("allowed call, no preconditions", facts(), (), None, "defaults"),
    ("protected object before a missing disk", facts(affected=(PROTECTED,), unmet=NO_DISK), (),
     "policy_denied", "protected:appliances"),
    ("missing disk once the policy allows", facts(unmet=NO_DISK), (), "invalid_argument", "state"),
    ("ambiguous snapshot once the policy allows", facts(unmet=TWO_SNAPSHOTS), (), "ambiguous", "state"),
    ("powered on once the policy allows", facts(unmet=POWERED_ON), (), "invalid_state", "state"),
    ("role lacking the reached tool before the objects", facts(actor=party(role=BULKER), affected=(DB,),
     unmet=POWERED_ON, **BULK_DELETE), REACHED_DELETE, "forbidden", "role:bulker"),
    ("object as the reached tool before preconditions", facts(affected=(VM, DB), unmet=POWERED_ON,
     **BULK_DELETE), REACHED_DELETE, "policy_denied", "rule:no-bulk-deletes-of-db"),
    ("objects as the reached tool all allowed, then preconditions", facts(affected=(VM,), unmet=POWERED_ON,
     **BULK_DELETE), REACHED_DELETE, "invalid_state", "state"),
    ("at approval objects are judged as the proposer", facts(Entry.APPROVE, actor=person("alice"),
     owner=party("mallory"), rules=NOT_MALLORY, **BULK_DELETE), REACHED_DELETE, "policy_denied",
     "rule:not-mallory"),
    ("the approver's own name does not matter", facts(Entry.APPROVE, actor=person("mallory"),
     owner=party("bob"), rules=NOT_MALLORY, **BULK_DELETE), REACHED_DELETE, None, "defaults"),
    ("proposal state before preconditions", facts(Entry.CONFIRM, proposal_problem=("confirmation_expired",
     "this proposal expired"), unmet=NO_DISK), (), "confirmation_expired", "proposal:state"),
]


@pytest.mark.parametrize(
    ("f", "reached", "code", "rule"), [c[1:] for c in RESOLVED], ids=[c[0] for c in RESOLVED]
)
def test_authorize_resolved_decides_call_then_objects_then_preconditions(
    f: Facts, reached: tuple[tuple[str, Category, Risk], ...], code: str | None, rule: str | None
) -> None:
    verdict = authorize_resolved(f, reached)
    assert verdict.code == code, verdict.reason
    assert verdict.allowed is (code is None)
    assert verdict.rule == rule, verdict.reason


def test_a_denied_caller_never_hears_about_disks() -> None:
    verdict = authorize_resolved(facts(affected=(PROTECTED,), unmet=NO_DISK))
    assert "disk" not in verdict.reason.lower()


def test_a_precondition_on_an_argument_raises_invalid_argument_naming_its_field() -> None:
    from gateway.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as caught:
        authorize_resolved(facts(unmet=NO_DISK)).raise_if_refused()
    assert caught.value.details["field"] == "disk"
    assert caught.value.message == NO_DISK[0].message
    assert caught.value.details["decision"]["rule"] == "state"
