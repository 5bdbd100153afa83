"""``ApprovalSteps``: a person's approval recorded and counted (N of M, each person once), the answer to an
approval that is not yet the last, and a proposal re-read against what its approvers were shown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.server_parts import HUMAN, Parts, plan_of, proposal_of

from gateway.auth.tokens import Principal
from gateway.errors import ConfirmationInvalid, Stale
from gateway.guard.confirm import args_digest
from gateway.guard.policy.model import Decision
from gateway.proposals import Proposal
from gateway.server.base.moves import Moves
from gateway.server.proposals.approval_steps import ApprovalSteps
from gateway.server.proposals.views import as_shown
from gateway.vocabulary import Kind

pytestmark = pytest.mark.anyio
TWO = Decision(True, "two people", "rule:two", require_approval=True, approvals_required=2)
OLGA = Principal(name="olga", role="admin", surface="web", kind=Kind.PERSON)


@pytest.fixture
def steps(parts: Parts) -> Iterator[ApprovalSteps]:
    b = parts.backends
    moves = Moves(b.store, parts.trail, parts.registry, parts.facts, instance=b.instance, reader=b.reader,
                  sweep_leader=None, clock=parts.clock)
    yield ApprovalSteps(moves=moves, store=b.store, trail=parts.trail, clock=parts.clock)


def shown_proposal(parts: Parts) -> Proposal:
    made = args_digest("delete_vm", "vc1", {"target": "vc1", "vm": "web-1"})  # as ``proposal_of`` makes it
    _affected, _blast, digest = as_shown("delete_vm", made, plan_of("web-1"))
    return proposal_of(parts, require_web_approval=True, approval_rule={"required": 2}, shown_digest=digest)


async def test_approvals_are_counted_until_the_rule_is_met(parts: Parts, steps: ApprovalSteps) -> None:
    proposal = shown_proposal(parts)
    first = await steps.record(parts.ctx(HUMAN, "delete_vm"), proposal, TWO, "looks right")
    assert (first.complete, first.have, first.need, first.by) == (False, 1, 2, ("alice",))
    waiting = steps.waiting(proposal.id, first)
    assert (waiting["state"], waiting["approved_by"]) == ("pending", ["alice"])
    assert "1 more different approver(s)" in waiting["note"]
    second = await steps.record(parts.ctx(OLGA, "delete_vm"), proposal, TWO, "")
    assert second.complete and set(second.by) == {"alice", "olga"}
    assert [r["approvals"] for r in parts.rows(phase="approval")] == [first.text, second.text]


async def test_one_person_approves_once(parts: Parts, steps: ApprovalSteps) -> None:
    proposal = shown_proposal(parts)
    await steps.record(parts.ctx(HUMAN, "delete_vm"), proposal, TWO, "")
    with pytest.raises(ConfirmationInvalid):
        await steps.record(parts.ctx(HUMAN, "delete_vm"), proposal, TWO, "again")
    assert len(parts.rows(phase="claim_lost")) == 1


async def test_a_proposal_changed_since_it_was_shown_is_stale(parts: Parts, steps: ApprovalSteps) -> None:
    proposal = shown_proposal(parts)
    ctx = parts.ctx(HUMAN, "delete_vm")
    await steps.check_as_shown(ctx, proposal, plan_of("web-1"))  # as shown: passes
    with pytest.raises(Stale, match="changed in vSphere since it was shown"):
        await steps.check_as_shown(ctx, proposal, plan_of("web-2"))
    stored = parts.backends.store.get_proposal(proposal.id)
    assert stored is not None and stored.state == "stale"
