"""N of M as plain values: whether one approval counts (``gateway.guard.approvals``), the rights that
follow from it (``guard.decision.proposal_rights``), reasons, the digest an approval binds to, and the
rule fields that ask for it (``approvals_required``, ``approver_roles``, ``reason_required``,
``min_affected_objects``): parsed strictly, evaluated, shown by ``policy show``."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.config import ConfigProblems
from gateway.guard.approvals import (
    ApprovalRule,
    approval_refusal,
    blast_changes,
    reason_missing,
    shown_digest,
    tally,
)
from gateway.guard.decision import Entry, Facts, Party, Proposed, TokenState, authorize, proposal_rights
from gateway.guard.policy.evaluate import evaluate
from gateway.guard.policy.model import CallFacts
from gateway.guard.policy.parse import parse_policy_text
from gateway.proposals import Approval
from gateway.role import BUILTIN_ROLES, Role
from gateway.vocabulary import AffectedObject, Category, Kind, Risk

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
ADMIN = BUILTIN_ROLES["admin"]
LEAD = Role("lead", "*", targets="*", approve="others")
DIGEST = "d1"


def approval(who: str, *, kind: str = "person", role: str = "admin", digest: str = DIGEST,
             at: float = 1.0) -> Approval:
    return Approval("p1", who, kind, role, at, "", digest, approver_key=key(who))


def key(name: str) -> str:
    """The key text of the person these tables call ``name`` (one person per name here)."""
    return f"token::{name}"


TWO = ApprovalRule(required=2)
TWO_LEADS = ApprovalRule(required=2, roles=("lead",))

#: (case, rule, approvals so far, the digest now, expected have, expected complete, who counts)
TALLIES: list[tuple[str, ApprovalRule, list[Approval], str | None, int, bool, tuple[str, ...]]] = [
    ("none yet", TWO, [], DIGEST, 0, False, ()),
    ("one of two", TWO, [approval("alice")], DIGEST, 1, False, ("alice",)),
    ("two distinct persons", TWO, [approval("alice"), approval("olga", at=2)], DIGEST, 2, True,
     ("alice", "olga")),
    ("the same person twice counts once", TWO, [approval("alice"), approval("alice", at=2)], DIGEST, 1,
     False, ("alice",)),
    ("an agent's approval never counts", TWO, [approval("alice"), approval("bot", kind="agent")], DIGEST, 1,
     False, ("alice",)),
    ("an approval of another digest is void", TWO, [approval("alice", digest="old"), approval("olga")],
     DIGEST, 1, False, ("olga",)),
    ("approver_roles: a role outside does not count", TWO_LEADS, [approval("alice"), approval("olga",
                                                                                        role="lead")],
     DIGEST, 1, False, ("olga",)),
    ("approver_roles: two leads", TWO_LEADS, [approval("olga", role="lead"), approval("lee", role="lead")],
     DIGEST, 2, True, ("olga", "lee")),
    ("one of one is enough", ApprovalRule(), [approval("alice")], DIGEST, 1, True, ("alice",)),
    ("no digest kept: every approval counts", TWO, [approval("alice", digest=""), approval("olga")], None,
     2, True, ("alice", "olga")),
    ("one person under two names counts once", TWO,
     [approval("alice"), replace(approval("alice@new.example", at=2), approver_key=key("alice"))], DIGEST,
     1, False, ("alice",)),
    ("an approval stored without a key counts for nobody", TWO,
     [replace(approval("alice"), approver_key=None), approval("olga")], DIGEST, 1, False, ("olga",)),
]


@pytest.mark.parametrize(("rule", "approvals", "digest", "have", "complete", "by"), [c[1:] for c in TALLIES],
                         ids=[c[0] for c in TALLIES])
def test_tally(rule: ApprovalRule, approvals: list[Approval], digest: str | None, have: int, complete: bool,
               by: tuple[str, ...]) -> None:
    counted = tally(rule, approvals, digest)
    assert (counted.have, counted.complete, counted.by) == (have, complete, by)
    assert counted.text == f"{have} of {rule.required} approval{'s' if rule.required != 1 else ''}"


#: (case, approver, role, rule, approved so far, deciding, expected reason code)
REFUSALS: list[tuple[str, str, str, ApprovalRule, tuple[str, ...], str, str | None]] = [
    ("a first approval", "alice", "admin", TWO, (), "approve", None),
    ("a second approval by another", "olga", "lead", TWO, ("alice",), "approve", None),
    ("the same person again", "alice", "admin", TWO, ("alice",), "approve", "already_approved"),
    ("who approved may still deny", "alice", "admin", TWO, ("alice",), "deny", None),
    ("a role outside approver_roles approves", "alice", "admin", TWO_LEADS, (), "approve",
     "not_an_approver_role"),
    ("a role outside approver_roles denies", "alice", "admin", TWO_LEADS, (), "deny", "not_an_approver_role"),
    ("a role inside approver_roles", "olga", "lead", TWO_LEADS, (), "approve", None),
]


@pytest.mark.parametrize(("who", "role", "rule", "approved_by", "deciding", "code"),
                         [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_approval_refusal(who: str, role: str, rule: ApprovalRule, approved_by: tuple[str, ...],
                          deciding: str, code: str | None) -> None:
    assert approval_refusal(key(who), role, rule, tuple(key(a) for a in approved_by),
                            deciding=deciding) == code


@pytest.mark.parametrize(("rule", "reason", "missing"), [
    (ApprovalRule(reason_required=True), "", True),
    (ApprovalRule(reason_required=True), "  \n ", True),
    (ApprovalRule(reason_required=True), "\u200b\u200b", True),  # zero-width spaces are no reason
    (ApprovalRule(reason_required=True), "\u200d\ufeff\u2060 \u00ad", True),
    (ApprovalRule(reason_required=True), "\u200bok", False),
    (ApprovalRule(reason_required=True), "ticket OPS-1", False),
    (ApprovalRule(reason_required=True), None, False),  # not asked yet: the page's buttons
    (ApprovalRule(), "", False),
])
def test_reason_missing(rule: ApprovalRule, reason: str | None, missing: bool) -> None:
    assert reason_missing(rule, reason) is missing


def test_the_stricter_rule_takes_more_approvals_a_reason_and_the_common_roles() -> None:
    stored = ApprovalRule(2, ("lead", "ops"), False)
    assert stored.stricter(ApprovalRule(3, ("ops",), True)) == ApprovalRule(3, ("ops",), True)
    assert stored.stricter(ApprovalRule()) == stored
    assert ApprovalRule.of(None) == ApprovalRule() and ApprovalRule.of(stored.to_dict()) == stored


OBJ = [{"type": "vm", "moid": "vm-1", "name": "web-01"}]
BLAST = {"count": 1, "objects": [{"name": "web-01", "moid": "vm-1", "power_state": "poweredOff",
                                  "host": "esx-1", "snapshot_count": 0, "disks": []}]}


@pytest.mark.parametrize(("case", "changed"), [
    ("renamed", dict(affected=[{**OBJ[0], "name": "web-02"}])),
    ("another moid", dict(affected=[{**OBJ[0], "moid": "vm-2"}])),
    ("powered on", dict(blast={**BLAST, "objects": [{**BLAST["objects"][0], "power_state": "poweredOn"}]})),
    ("a snapshot more", dict(blast={**BLAST, "objects": [{**BLAST["objects"][0], "snapshot_count": 1}]})),
    ("another tool", dict(tool="unregister_vm")),
    ("other arguments", dict(args="d2")),
])
def test_the_digest_as_shown_changes_with_every_fact(case: str, changed: dict[str, Any]) -> None:
    base: dict[str, Any] = {"tool": "delete_vm", "args": "d1", "affected": OBJ, "blast": BLAST}
    now = {**base, **changed}
    assert shown_digest(base["tool"], base["args"], base["affected"], base["blast"]) != shown_digest(
        now["tool"], now["args"], now["affected"], now["blast"]), case
    same = shown_digest("delete_vm", "d1", list(OBJ), dict(BLAST))
    assert shown_digest("delete_vm", "d1", OBJ, BLAST) == same


def test_blast_changes_names_what_changed() -> None:
    after = {**BLAST, "objects": [{**BLAST["objects"][0], "power_state": "poweredOn", "host": "esx-2"}]}
    assert blast_changes(BLAST, after) == ["web-01: host", "web-01: power_state"]
    assert blast_changes(BLAST, BLAST) == []


# ------------------------------------------------------------------ the rights every surface shares


def person(name: str, role: Role = ADMIN) -> Party:
    return Party(name, TokenState.USABLE, role, Kind.PERSON, key=key(name), person_key=key(name))


def test_proposal_rights_refuse_a_second_approval_and_roles_outside_approver_roles() -> None:
    once = Proposed("bot", "vc1", "p1", proposer_key=key("bot"), approved_by=(key("alice"),), rule=TWO)
    rights = proposal_rights(person("alice"), once)
    assert rights.see and rights.approve is not None and rights.deny is None
    assert rights.approve.details["reason_code"] == "already_approved"
    assert proposal_rights(person("olga", LEAD), once).approve is None
    leads = Proposed("bot", "vc1", "p1", proposer_key=key("bot"), rule=TWO_LEADS)
    outside = proposal_rights(person("alice"), leads)
    assert outside.approve is not None and outside.approve.details["reason_code"] == "not_an_approver_role"
    assert outside.deny is not None and outside.deny.details["reason_code"] == "not_an_approver_role"
    own = proposal_rights(person("bot"), once)  # the older refusals come first
    assert own.approve is not None and own.approve.details["reason_code"] == "own_proposal"


def _approve_facts(reason: str | None, rule: ApprovalRule) -> Facts:
    return Facts(entry=Entry.APPROVE, actor=person("alice"), tool="delete_vm", category=Category.DESTRUCTIVE,
                 risk=Risk.CRITICAL, now=NOW, target="vc1",
                 owner=Party("bot", TokenState.USABLE, ADMIN, key=key("bot")),
                 proposal_id="p1", resolved=False,
                 proposed=Proposed("bot", "vc1", "p1", proposer_key=key("bot"), rule=rule),
                 reason=reason, change_tools=(("delete_vm", Category.DESTRUCTIVE),))


def test_authorize_refuses_an_approval_without_the_reason_its_rule_requires() -> None:
    from gateway.errors import ReasonRequired

    needs = ApprovalRule(reason_required=True)
    refused = authorize(_approve_facts("", needs))
    assert not refused.allowed and refused.code == "reason_required"
    with pytest.raises(ReasonRequired) as caught:
        refused.raise_if_refused()
    assert caught.value.to_wire()["reason_code"] == "reason_required"
    assert "--reason" in caught.value.message
    assert authorize(_approve_facts("ticket 7", needs)).allowed
    assert authorize(_approve_facts(None, needs)).allowed  # the page asking which buttons to offer
    assert authorize(replace(_approve_facts("", needs), entry=Entry.DENY)).code == "reason_required"


# ------------------------------------------------------------------ the rules that ask for it


def policy(text: str) -> Any:
    return parse_policy_text(textwrap.dedent(text), "rules.yaml")


RULES = """\
defaults: {destructive: allow}
targets:
  "prod-*": {require_web_approval: true, approvals_required: 2, approver_roles: [lead]}
  lab: {require_web_approval: true, reason_required: true}
