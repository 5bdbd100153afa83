"""The proposal flow: a change that waits for a confirmation or a human's approval.

Proposals are made here, and the proposal tools (list, confirm, cancel) answered; ``ProposalActions``
acts on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.answer import Answer
from gateway.config import Target
from gateway.errors import ConfirmationInvalid
from gateway.guard import confirm
from gateway.guard.decision import Proposed, proposal_rights
from gateway.guard.policy.model import Decision
from gateway.proposals import Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import (
    CallContext,
    Handler,
    ProgressSink,
    off_loop,
    redact_args,
)
from gateway.server.base.moves import Moves
from gateway.server.call.gate import Gate
from gateway.server.proposals.actions import ProposalActions
from gateway.server.proposals.elicitation import InBand
from gateway.server.proposals.views import (
    as_shown,
    pending_answer,
    proposal_view,
    proposer_keys,
    rule_of,
    shown_summary,
)
from gateway.store.base import StateStore
from gateway.vocabulary import Plan


class ProposalFlow:
    """Makes proposals and answers the proposal tools; what is done with one is ``ProposalActions``."""

    def __init__(self, *, gate: Gate, store: StateStore, trail: AuditTrail, moves: Moves,
                 actions: ProposalActions, in_band: InBand, confirm_ttl_seconds: float,
                 clock: Callable[[], float]) -> None:
        self.gate = gate
        self.store = store
        self.trail = trail
        self.moves = moves
        self.actions = actions
        #: who confirms a fresh proposal: the agent's token, or the person at the client (elicitation)
        self.in_band = in_band
        self.confirm_ttl_seconds = confirm_ttl_seconds
        self.clock = clock

    def handlers(self) -> dict[str, Handler]:
        """The proposal tools, answered here (``Calls.local``)."""
        return {"list_pending_actions": self._list_pending, "confirm_action": self._confirm,
                "cancel_action": self._cancel}

    async def propose(
        self,
        ctx: CallContext,
        target: Target,
        args: dict[str, Any],
        plan: Plan,
        decision: Decision,
        digest: str,
        progress: ProgressSink | None = None,
    ) -> dict[str, Any] | Answer:
        route = self.in_band.route(decision)
        refusal = self.in_band.refusal(route, decision)
        if refusal is not None:
            await self.gate.refused(ctx, args, refusal, target=target.name)
        token = confirm.new_confirmation_token()
        now = self.clock()
        ttl = target.proposal_ttl_seconds or self.confirm_ttl_seconds
        # redacted and bounded where it is made: the stored record, the answer, the audit row, the card and
        # every notification then carry the same clean text
        summary = shown_summary(plan)
        affected, blast, shown_as = as_shown(ctx.spec.name, digest, plan)
        rule = rule_of(decision)
        proposer = proposer_keys(ctx.principal)
        proposal = Proposal(
            id=confirm.new_proposal_id(),
            token_hash=confirm.token_hash(token),
            caller=ctx.principal.name,
            role=ctx.role.name,
            surface=ctx.principal.surface,
            target=target.name,
            target_host=target.address,
            tool=ctx.spec.name,
            args=args,
            args_digest=digest,
            plan_summary=summary,
            affected=affected,
            plan_params=dict(plan.params),
            created_at=now,
            expires_at=now + ttl,
            state="pending",
            require_web_approval=decision.require_approval,
            correlation_id=ctx.correlation_id,
            approval_rule=rule.to_dict() if decision.require_approval else None,
            blast_radius=blast,
            shown_digest=shown_as,
            caller_key=proposer[0],
            acting_for_key=proposer[1],
        )
        await self.trail.record(
            ctx.row(
                "proposed",
                target=target.name,
                args=redact_args(ctx.spec, args),
                decision=decision.to_dict(),
                proposal_id=proposal.id,
                affected=affected,
            )
        )
        await off_loop(self.store.add_proposal, proposal)
        self.moves.notify("proposed", proposal)
        answer = pending_answer(proposal, token, ttl, rule, decision)
        return await self.in_band.settle(self.actions, ctx, proposal, answer, route, decision.confirm_by,
                                         progress)

    async def _list_pending(
        self, ctx: CallContext, _a: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        def pending() -> list[dict[str, Any]]:
            """In one worker thread (the store, the redacting views, the row): one hop off the loop."""
            self.moves.expire_due()
            proposals = self.store.list_proposals(["pending"])
            seen = [p for p in proposals if proposal_rights(ctx.party, Proposed.of(p)).see]
            now = self.clock()
            rows = [proposal_view(p, now) for p in seen]
            self.trail.write_row(
                ctx.row("call", outcome="ok", count=len(rows), proposal_ids=[r["proposal_id"] for r in rows]))
            return rows

        rows = await off_loop(pending)
        return {"pending": rows, "count": len(rows)}

    async def _by_token(self, ctx: CallContext, args: dict[str, Any]) -> Proposal:
        proposal = await off_loop(self.store.proposal_by_token_hash, confirm.token_hash(args["token"]))
        if proposal is None:
            await self.gate.refused(
                ctx,
                {},
                ConfirmationInvalid(
                    "this confirmation token is unknown, already used, cancelled or denied; "
                    "make a fresh proposal"
                ),
            )
        assert proposal is not None
        return proposal

    async def _confirm(
        self, ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None
    ) -> Answer:
        return await self.actions.confirm(ctx, await self._by_token(ctx, args), progress)

    async def _cancel(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        return await self.actions.cancel(ctx, await self._by_token(ctx, args))
