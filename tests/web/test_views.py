"""gateway.web.views: a proposal's card for one viewer, and the audit verification report, as plain values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.audit.verify import LineFault, VerifyReport
from gateway.auth.principal import CallerKey
from gateway.auth.tokens import Principal
from gateway.guard.decision import Verdict
from gateway.proposals import Proposal
from gateway.vocabulary import Kind
from gateway.web.views import proposal_card, proposed_by, verify_body

NOW = 1_800_000_000.0
ALICE = CallerKey.person("https://idp.example", "alice")


def proposal(**changes: Any) -> Proposal:
    base: dict[str, Any] = {
        "id": "abcdefabcdef", "token_hash": "h", "caller": "ci-bot", "role": "operator", "surface": "https",
        "target": "vc1", "target_host": "vc1.example", "tool": "delete_vm", "args": {"vm": "web"},
        "args_digest": "d", "plan_summary": "PERMANENTLY DELETE VM 'web' (vm-1)",
        "affected": [{"type": "vm", "name": "web", "moid": "vm-1"}], "plan_params": {},
        "created_at": NOW - 60, "expires_at": NOW + 240, "require_web_approval": True,
        "caller_key": str(CallerKey.token("tok1")), "acting_for_key": str(ALICE),
    }
    return Proposal(**{**base, **changes})


def test_a_card_without_rights_offers_nothing() -> None:
    card = proposal_card(proposal(), NOW, mine=False, rights=None)
    assert card["gated"] is True and card["requested_via"] == "https" and card["decided_at"] is None
    assert card["mine"] is False
    assert (card["can_decide"], card["decide_note"], card["can_approve"], card["approve_note"]) == (
        False, None, False, None)
    assert card["proposal_id"] == "abcdefabcdef" and card["tool"] == "delete_vm"


def test_a_card_with_rights_says_what_the_viewer_may_do_and_why_not() -> None:
    deny = Verdict(True, "may deny", "rights")
    approve = Verdict(False, "you proposed it\x1b[31m yourself", "own_proposal", code="forbidden")
    card = proposal_card(proposal(), NOW, mine=True, rights=(deny, approve))
    assert card["mine"] is True
    assert card["can_decide"] is True and card["decide_note"] is None
    assert card["can_approve"] is False
    assert card["approve_note"] is not None and "\x1b" not in card["approve_note"]
    assert card["approve_note"].startswith("you proposed it")


def test_a_card_with_every_right() -> None:
    yes = Verdict(True, "ok", "rights")
    card = proposal_card(proposal(), NOW, mine=False, rights=(yes, yes))
    assert (card["can_decide"], card["can_approve"]) == (True, True)


def test_proposed_by_the_agent_or_for_the_person() -> None:
    agent = Principal("ci-bot", "operator", "tok1")
    alice = Principal("alice", "lead", None, kind=Kind.PERSON, key=ALICE)
    bob_key = CallerKey.person("https://idp.example", "bob")
    bob = Principal("bob", "lead", None, kind=Kind.PERSON, key=bob_key)
    assert proposed_by(proposal(), agent)
    assert proposed_by(proposal(), alice)
    assert not proposed_by(proposal(), bob)
    assert not proposed_by(proposal(), Principal("ci-bot", "operator", "tok2"))  # the same name, another key


def test_a_proposal_without_keys_is_nobodys() -> None:
    agent = Principal("ci-bot", "operator", "tok1")
    assert not proposed_by(proposal(caller_key=None, acting_for_key=None), agent)


def test_verify_body_names_files_never_their_paths() -> None:
    broken = LineFault(Path("/var/lib/gateway/audit.jsonl"), 7, "hash_mismatch", "row 7")
    torn = LineFault(Path("/var/lib/gateway/audit.jsonl"), 9, "torn", "cut")
    report = VerifyReport(files=(Path("/var/lib/gateway/audit.jsonl"),), rows=9, first_seq=1, last_seq=9,
                          first_broken_line=broken, torn_last_line=torn, problems=2,
                          starts_after_rotation=True)
    assert verify_body(report) == {
        "ok": False, "rows": 9, "first_seq": 1, "last_seq": 9, "problems": 2, "starts_after_rotation": True,
        "first_broken_line": {"file": "audit.jsonl", "line": 7, "reason": "hash_mismatch", "detail": "row 7"},
        "torn_last_line": {"file": "audit.jsonl", "line": 9, "reason": "torn", "detail": "cut"}}


def test_verify_body_of_a_good_chain() -> None:
    report = VerifyReport(files=(), rows=0, first_seq=None, last_seq=None, first_broken_line=None,
                          torn_last_line=None, problems=0, starts_after_rotation=False)
    body = verify_body(report)
    assert body["ok"] is True and body["first_broken_line"] is None and body["torn_last_line"] is None