rules:
  - name: big-bulk
    match: {tools: [bulk_vm_action], min_affected_objects: 10}
    action: require_approval
    approvals_required: 3
    reason_required: true
  - name: huge-bulk
    match: {tools: [bulk_vm_action], min_affected_objects: 5}
    action: deny
"""


def call(target: str, tool: str = "delete_vm", count: int = 1) -> CallFacts:
    objects = tuple(AffectedObject("vm", f"vm{i}", f"vm-{i}") for i in range(count))
    return CallFacts(tool=tool, category=Category.DESTRUCTIVE, risk=Risk.CRITICAL, target=target,
                     target_tags=(), affected=objects, caller="bot", role="admin", object_count=count)


@pytest.mark.parametrize(("case", "facts", "allowed", "n", "roles", "reason"), [
    ("a prod target asks two leads", call("prod-1"), True, 2, ("lead",), False),
    ("the lab asks a reason", call("lab"), True, 1, (), True),
    ("a bulk call of 12 VMs: the stricter rule", call("lab", "bulk_vm_action", 12), True, 3, (), True),
    ("on prod the rule raises the count, keeps the target's roles", call("prod-1", "bulk_vm_action", 12),
     True, 3, ("lead",), True),
    ("a bulk call of 6: the deny rule", call("lab", "bulk_vm_action", 6), False, 1, (), False),
    ("a bulk call of 2: the target's settings", call("lab", "bulk_vm_action", 2), True, 1, (), True),
])
def test_evaluate_asks_for_n_of_m(case: str, facts: CallFacts, allowed: bool, n: int, roles: tuple[str, ...],
                                  reason: bool) -> None:
    decision = evaluate(facts, policy(RULES), NOW)
    assert decision.allowed is allowed, decision.reason
    if allowed:
        assert decision.require_approval
        assert (decision.approvals_required, decision.approver_roles, decision.reason_required) == (
            n, roles, reason), case


def test_policy_show_names_the_n_of_m_settings() -> None:
    parsed = policy(RULES)
    settings = parsed.target_settings("prod-1").to_dict()
    assert settings["approvals_required"] == 2 and settings["approver_roles"] == ["lead"]
    assert settings["set_by"]["approvals_required"] == "targets:prod-*"
    rule = parsed.rules[0].to_dict()
    assert rule["approvals_required"] == 3 and rule["reason_required"] is True
    assert rule["match"]["min_affected_objects"] == 10


@pytest.mark.parametrize(("text", "expected"), [
    ("defaults: {approvals_required: 0}\n", "rules.yaml:1:12: defaults.approvals_required: must be a whole "
                                            "number of distinct approvers from 1 to 10"),
    ("defaults: {approvals_required: two}\n", "defaults.approvals_required: must be a whole number"),
    ("defaults: {reason_required: yes please}\n", "defaults.reason_required: must be true or false"),
    ("defaults: {approver_roles: lead}\n", "defaults.approver_roles: must be a non-empty list of strings"),
    ("rules: [{name: a, action: deny, approvals_required: 2}]\n",
     "rules.yaml:1:33: rules[0].approvals_required: applies only to 'action: require_approval'"),
    ("rules: [{name: a, action: allow, reason_required: true}]\n",
     "rules[0].reason_required: applies only to 'action: require_approval'"),
    ("rules: [{name: a, action: deny, match: {min_affected_objects: 0}}]\n",
     "rules.yaml:1:41: rules[0].match.min_affected_objects: must be a whole number >= 1"),
    ("rules: [{name: a, action: deny, match: {min_affected_object: 3}}]\n",
     "did you mean 'min_affected_objects'?"),
])
def test_the_n_of_m_fields_parse_strictly(text: str, expected: str) -> None:
    with pytest.raises(ConfigProblems) as info:
        policy(text)
    assert expected in info.value.message
