"""``compose_call_path``: every part is built once, after the parts it is handed, and handed them then:
one execution for plain writes and claimed proposals, the proposal flow as the writes' proposer, the
listeners given told of every move."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.server_parts import AGENT, Parts, proposal_of

from gateway.proposals import OPEN_STATES, Proposal
from gateway.server.base.metrics import Metrics
from gateway.server.call_path import CallPath, compose_call_path
from gateway.vsphere.scheduler import Scheduler


@pytest.fixture
def composed(parts: Parts) -> Iterator[tuple[CallPath, list[tuple[str, Proposal]]]]:
    heard: list[tuple[str, Proposal]] = []
    scheduler = Scheduler(list(parts.targets.values()), {}, queue_timeout=5.0)
    path = compose_call_path(parts.settings, parts.facts, scheduler=scheduler, backends=parts.backends,
                             metrics=Metrics(targets=parts.targets), trail=parts.trail,
                             listeners=[lambda event, p: heard.append((event, p))])
    try:
        yield path, heard
    finally:
        path.reading.mirrors.close()
        scheduler.close()


def test_one_execution_runs_writes_and_claimed_proposals(composed: tuple[CallPath, list[object]]) -> None:
    path, _heard = composed
    assert path.writes.execution is path.proposing.actions.execution


def test_a_change_that_needs_a_person_goes_to_the_proposal_flow(
        composed: tuple[CallPath, list[object]]) -> None:
    path, _heard = composed
    assert path.writes.proposer is path.proposing.flow
    assert path.proposing.flow.actions is path.proposing.actions


def test_every_part_shares_the_one_gate_trail_and_moves(composed: tuple[CallPath, list[object]]) -> None:
    path, _heard = composed
    assert path.calls.gate is path.writes.gate is path.reading.reads.gate is path.proposing.actions.gate
    assert path.gate.busy is path.busy and path.gate.trail is path.trail
    assert path.proposing.flow.moves is path.proposing.actions.moves is path.moves


def test_the_calls_route_reads_writes_and_the_tools_the_gateway_answers(
        composed: tuple[CallPath, list[object]]) -> None:
    path, _heard = composed
    assert path.calls.read == path.reading.reads.read and path.calls.write == path.writes.write
    assert set(path.calls.local) == \
        {"list_targets", "list_pending_actions", "confirm_action", "cancel_action"}


def test_the_listeners_given_hear_every_move(parts: Parts,
                                            composed: tuple[CallPath, list[tuple[str, Proposal]]]) -> None:
    path, heard = composed
    proposal = proposal_of(parts, caller=AGENT)
    path.moves.move_sync(proposal, OPEN_STATES, "cancelled", actor=AGENT)
    assert [(event, p.id) for event, p in heard] == [("cancelled", proposal.id)]
