"""``ProposalActions``: what is done with a proposal that exists: confirmed (decided again, re-planned,
claimed once, handed to the execution), found stale, denied or approved by a human. The vSphere side is a
stand-in (``support.server_parts.StandInExecution``)."""

from __future__ import annotations

import pytest
from support.server_parts import (
    AGENT,
    HUMAN,
    READER,
    Parts,
    StandInExecution,
    plan_of,
    proposal_parts,
    propose_delete,
)

from gateway.errors import ConfirmationInvalid, NotFound, Stale
from gateway.proposals import Proposal

pytestmark = pytest.mark.anyio
ARGS = {"target": "vc1", "vm": "web-1"}


def stored(parts: Parts, proposal_id: str) -> Proposal:
    found = parts.backends.store.get_proposal(proposal_id)
    assert found is not None
    return found


async def test_a_confirmation_claims_the_proposal_once_and_runs_it(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    ctx = parts.ctx(AGENT, "confirm_action")
    answer = await f.actions.confirm(ctx, stored(parts, made["proposal_id"]), None)
    assert answer.value == {"state": "done"}
    (claimed,) = f.execution.claimed
    assert claimed is not None
    assert (claimed.state, claimed.executor) == ("executing", parts.backends.instance.id)
    with pytest.raises(ConfirmationInvalid):  # executing now: a second confirmation is refused
        await f.actions.confirm(ctx, stored(parts, made["proposal_id"]), None)
    assert len(f.execution.ran) == 1


async def test_a_proposal_whose_objects_changed_is_stale_and_runs_nothing(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1-renamed")))
    made = await propose_delete(parts, f)
    with pytest.raises(Stale):
        await f.actions.confirm(parts.ctx(AGENT, "confirm_action"), stored(parts, made["proposal_id"]), None)
    assert stored(parts, made["proposal_id"]).state == "stale" and f.execution.ran == []
    (row,) = parts.rows(phase="stale")
    assert row["proposal_id"] == made["proposal_id"]


async def test_a_proposal_withdrawn_twice_is_one_move_then_a_lost_race(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    ctx = parts.ctx(AGENT, "delete_vm")
    await f.actions.withdraw(ctx, stored(parts, made["proposal_id"]), "declined by the person at the client")
    with pytest.raises(ConfirmationInvalid):
        await f.actions.withdraw(ctx, stored(parts, made["proposal_id"]), "declined again")
    assert [r["phase"] for r in parts.rows() if r.get("proposal_id") == made["proposal_id"]] == \
        ["proposed", "cancelled", "claim_lost"]


async def test_a_human_denies_a_proposal_and_a_reader_may_not(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    with pytest.raises(NotFound, match="that you may see"):  # a proposal the reader may not see
        await f.actions.deny(made["proposal_id"], READER)
    assert await f.actions.deny(made["proposal_id"], HUMAN, reason="not now") == \
        {"state": "denied", "proposal_id": made["proposal_id"], "target": "vc1"}
    (row,) = parts.rows(phase="denied", caller="alice")
    assert row["reason"] == "denied by alice: not now"


async def test_a_human_approval_runs_the_proposal_as_the_human(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    made = await propose_delete(parts, f)
    stored = parts.backends.store.get_proposal(made["proposal_id"])
    assert stored is not None
    deny, approve = f.actions.decision_rights(stored, HUMAN)
    assert deny.allowed and approve.allowed
    answer = await f.actions.approve(made["proposal_id"], HUMAN)
    assert answer.value == {"state": "done"}
    (claimed,) = f.execution.claimed
    assert claimed is not None and claimed.approved_by == "alice"
    assert [r["phase"] for r in parts.rows() if r.get("proposal_id") == made["proposal_id"]] == \
        ["proposed", "approval", "approved", "executing"]


async def test_approving_a_proposal_nobody_made_is_not_found(parts: Parts) -> None:
    f = proposal_parts(parts, StandInExecution(plan_of("web-1")))
    with pytest.raises(NotFound):
        await f.actions.approve("p-none", HUMAN)
