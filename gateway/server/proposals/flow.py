"""The proposal flow: a change that waits for its caller's confirmation or a human's approval. Propose,
list the pending, confirm, cancel, approve and deny; each re-decides on the state at that moment, claims
the proposal exactly once, and hands the claimed change to the call path to execute."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn

from gateway.answer import Answer
from gateway.auth.fair_share import queue_for
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import (
    Ambiguous,
    AuditUnavailable,
    ConfirmationInvalid,
    GatewayError,
    InvalidArgument,
    NotFound,
    Stale,
)
from gateway.guard import confirm
from gateway.guard.decision import Entry, Proposed, Verdict, authorize, proposal_rights
from gateway.guard.policy.model import Decision
from gateway.proposals import OPEN_STATES, Proposal
from gateway.server.base.context import (
    CallContext,
    Handler,
    ProgressSink,
    off_loop,
    redact_args,
    truncate,
    unknown_tool,
)
from gateway.server.base.moves import Moves
from gateway.server.call.writes import Writes
from gateway.server.proposals.approval_steps import ApprovalSteps
from gateway.server.proposals.elicitation import InBand
from gateway.server.proposals.views import (
    as_shown,
    check_not_stale,
    clean_reason,
    pending_answer,
    proposal_view,
    proposer_keys,
    rule_of,
    shown_summary,
    void_note,
    voided,
)
from gateway.vocabulary import Plan


class ProposalFlow:
    """Proposals from their making to their claim: every step decided again, every step one audit row."""

    def __init__(self, targets: Mapping[str, Target], *, writes: Writes, moves: Moves,
                 confirm_ttl_seconds: float) -> None:
        self.targets = targets
        self.gate = writes.gate
        self.writes = writes
        self.facts = writes.facts
        self.registry = writes.facts.registry
        self.store = writes.facts.store
        self.trail = writes.trail
        self.scheduler = writes.scheduler
        self.moves = moves
        self.confirm_ttl_seconds = confirm_ttl_seconds
        self.clock = moves.clock
        #: who confirms a fresh proposal: the agent's token, or the person at the client (elicitation)
        self.in_band = InBand(self.trail)
        #: a human's approval between the proposal's re-planning and its claim (N of M, as shown)
        self.approvals = ApprovalSteps(moves=moves, store=self.store, trail=self.trail, lost=self._lost)

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
        return await self.in_band.settle(self, ctx, proposal, answer, route, decision.confirm_by, progress)

    async def withdraw(self, ctx: CallContext, proposal: Proposal, reason: str) -> None:
        """Cancel ``proposal`` because the person at the client did not confirm it (one move, one row)."""
        moved = await self.moves.move(proposal, OPEN_STATES, "cancelled", actor=ctx.principal,
                                      correlation_id=ctx.correlation_id, decided_at=self.clock(),
                                      reason=reason)
        if moved is None:
            await self._lost(ctx, proposal, "the proposal was no longer pending; nothing to cancel")

    async def _list_pending(
        self, ctx: CallContext, _a: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        await off_loop(self.moves.expire_due)
        proposals = await off_loop(self.store.list_proposals, ["pending"])
        seen = [p for p in proposals if proposal_rights(ctx.party, Proposed.of(p)).see]
        now = self.clock()  # the views are redacted (regexes): in a worker thread, never on the loop
        rows = await off_loop(lambda: [proposal_view(p, now) for p in seen])
        await self.trail.record(
            ctx.row("call", outcome="ok", count=len(rows), proposal_ids=[r["proposal_id"] for r in rows])
        )
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
        proposal = await self._by_token(ctx, args)
        return await self.execute_proposal(
            proposal, ctx.principal, progress=progress, correlation_id=ctx.correlation_id, client=ctx.client
        )

    async def _cancel(
        self, ctx: CallContext, args: dict[str, Any], _p: ProgressSink | None
    ) -> dict[str, Any]:
        proposal = await self._by_token(ctx, args)
        spec = self.registry.get(proposal.tool) or ctx.spec
        owner = await off_loop(self.facts.owner, proposal)
        facts = self.facts.of_proposal(Entry.CANCEL, ctx.party, spec, proposal, owner)
        facts = replace(
            facts, proposal_problem=None if proposal.state in OPEN_STATES else facts.proposal_problem
        )
        await self.gate.check(ctx, facts, {}, proposal_id=proposal.id, via=ctx.spec.name)
        moved = await self.moves.move(
            proposal,
            OPEN_STATES,
            "cancelled",
            actor=ctx.principal,
            correlation_id=ctx.correlation_id,
            decided_at=self.clock(),
            reason="cancelled by its caller",
        )
        if moved is None:
            await self._lost(ctx, proposal, "the proposal was no longer pending; nothing to cancel")
        return {"state": "cancelled", "proposal_id": proposal.id, "target": proposal.target}

    async def approve(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None,
        reason: str = "",
    ) -> Answer:
        """A human's approval (web page or CLI): the whole decision again, then the approval is recorded;
        the proposal runs when it is the last one its rule needs (N of M), its vSphere calls queued as the
        human, like a tool call's (``Calls.answer``)."""
        proposal = await off_loop(self.store.get_proposal, proposal_id)
        if proposal is None:
            raise NotFound(f"no proposal {proposal_id} that you may see")
        role = (await off_loop(self.facts.party, human)).role
        with queue_for(human, role):
            return await self.execute_proposal(proposal, human, correlation_id=correlation_id, approved=True,
                                               reason=reason)

    def decision_rights(self, proposal: Proposal, human: Principal) -> tuple[Verdict, Verdict]:
        """What ``human`` may do with ``proposal`` now, as the decision says before anything is read
        from vSphere: the verdicts of a deny and of an approval (``Entry.DENY``, ``Entry.APPROVE``).
        For a page that offers the buttons; ``approve``/``deny`` decide again when clicked. Synchronous."""
        spec = self.registry.get(proposal.tool) or unknown_tool(proposal.tool)
        actor, owner = self.facts.party(human), self.facts.owner(proposal)
        deny, approve = (
            authorize(self.facts.of_proposal(entry, actor, spec, proposal, owner))
            for entry in (Entry.DENY, Entry.APPROVE)
        )
        return deny, approve

    async def deny(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None,
        reason: str = "",
    ) -> dict[str, Any]:
        """A human's denial (web page or CLI): the decision's verdict on ``Entry.DENY``, enforced and
        audited by the gate like every other entry point; then the move. Every attempt is one row: the
        refusal, the ``denied`` move, or ``claim_lost`` when another caller moved the proposal first."""
        proposal = await off_loop(self.store.get_proposal, proposal_id)
        if proposal is None:
            raise NotFound(f"no proposal {proposal_id} that you may see")
        spec = self.registry.get(proposal.tool) or unknown_tool(proposal.tool)
        party = await off_loop(self.facts.party, human)
        human = replace(human, kind=party.kind)
        ctx = CallContext(human, party, spec, correlation_id, via="deny")
        owner = await off_loop(self.facts.owner, proposal)
        facts = await off_loop(self.facts.facts, Entry.DENY, party, spec, proposal.args,
                               target=proposal.target, owner=owner, proposal=proposal)
        facts = replace(facts, proposed=Proposed.of(proposal), reason=reason)
        await self.gate.check(ctx, facts, {}, proposal_id=proposal.id, requested_by=proposal.caller)
        given = await off_loop(clean_reason, reason)
        why = f"denied by {human.name}" + (f": {given}" if given else "")
        moved = await off_loop(
            self.moves.move_sync,
            proposal,
            ["pending"],
            "denied",
            actor=human,
            correlation_id=correlation_id,
            approved_by=human.name,
            decided_at=self.clock(),
            reason=why,
            result={"by": human.name, "reason": given},
            decision={"allowed": False, "reason": why, "rule": "human"},
        )
        if moved is None:
            await self._lost(ctx, proposal, "another caller moved the proposal first; it was not denied")
        return {"state": "denied", "proposal_id": proposal.id, "target": proposal.target}

    async def execute_proposal(
        self,
        proposal: Proposal,
        actor: Principal,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        approved: bool = False,
        client: str | None = None,
        reason: str = "",
    ) -> Answer:
        """Re-authorize against the state now, claim the proposal exactly once, then execute it. An
        approval re-reads the proposal's objects and facts (a difference makes it stale, every approval
        void), is recorded, and runs the change only when it is the last one the rule needs."""
        spec = self.registry.get(proposal.tool)
        target = self.targets.get(proposal.target)
        party = await off_loop(self.facts.party, actor)
        actor = replace(actor, kind=party.kind)
        ctx = CallContext(
            actor,
            party,
            spec or unknown_tool(proposal.tool),
            correlation_id or proposal.correlation_id,
            client,
            via="approve" if approved else "confirm_action",
        )
        if spec is None or target is None or spec.plan is None:
            await self.gate.refused(
                ctx,
                {},
                ConfirmationInvalid(
                    f"proposal {proposal.id} names a tool or target this server no longer has"
                ),
                proposal_id=proposal.id,
                target=proposal.target,
            )
        assert spec is not None and target is not None and spec.plan is not None
        entry = Entry.APPROVE if approved else Entry.CONFIRM
        owner = await off_loop(self.facts.owner, proposal)
        gate = self.facts.of_proposal(entry, party, spec, proposal, owner)
        if approved:
            gate = replace(gate, reason=reason)
        await self.gate.check(ctx, gate, {}, proposal_id=proposal.id)
        await self.gate.refuse_unless_audit_writable(ctx, {}, proposal_id=proposal.id, target=target.name)
        plan = await self._replan(ctx, target, spec.plan, proposal)
        if approved:
            await self.approvals.check_as_shown(ctx, proposal, plan)
        verdict = await self.gate.authorize_plan(
            ctx, entry, party, proposal.args, target, plan, owner, proposal
        )
        decision = self.gate.decision_of(verdict, target)
        if approved:
            counted = await self.approvals.record(ctx, proposal, decision, reason)
            if not counted.complete:
                return Answer.cleaned(await off_loop(self.approvals.waiting, proposal.id, counted))
            moved = await self.moves.move(
                proposal,
                ["pending"],
                "approved",
                actor=actor,
                correlation_id=ctx.correlation_id,
                approved_by=", ".join(counted.by),
                decided_at=self.clock(),
                reason=f"{counted.text}, by {', '.join(counted.by)}",
            )
            if moved is None:
                await self._lost(ctx, proposal, "another caller moved the proposal first; nothing was sent")
            assert moved is not None
            proposal = moved
        claimed = await self.claim(ctx, proposal, decision)
        return await self.writes.execute(ctx, target, plan, decision, proposal.args, progress,
                                         proposal=claimed)

    async def claim(self, ctx: CallContext, proposal: Proposal, decision: Decision) -> Proposal:
        """Claim the proposal for this process (``executing``) by the store's compare-and-set, THEN write
        the claim's row, the intent, durably before anything reaches vSphere. Of racing confirms only
        the winner writes ``executing``; each loser writes one ``claim_lost`` row and is refused. If
        the intent cannot be written the change is refused and the claimed proposal ends ``failed``
        (nothing was sent to vSphere), its row waiting for the audit like any outcome."""
        instance = await asyncio.to_thread(self.moves.instance.acquire)
        fields: dict[str, Any] = {"decided_at": self.clock(), "executor": instance}
        row = self.moves.transition_row(
            proposal,
            "executing",
            actor=ctx.principal,
            correlation_id=ctx.correlation_id,
            executor=instance,
            args=redact_args(ctx.spec, proposal.args),
            decision=decision.to_dict(),
        )
        if not await off_loop(self.store.transition, proposal.id, ["pending", "approved"], "executing",
                                   **fields):
            await self._lost(ctx, proposal, "another caller moved the proposal first; nothing was sent",
                             executor=instance, args=row.get("args"), decision=row.get("decision"))
        claimed = replace(proposal, state="executing", **fields)
        try:
            await self.trail.intent(row)
        except AuditUnavailable as exc:
            await self.moves.move(
                claimed,
                ["executing"],
                "failed",
                actor=ctx.principal,
                correlation_id=ctx.correlation_id,
                outcome=exc.code,
                error=exc.to_wire(),
                reason="the intent row could not be written; nothing was sent to vSphere",
            )
            raise
        self.moves.notify("executing", claimed)
        return claimed

    async def _lost(self, ctx: CallContext, proposal: Proposal, reason: str, **fields: Any) -> NoReturn:
        """The one row of an attempt that lost a race for ``proposal`` (``claim_lost``), then its refusal."""
        error = ConfirmationInvalid(f"proposal {proposal.id} was already confirmed, cancelled or expired")
        row = self.moves.transition_row(proposal, "claim_lost", actor=ctx.principal,
                                   correlation_id=ctx.correlation_id, reason=reason, **fields)
        await self.trail.record({**row, "error_code": error.code})
        raise error

    async def _replan(
        self,
        ctx: CallContext,
        target: Target,
        plan_fn: Callable[[Any, Mapping[str, Any]], Plan],
        proposal: Proposal,
    ) -> Plan:
        """Resolve the proposal's objects again; anything that no longer matches makes it stale (the move
        is this attempt's row; an attempt that loses that move to another caller writes ``claim_lost``).
        Any other failure (the target unreachable, say) is this attempt's refused row; the proposal
        stays as it was."""
        try:
            plan = await self.scheduler.run(
                target.name, lambda s: plan_fn(s, proposal.args), deadline=target.timeout_seconds
            )
            check_not_stale(proposal, plan)
        except (NotFound, Ambiguous, Stale, InvalidArgument) as exc:
            error = Stale(
                f"proposal {proposal.id} no longer matches vSphere ({exc.message}); {void_note(proposal)}"
                "make a fresh proposal and check it again",
                proposal_id=proposal.id,
            )
            moved = await self.moves.move(
                proposal,
                OPEN_STATES,
                "stale",
                actor=ctx.principal,
                correlation_id=ctx.correlation_id,
                outcome="stale",
                error=error.to_wire(),
                decided_at=self.clock(),
                reason=truncate(f"{exc.message}; approvals void: {voided(proposal)}", 512),
            )
            if moved is None:
                await self._lost(ctx, proposal, f"found stale ({truncate(exc.message, 256)}) after another "
                                 "caller had moved the proposal; nothing was sent")
            raise error from exc
        except GatewayError as exc:
            await self.gate.refused(ctx, {}, exc, proposal_id=proposal.id, target=target.name)
        return plan
