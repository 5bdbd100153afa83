"""What callers and humans do with an existing proposal: confirm, cancel, approve, deny.

Each is decided again on the state at that moment; a run is claimed exactly once (``Moves.claim``) and
handed to the execution (``server.call.execution``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gateway.answer import Answer
from gateway.auth.fair_share import queue_for
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import Ambiguous, ConfirmationInvalid, GatewayError, InvalidArgument, NotFound, Stale
from gateway.guard.decision import Entry, Proposed, Verdict, authorize
from gateway.proposals import OPEN_STATES, Proposal
from gateway.server.base.context import CallContext, ProgressSink, off_loop, truncate, unknown_tool
from gateway.server.base.facts import FactsNow
from gateway.server.base.moves import Moves
from gateway.server.call.execution import Execution, PlanFn
from gateway.server.call.gate import Gate
from gateway.server.proposals.approval_steps import ApprovalSteps
from gateway.server.proposals.views import check_not_stale, clean_reason, void_note, voided
from gateway.store.base import StateStore
from gateway.vocabulary import Plan


class ProposalActions:
    """Confirm, cancel, approve and deny a proposal: every step decided again, every step one audit row."""

    def __init__(self, targets: Mapping[str, Target], *, gate: Gate, facts: FactsNow, store: StateStore,
                 moves: Moves, execution: Execution, approvals: ApprovalSteps,
                 clock: Callable[[], float]) -> None:
        self.targets = targets
        self.gate = gate
        self.facts = facts
        self.registry = facts.registry
        self.store = store
        self.moves = moves
        self.execution = execution
        #: a human's approval between the proposal's re-planning and its claim (N of M, as shown)
        self.approvals = approvals
        self.clock = clock

    async def confirm(self, ctx: CallContext, proposal: Proposal, progress: ProgressSink | None) -> Answer:
        """``confirm_action`` with the proposal its token names: the caller's own confirmation."""
        return await self.execute_proposal(
            proposal, ctx.principal, progress=progress, correlation_id=ctx.correlation_id, client=ctx.client
        )

    async def cancel(self, ctx: CallContext, proposal: Proposal) -> dict[str, Any]:
        """``cancel_action`` with the proposal its token names: decided, then one move."""
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
            await self.moves.lost(ctx, proposal, "the proposal was no longer pending; nothing to cancel")
        return {"state": "cancelled", "proposal_id": proposal.id, "target": proposal.target}

    async def withdraw(self, ctx: CallContext, proposal: Proposal, reason: str) -> None:
        """Cancel ``proposal`` because the person at the client did not confirm it (one move, one row)."""
        moved = await self.moves.move(proposal, OPEN_STATES, "cancelled", actor=ctx.principal,
                                      correlation_id=ctx.correlation_id, decided_at=self.clock(),
                                      reason=reason)
        if moved is None:
            await self.moves.lost(ctx, proposal, "the proposal was no longer pending; nothing to cancel")

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
            await self.moves.lost(ctx, proposal, "another caller moved the proposal first; it was not denied")
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
                await self.moves.lost(ctx, proposal,
                                      "another caller moved the proposal first; nothing was sent")
            assert moved is not None
            proposal = moved
        claimed = await self.moves.claim(ctx, proposal, decision)
        return await self.execution.execute(ctx, target, plan, decision, proposal.args, progress,
                                            proposal=claimed)

    async def _replan(
        self,
        ctx: CallContext,
        target: Target,
        plan_fn: PlanFn,
        proposal: Proposal,
    ) -> Plan:
        """Resolve the proposal's objects again; anything that no longer matches makes it stale (the move
        is this attempt's row; an attempt that loses that move to another caller writes ``claim_lost``).
        Any other failure (the target unreachable, say) is this attempt's refused row; the proposal
        stays as it was."""
        try:
            plan = await self.execution.plan(target, plan_fn, proposal.args)
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
                await self.moves.lost(ctx, proposal, f"found stale ({truncate(exc.message, 256)}) after "
                                      "another caller had moved the proposal; nothing was sent")
            raise error from exc
        except GatewayError as exc:
            await self.gate.refused(ctx, {}, exc, proposal_id=proposal.id, target=target.name)
        return plan
