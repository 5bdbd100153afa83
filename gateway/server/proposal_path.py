"""The proposals of one process, built in one place (``compose_proposals``).

The flow, the actions and the 2026-07-28 confirmation rounds."""

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
from gateway.server.proposals.request_state import Rounds
from gateway.settings import Settings
from gateway.store.base import StateStore
from gateway.store.request_states import RequestStates


@dataclass(frozen=True)
class ProposalPath:
    """Where proposals are made (``flow``), what is done with them (``actions``), and how the person at a
    2026-07-28 client confirms one (``rounds``: its sealed ``requestState``)."""

    flow: ProposalFlow
    actions: ProposalActions
    rounds: Rounds


def compose_proposals(settings: Settings, facts: FactsNow, *, gate: Gate, trail: AuditTrail, moves: Moves,
                      store: StateStore, execution: Execution, placeholder: str) -> ProposalPath:
    """Build the proposal flow over ``facts.targets``, its actions first; the rounds seal under
    ``settings.request_state_secret`` (``placeholder``: the store's SQL parameter mark)."""
    approvals = ApprovalSteps(moves=moves, store=store, trail=trail, clock=facts.clock)
    actions = ProposalActions(facts.targets, gate=gate, facts=facts, store=store, moves=moves,
                              execution=execution, approvals=approvals, clock=facts.clock)
    flow = ProposalFlow(gate=gate, store=store, trail=trail, moves=moves, actions=actions,
                        in_band=InBand(trail), confirm_ttl_seconds=settings.confirm_ttl_seconds,
                        clock=facts.clock)
    states = RequestStates(store, placeholder=placeholder)  # type: ignore[arg-type]
    rounds = Rounds(states, flow=flow, facts=facts, pepper=settings.request_state_secret)
    return ProposalPath(flow, actions, rounds)
