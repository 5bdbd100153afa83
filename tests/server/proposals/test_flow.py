"""``ProposalFlow``: a proposal made (stored, one ``proposed`` row, its token in the answer), listed to who
may see it, and the proposal tools (confirm, cancel) answered by its token. The vSphere side is a
stand-in (``support.server_parts.StandInExecution``)."""

from __future__ import annotations

from typing import Any

import pytest
from support.server_parts import (
    AGENT,
    READER,
    Parts,
    ProposalParts,
    StandInExecution,
    plan_of,
    proposal_parts,
    propose_delete,
)

from gateway.errors import ConfirmationInvalid
from gateway.guard import confirm

pytestmark = pytest.mark.anyio
ARGS = {"target": "vc1", "vm": "web-1"}


async def tool(parts: Parts, f: ProposalParts, principal: Any, name: str, args: dict[str, Any]) -> Any:
    """A proposal tool as ``Calls`` runs it past the gate."""
    return await f.flow.handlers()[name](parts.ctx(principal, name), args, None)


async def test_a_proposal_is_stored_audited_and_answered_with_its_token(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    answer = await propose_delete(parts, f)
    assert (answer["state"], answer["tool"], answer["target"], answer["requires_human_approval"]) == \
        ("pending", "delete_vm", "vc1", False)
    stored = parts.backends.store.proposal_by_token_hash(confirm.token_hash(answer["token"]))
    assert stored is not None
    assert (stored.id, stored.caller, stored.state) == (answer["proposal_id"], "agent-1", "pending")
    assert stored.expires_at == parts.clock() + 120.0
    (row,) = parts.rows(phase="proposed")
    assert row["proposal_id"] == answer["proposal_id"] and f.execution.ran == []


async def test_pending_proposals_are_listed_to_who_may_see_them(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    mine = await tool(parts, f, AGENT, "list_pending_actions", {})
    assert [p["proposal_id"] for p in mine["pending"]] == [made["proposal_id"]] and mine["count"] == 1
    theirs = await tool(parts, f, READER, "list_pending_actions", {})
    assert theirs == {"pending": [], "count": 0}
    assert [r["count"] for r in parts.rows(phase="call")] == [1, 0]


async def test_a_confirmation_re_plans_claims_once_and_hands_the_claim_to_the_execution(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    answer = await tool(parts, f, AGENT, "confirm_action", {"token": made["token"]})
    assert answer.value == {"state": "done"}
    (claimed,) = f.execution.claimed
    assert claimed is not None and (claimed.id, claimed.state) == (made["proposal_id"], "executing")
    assert f.execution.planned == [ARGS], "re-planned on the state now"
    (row,) = parts.rows(phase="executing")
    assert row["proposal_id"] == made["proposal_id"]
    with pytest.raises(ConfirmationInvalid):  # the token is spent: never twice
        await tool(parts, f, AGENT, "confirm_action", {"token": made["token"]})
    assert len(f.execution.ran) == 1


async def test_an_unknown_token_is_refused_and_audited(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    with pytest.raises(ConfirmationInvalid, match="unknown, already used"):
        await tool(parts, f, AGENT, "confirm_action", {"token": "not-a-token"})
    (row,) = parts.rows(phase="denied")
    assert row["error_code"] == "confirmation_invalid"


async def test_its_caller_cancels_a_proposal_by_its_token(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    assert await tool(parts, f, AGENT, "cancel_action", {"token": made["token"]}) == \
        {"state": "cancelled", "proposal_id": made["proposal_id"], "target": "vc1"}
    (row,) = parts.rows(phase="cancelled")
    assert row["reason"] == "cancelled by its caller"
    with pytest.raises(ConfirmationInvalid):
        await tool(parts, f, AGENT, "confirm_action", {"token": made["token"]})
