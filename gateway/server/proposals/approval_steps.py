"""A human's approval of a proposal, between its re-planning and its claim.

The proposal is re-read against what its approvers were shown (a difference voids every approval and
makes it ``stale``); the approval is recorded and counted (N of M, ``guard.approvals.tally``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import Stale
from gateway.guard.approvals import ApprovalRule, Tally, blast_changes, tally
from gateway.guard.callers import key_of, person_of
from gateway.guard.policy.model import Decision
from gateway.proposals import OPEN_STATES, Approval, Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import CallContext, off_loop, truncate
from gateway.server.base.moves import Moves
from gateway.server.proposals.views import as_shown, clean_reason, proposal_view, rule_of, void_note, voided
from gateway.store.base import StateStore
from gateway.vocabulary import Plan


class ApprovalSteps:
    """The steps of an approval that a confirmation does not take (see the module doc)."""

    def __init__(self, *, moves: Moves, store: StateStore, trail: AuditTrail,
                 clock: Callable[[], float]) -> None:
        self.moves = moves
        self.store = store
        self.trail = trail
        self.clock = clock

    async def check_as_shown(self, ctx: CallContext, proposal: Proposal, plan: Plan) -> None:
        """The proposal as re-read now against what its approvers were shown (objects with moids and the
        blast radius, ``shown_digest``): any difference voids every approval, the proposal becomes
        ``stale`` (its row names what changed), and proposer and approvers are told (notification)."""
        if proposal.shown_digest is None:
            return
        _affected, blast, now_digest = await off_loop(as_shown, proposal.tool, proposal.args_digest, plan)
        if now_digest == proposal.shown_digest:
            return
        changed = blast_changes(proposal.blast_radius, blast) or ["the affected objects"]
        what = truncate("; ".join(changed), 400)
        error = Stale(
            f"proposal {proposal.id} changed in vSphere since it was shown ({what}); "
            f"{void_note(proposal)}make a fresh proposal and check it again",
            proposal_id=proposal.id,
        )
        moved = await self.moves.move(
            proposal, OPEN_STATES, "stale", actor=ctx.principal, correlation_id=ctx.correlation_id,
            outcome="stale", error=error.to_wire(), decided_at=self.clock(),
            reason=truncate(f"changed since shown: {what}; approvals void: {voided(proposal)}", 512),
        )
        if moved is None:
            await self.moves.lost(ctx, proposal, f"found changed ({what}) after another caller had moved "
                                  "the proposal; nothing was sent")
        raise error

    async def record(self, ctx: CallContext, proposal: Proposal, decision: Decision,
                               reason: str) -> Tally:
        """Record this person's approval (bound to the digest as shown), audit it, and count the approvals
        that hold now (``guard.approvals.tally``; the rule: the stricter of the proposal's and the
        policy's)."""
        rule = ApprovalRule.of(proposal.approval_rule).stricter(rule_of(decision))
        given = await off_loop(clean_reason, reason)
        approval = Approval(proposal.id, ctx.principal.name, ctx.party.kind.value, ctx.principal.role,
                            self.clock(), given, proposal.shown_digest or "",
                            approver_key=person_of(ctx.principal) or key_of(ctx.principal))
        if not await off_loop(self.store.add_approval, approval):
            await self.moves.lost(ctx, proposal, "the proposal was no longer pending, or this person's "
                                  "approval was already recorded; nothing was sent")
        fresh = await off_loop(self.store.get_proposal, proposal.id)
        counted = tally(rule, fresh.approvals if fresh else (approval,), proposal.shown_digest)
        row = self.moves.transition_row(proposal, "approval", actor=ctx.principal,
                                        correlation_id=ctx.correlation_id,
                                        reason=given or None, decision=decision.to_dict())
        await self.trail.record({**row, "approvals": counted.text, "approved_by": list(counted.by)})
        if not counted.complete and fresh is not None:
            self.moves.notify("approval", fresh)
        return counted

    def waiting(self, proposal_id: str, counted: Tally) -> dict[str, Any]:
        """The answer to an approval that is not yet the last: nothing ran; who approved, who is needed."""
        fresh = self.store.get_proposal(proposal_id)
        view = proposal_view(fresh, self.clock()) if fresh else {"proposal_id": proposal_id}
        return {**view, "state": "pending", "approvals_progress": counted.text,
                "approved_by": list(counted.by),
                "note": f"Recorded; {counted.text}. Nothing has changed in vSphere: the proposal runs when "
                        f"{counted.need - counted.have} more different approver(s) approve it."}
