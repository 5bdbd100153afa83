"""``Moves``: a proposal changes state only along the lifecycle table, by compare-and-set, each move one
audit row and then the listeners; a lost race is one ``claim_lost`` row; over SQLite and the audit file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.server_parts import AGENT, HUMAN, Parts, proposal_of

from gateway.errors import AuditUnavailable, ConfirmationInvalid
from gateway.guard.policy.model import Decision
from gateway.proposals import OPEN_STATES, Proposal
from gateway.server.base.moves import Moves


@pytest.fixture
def moves(parts: Parts) -> Iterator[Moves]:
    b = parts.backends
    yield Moves(b.store, parts.trail, parts.registry, parts.facts, instance=b.instance, reader=b.reader,
                sweep_leader=None, clock=parts.clock)


def test_a_move_is_one_row_then_the_listeners_see_the_proposal_after_it(parts: Parts) -> None:
    seen: list[tuple[str, str, int]] = []
    b = parts.backends
    moves = Moves(b.store, parts.trail, parts.registry, parts.facts, instance=b.instance, reader=b.reader,
                  sweep_leader=None, clock=parts.clock,
                  listeners=[lambda event, p: seen.append((event, p.state, len(parts.rows(phase=event))))])
    proposal = proposal_of(parts)
    after = moves.move_sync(proposal, OPEN_STATES, "cancelled", actor=HUMAN, reason="not today")
    assert after is not None and after.state == "cancelled"
    assert seen == [("cancelled", "cancelled", 1)], "the row is written before the listeners hear"
    (row,) = parts.rows(phase="cancelled")
    assert (row["proposal_id"], row["caller"], row["requested_by"], row["reason"]) == \
        (proposal.id, "alice", "agent-1", "not today")
    stored = b.store.get_proposal(proposal.id)
    assert stored is not None and stored.state == "cancelled"


def test_a_move_from_a_state_the_proposal_is_not_in_changes_nothing(parts: Parts, moves: Moves) -> None:
    proposal = proposal_of(parts)
    assert moves.move_sync(proposal, ["approved"], "executing", actor=AGENT) is None
    assert parts.rows() == []
    stored = parts.backends.store.get_proposal(proposal.id)
    assert stored is not None and stored.state == "pending"


def test_a_failing_listener_never_fails_the_move(parts: Parts, moves: Moves) -> None:
    moves.add_lifecycle_listener(lambda _event, _p: 1 / 0)
    heard: list[str] = []
    moves.add_lifecycle_listener(lambda event, _p: heard.append(event))
    assert moves.move_sync(proposal_of(parts), OPEN_STATES, "cancelled", actor=AGENT) is not None
    assert heard == ["cancelled"]


@pytest.mark.anyio
async def test_a_lost_race_is_one_claim_lost_row_then_refused(parts: Parts, moves: Moves) -> None:
    proposal = proposal_of(parts)
    with pytest.raises(ConfirmationInvalid):
        await moves.lost(parts.ctx(AGENT, "confirm_action"), proposal, "another caller moved it first")
    (row,) = parts.rows(phase="claim_lost")
    assert (row["proposal_id"], row["error_code"], row["reason"]) == \
        (proposal.id, "confirmation_invalid", "another caller moved it first")


@pytest.mark.anyio
async def test_a_claim_names_this_process_and_writes_the_intent(parts: Parts, moves: Moves) -> None:
    proposal = proposal_of(parts)
    heard: list[tuple[str, str]] = []
    moves.add_lifecycle_listener(lambda event, p: heard.append((event, p.state)))
    claimed = await moves.claim(parts.ctx(AGENT, "delete_vm"), proposal, Decision(True, "allowed", "rule-1"))
    assert (claimed.state, claimed.executor) == ("executing", parts.backends.instance.id)
    (row,) = parts.rows(phase="executing")
    assert (row["proposal_id"], row["executor"], row["decision"]["rule"]) == \
        (proposal.id, parts.backends.instance.id, "rule-1")
    assert heard == [("executing", "executing")]
    with pytest.raises(ConfirmationInvalid):  # a second claim loses: one claim_lost row
        await moves.claim(parts.ctx(HUMAN, "delete_vm"), proposal, Decision(True, "allowed", "rule-1"))
    assert len(parts.rows(phase="claim_lost")) == 1


@pytest.mark.anyio
async def test_a_claim_whose_intent_cannot_be_written_ends_failed(parts: Parts, moves: Moves) -> None:
    proposal = proposal_of(parts)
    parts.backends.audit.close()  # the audit takes no row from here on
    with pytest.raises(AuditUnavailable):
        await moves.claim(parts.ctx(AGENT, "delete_vm"), proposal, Decision(True, "allowed", None))
    stored = parts.backends.store.get_proposal(proposal.id)
    assert stored is not None and stored.state == "failed"
    # the refused intent and the failed move both wait for the audit
    assert [r["phase"] for r in parts.trail.waiting] == ["refused", "failed"]


def test_due_proposals_expire_once(parts: Parts, moves: Moves) -> None:
    due, later = proposal_of(parts, ttl=10), proposal_of(parts, ttl=1000)
    parts.clock.now += 11
    moves.expire_due()
    moves.expire_due()
    assert _state(parts, due) == "expired" and _state(parts, later) == "pending"
    assert [r["proposal_id"] for r in parts.rows(phase="expired")] == [due.id]


def test_revoking_a_token_cancels_its_open_proposals_then_audits_the_revocation(parts: Parts,
                                                                                moves: Moves) -> None:
    from gateway.auth.principal import Principal
    from gateway.auth.tokens import create_token

    _plain, record = create_token(parts.backends.store, "bot", "admin", expires_in=None, now=parts.clock())
    bot = Principal(name="bot", role="admin", token_id=record.token_id, surface="test")
    mine, other = proposal_of(parts, caller=bot), proposal_of(parts)
    assert moves.revoke_token("bot", by=HUMAN) == [mine.id]
    assert _state(parts, mine) == "cancelled" and _state(parts, other) == "pending"
    (row,) = parts.rows(phase="token_revoked")
    assert (row["token_name"], row["cancelled_proposals"]) == ("bot", [mine.id])


def test_a_claim_of_a_dead_process_settles_as_outcome_unknown(parts: Parts, moves: Moves) -> None:
    dead = proposal_of(parts)
    parts.backends.store.transition(dead.id, ["pending"], "executing", executor="gone-process-1")
    assert moves.settle_interrupted() == [dead.id]
    (row,) = parts.rows(phase="outcome_unknown")
    assert row["outcome"] == "outcome_unknown" and "gone-process-1" in row["reason"]


def _state(parts: Parts, proposal: Proposal) -> Any:
    stored = parts.backends.store.get_proposal(proposal.id)
    return stored.state if stored else None
