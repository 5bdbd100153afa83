"""The proposal lifecycle table: the only moves a proposal can make, and the records it keeps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.proposals import (
    EDGES,
    FINAL_STATES,
    OPEN_STATES,
    STATES,
    Approval,
    IllegalTransition,
    Proposal,
    allowed,
    check_edge,
    sources,
)

LEGAL = [(a, b) for a, outs in EDGES.items() for b in sorted(outs)]
ILLEGAL = [(a, b) for a in sorted(STATES) for b in sorted(STATES) if b not in EDGES[a]]


@pytest.mark.parametrize(("source", "target"), LEGAL)
def test_every_edge_of_the_table_is_allowed(source: str, target: str) -> None:
    assert allowed(source, target)
    assert check_edge([source], target) == (source,)


@pytest.mark.parametrize(("source", "target"), ILLEGAL)
def test_a_move_not_in_the_table_is_refused(source: str, target: str) -> None:
    assert not allowed(source, target)
    with pytest.raises(IllegalTransition, match="no transition"):
        check_edge([source], target)


def test_final_states_have_no_way_out() -> None:
    assert frozenset({"executed", "failed", "outcome_unknown", "denied", "cancelled", "expired",
                      "stale"}) == FINAL_STATES
    assert all(not EDGES[s] for s in FINAL_STATES)


def test_open_states_wait_for_a_decision() -> None:
    assert OPEN_STATES == ("pending", "approved")
    assert not set(OPEN_STATES) & FINAL_STATES


def test_outcome_unknown_is_reached_only_from_executing() -> None:
    assert sources("outcome_unknown") == ("executing",)


@pytest.mark.parametrize(("target", "expected"), [
    ("approved", ("pending",)),
    ("executing", ("approved", "pending")),
    ("executed", ("executing",)),
    ("cancelled", ("approved", "pending")),
    ("expired", ("approved", "pending")),
    ("stale", ("approved", "pending")),
    ("denied", ("pending",)),
    ("pending", ()),
])
def test_sources_lists_every_state_with_an_edge_to_the_target_sorted(target: str,
                                                                     expected: tuple[str, ...]) -> None:
    assert sources(target) == expected


def test_check_edge_accepts_several_sources_and_any_iterable() -> None:
    assert check_edge(iter(["pending", "approved"]), "expired") == ("pending", "approved")


def test_check_edge_names_the_bad_sources() -> None:
    with pytest.raises(IllegalTransition, match=r"\['executed'\] -> 'expired'"):
        check_edge(["pending", "executed"], "expired")


def test_check_edge_refuses_no_sources() -> None:
    with pytest.raises(IllegalTransition, match=r"\(\) -> 'expired'"):
        check_edge([], "expired")


def test_check_edge_refuses_an_unknown_target() -> None:
    with pytest.raises(IllegalTransition, match="unknown proposal state 'done'"):
        check_edge(["pending"], "done")


def test_allowed_of_an_unknown_source_is_false() -> None:
    assert not allowed("nowhere", "pending")


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


def _proposal(**fields: Any) -> Proposal:
    base: dict[str, Any] = dict(
        id="p1", token_hash="h", caller="agent", role="admin", surface="https", target="vc1",
        target_host="vc1.example", tool="delete_vm", args={"vm": "web1"}, args_digest="d",
        plan_summary="delete web1", affected=[], plan_params={}, created_at=1.0, expires_at=2.0)
    base.update(fields)
    return Proposal(**base)


def test_a_proposal_starts_pending_with_no_approvals() -> None:
    p = _proposal()
    assert p.state == "pending"
    assert p.approvals == ()
    assert p.caller_key is None


@pytest.mark.parametrize("state", sorted(STATES))
def test_a_proposal_may_be_in_any_known_state(state: str) -> None:
    assert _proposal(state=state).state == state


def test_a_proposal_in_an_unknown_state_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown proposal state 'done'"):
        _proposal(state="done")
    with pytest.raises(ValueError):
        replace(_proposal(), state="bogus")


def test_approval_to_dict_shows_who_when_and_why_but_not_the_digest() -> None:
    a = Approval("p1", "alice", "person", "admin", 5.0, "looks right", "abc", approver_key="token::x")
    assert a.to_dict() == {"by": "alice", "kind": "person", "role": "admin", "at": 5.0,
                           "reason": "looks right"}
