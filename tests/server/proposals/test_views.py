"""What a proposal shows (``server.proposals.views``): its view never carries the token or its hash, the
text is redacted, a reason with nothing visible is no reason, a changed object makes it stale."""

from __future__ import annotations

import pytest
from support.server_parts import AGENT, Parts, plan_of, proposal_of

from gateway.errors import Stale
from gateway.guard.policy.model import Decision
from gateway.server.proposals.views import (
    as_shown,
    check_not_stale,
    clean_reason,
    proposal_view,
    rule_of,
    void_note,
)


def test_a_view_shows_the_proposal_and_never_its_token(parts: Parts) -> None:
    proposal = proposal_of(parts, caller=AGENT)
    view = proposal_view(proposal, parts.clock() + 100)
    assert (view["proposal_id"], view["requested_by"], view["expires_in_seconds"]) == \
        (proposal.id, "agent-1", 200)
    assert proposal.token_hash not in str(view) and "token" not in view


def test_a_reason_with_nothing_visible_is_no_reason() -> None:
    assert clean_reason("  \u200b \t") == ""
    assert clean_reason("  reviewed   with   the team ") == "reviewed with the team"
    assert clean_reason(None) == ""


def test_a_proposal_is_stale_when_its_objects_changed(parts: Parts) -> None:
    proposal = proposal_of(parts)
    check_not_stale(proposal, plan_of("web-1"))  # the same object: not stale
    with pytest.raises(Stale):
        check_not_stale(proposal, plan_of("web-2"))


def test_the_shown_digest_binds_what_the_approvers_saw() -> None:
    _affected, _blast, one = as_shown("delete_vm", "d1", plan_of("web-1"))
    _affected, _blast, same = as_shown("delete_vm", "d1", plan_of("web-1"))
    _affected, _blast, other = as_shown("delete_vm", "d1", plan_of("web-2"))
    assert one == same != other


def test_the_rule_is_the_decisions_n_of_m_and_no_approvals_void_nothing(parts: Parts) -> None:
    rule = rule_of(Decision(True, "ok", None, approvals_required=2, approver_roles=("lead",)))
    assert (rule.required, rule.roles) == (2, ("lead",))
    assert void_note(proposal_of(parts)) == ""
