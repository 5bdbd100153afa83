"""``compose_proposals``: the flow and its actions share the gate, the moves and the one execution they
are handed."""

from __future__ import annotations

from support.server_parts import Parts, StandInExecution, plan_of

from gateway.guard.limits import RateLimiter
from gateway.server.base.moves import Moves
from gateway.server.call.busy_audit import BusyAudit
from gateway.server.call.gate import Gate
from gateway.server.proposal_path import compose_proposals


def test_the_flow_and_its_actions_share_what_they_are_handed(parts: Parts) -> None:
    b = parts.backends
    gate = Gate(facts=parts.facts, trail=parts.trail, busy=BusyAudit(parts.trail), rate_limiter=RateLimiter(),
                dry_run=False)
    moves = Moves(b.store, parts.trail, parts.registry, parts.facts, instance=b.instance, reader=b.reader,
                  sweep_leader=None, clock=parts.clock)
    execution = StandInExecution(plan_of("web-1"))
    path = compose_proposals(parts.settings, parts.facts, gate=gate, trail=parts.trail, moves=moves,
                             store=b.store, execution=execution,  # type: ignore[arg-type]
                             placeholder=b.engine.placeholder)
    assert path.flow.actions is path.actions and path.actions.execution is execution
    assert path.flow.gate is path.actions.gate is gate and path.flow.moves is path.actions.moves is moves
    assert path.actions.approvals.moves is moves
    assert path.flow.confirm_ttl_seconds == parts.settings.confirm_ttl_seconds
    assert path.rounds.flow is path.flow  # the 2026-07-28 rounds confirm through the same flow
