"""The proposals of one process, built in one place (``compose_proposals``): the flow and the actions."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.facts import FactsNow
from gateway.server.base.moves import Moves
from gateway.server.call.execution import Execution
from gateway.server.call.gate import Gate
from gateway.server.proposals.actions import ProposalActions
from gateway.server.proposals.approval_steps import ApprovalSteps
from gateway.server.proposals.elicitation import InBand
from gateway.server.proposals.flow import ProposalFlow
from gateway.settings import Settings
from gateway.store.base import StateStore


@dataclass(frozen=True)
class ProposalPath:
    """Where proposals are made (``flow``) and what is done with them (``actions``)."""

    flow: ProposalFlow
    actions: ProposalActions


def compose_proposals(settings: Settings, facts: FactsNow, *, gate: Gate, trail: AuditTrail, moves: Moves,
                      store: StateStore, execution: Execution) -> ProposalPath:
    """Build the proposal flow over ``facts.targets``, its actions first."""
    approvals = ApprovalSteps(moves=moves, store=store, trail=trail, clock=facts.clock)
    actions = ProposalActions(facts.targets, gate=gate, facts=facts, store=store, moves=moves,
                              execution=execution, approvals=approvals, clock=facts.clock)
    flow = ProposalFlow(gate=gate, store=store, trail=trail, moves=moves, actions=actions,
                        in_band=InBand(trail), confirm_ttl_seconds=settings.confirm_ttl_seconds,
                        clock=facts.clock)
    return ProposalPath(flow, actions)
