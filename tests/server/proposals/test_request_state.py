"""The sealed ``requestState`` of a 2026-07-28 confirmation round (``server.proposals.request_state``):
AES-256-GCM under a key every replica derives from the store's secret; a changed, foreign-keyed or
malformed state refused as ``request_state_invalid``; another caller's, another call's and an expired
one refused with their own reason codes; the token it may carry never readable on the wire.
An operator's secret (the pepper) mixed into the key: a state sealed under another (or none) is refused
and audited as changed, and the secret is written nowhere. (End to end, with the SDK's client and the
simulator: tests/server/edge/test_mcp_elicitation_2026.py.)"""

from __future__ import annotations

import base64
import logging
from dataclasses import replace
from pathlib import Path

import pytest
from support.server_parts import AGENT, Parts, StandInExecution, plan_of, proposal_of, proposal_parts

from gateway.answer import Answer
from gateway.errors import ConfirmationExpired, ConfirmationInvalid, GatewayError
from gateway.proposals import Proposal
from gateway.server.proposals.elicitation import Ask
from gateway.server.proposals.request_state import (
    PREFIX,
    Rounds,
    RoundState,
    Sealer,
    check_state,
    pending_again,
    wire_digest,
)
from gateway.store.request_states import RequestStates

SECRET = bytes(range(32))
#: operators' secrets (GATEWAY_REQUEST_STATE_SECRET): text, as the setting reads them
PEPPER = b"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
OTHER_PEPPER = b"60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"
ARGS = {"target": "vc1", "vm": "web1", "force_power_off": True}
STATE = RoundState(id="a" * 32, caller="token::t1", proposal_id="p1", tool="delete_vm",
                   args_digest=wire_digest("delete_vm", ARGS), mode="form", expires_at=200.0,
                   confirm_by="either", token="gwc_secret-token-value")


def _reason(exc: pytest.ExceptionInfo[GatewayError]) -> str:
    return str(exc.value.details["reason_code"])


def test_a_sealed_state_opens_to_what_was_sealed() -> None:
    sealer = Sealer(SECRET)
    wire = sealer.seal(STATE)
    assert wire.startswith(PREFIX)
    assert sealer.open(wire) == STATE


def test_another_replica_deriving_from_the_same_secret_opens_it() -> None:
    assert Sealer(SECRET).open(Sealer(SECRET).seal(STATE)) == STATE


def test_the_state_hides_what_it_carries() -> None:
    wire = Sealer(SECRET).seal(STATE)
    raw = base64.urlsafe_b64decode(wire[len(PREFIX):] + "==")
    for secret in (b"gwc_secret-token-value", b"token::t1", b"delete_vm", b"p1\""):
        assert secret not in raw and secret.decode() not in wire


def test_two_seals_of_one_state_differ() -> None:  # a fresh nonce each
    sealer = Sealer(SECRET)
    assert sealer.seal(STATE) != sealer.seal(STATE)


@pytest.mark.parametrize("at", [len(PREFIX), len(PREFIX) + 6, len(PREFIX) + 20, -3, -1])
def test_a_changed_state_is_refused(at: int) -> None:
    sealer = Sealer(SECRET)
    wire = sealer.seal(STATE)
    position = at % len(wire)
    flipped = "B" if wire[position] != "B" else "C"
    changed = wire[:position] + flipped + wire[position + 1:]
    with pytest.raises(ConfirmationInvalid) as refused:
        sealer.open(changed)
    assert _reason(refused) == "request_state_invalid"


@pytest.mark.parametrize("wire", ["", "gw1.", "v1.abc", "gw1.!!!", "gw1." + "A" * 40, None, 7,
                                  "gw1." + "A" * 20000])
def test_a_malformed_state_is_refused(wire: object) -> None:
    with pytest.raises(ConfirmationInvalid) as refused:
        Sealer(SECRET).open(wire)
    assert _reason(refused) == "request_state_invalid"


def test_a_state_sealed_under_another_key_is_refused() -> None:
    with pytest.raises(ConfirmationInvalid) as refused:
        Sealer(bytes(32) + b"x").open(Sealer(SECRET).seal(STATE))
    assert _reason(refused) == "request_state_invalid"


def test_an_operators_pepper_changes_the_key() -> None:
    peppered = Sealer(SECRET, pepper=PEPPER)
    assert peppered.open(peppered.seal(STATE)) == STATE
    for other in (Sealer(SECRET), Sealer(SECRET, pepper=OTHER_PEPPER)):
        with pytest.raises(ConfirmationInvalid) as refused:
            other.open(peppered.seal(STATE))
        assert _reason(refused) == "request_state_invalid"  # as a changed state is
    with pytest.raises(ConfirmationInvalid):
        peppered.open(Sealer(SECRET).seal(STATE))


def test_a_short_pepper_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Sealer(SECRET, pepper=b"operator secret")


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Sealer(b"short")


def test_the_state_binds_the_caller_the_call_and_the_expiry() -> None:
    check_state(STATE, caller="token::t1", tool="delete_vm", args_digest=wire_digest("delete_vm", ARGS),
                now=199.0)
    cases = [
        ({"caller": "token::t2"}, "request_state_not_yours"),
        ({"tool": "power_off_vm"}, "request_state_mismatch"),
        ({"args_digest": wire_digest("delete_vm", {**ARGS, "vm": "web2"})}, "request_state_mismatch"),
    ]
    for change, reason in cases:
        given = {"caller": "token::t1", "tool": "delete_vm", "args_digest": STATE.args_digest, **change}
        with pytest.raises(ConfirmationInvalid) as refused:
            check_state(STATE, now=100.0, **given)
        assert _reason(refused) == reason
    with pytest.raises(ConfirmationExpired) as expired:
        check_state(STATE, caller="token::t1", tool="delete_vm", args_digest=STATE.args_digest, now=200.0)
    assert _reason(expired) == "request_state_expired"  # it expires with its proposal


def test_the_wire_digest_is_of_the_call_as_sent() -> None:
    assert wire_digest("delete_vm", ARGS) == wire_digest("delete_vm", dict(reversed(list(ARGS.items()))))
    assert wire_digest("delete_vm", ARGS) != wire_digest("delete_vm", {**ARGS, "force_power_off": False})
    assert wire_digest("delete_vm", None) == wire_digest("delete_vm", {})
    assert wire_digest("delete_vm", {"vm": "\ud800"})  # a lone surrogate is escaped, never an error


def _proposal(**fields: object) -> Proposal:
    base: dict[str, object] = dict(
        id="p1", token_hash="th", caller="alice", role="admin", surface="https", target="vc1",
        target_host="vc1.example", tool="delete_vm", args=ARGS, args_digest="d",
        plan_summary="delete web1", affected=[], plan_params={}, created_at=1.0, expires_at=100.0)
    base.update(fields)
    return Proposal(**base)  # type: ignore[arg-type]


def test_the_answer_again_carries_the_token_only_where_the_round_kept_it() -> None:
    kept = pending_again(_proposal(), STATE, now=40.0)
    assert kept["token"] == STATE.token and kept["expires_in_seconds"] == 60
    assert (kept["state"], kept["proposal_id"], kept["target_host"]) == ("pending", "p1", "vc1.example")
    dropped = pending_again(_proposal(), replace(STATE, token=None), now=40.0)
    assert "token" not in dropped and "confirm_with" not in dropped
    gated = pending_again(_proposal(require_web_approval=True, approval_rule={"required": 2}), STATE, 40.0)
    assert gated["requires_human_approval"] is True and gated["approvals_required"] == 2


# ---------------------------------------------------------------------- the rounds under an operator's secret

ACCEPT = {"confirm": {"action": "accept", "content": {}}}


def _rounds(parts: Parts, execution: StandInExecution, pepper: bytes | None) -> Rounds:
    """The rounds as ``rounds_of`` builds them, over the real store and audit of ``parts`` (a second
    call with the same parts is another replica on the same database)."""
    flow = proposal_parts(parts, execution).flow
    states = RequestStates(parts.backends.store, placeholder=parts.backends.engine.placeholder)
    return Rounds(states, flow=flow, facts=parts.facts, pepper=pepper, clock=parts.clock)


async def _first_round(parts: Parts, rounds: Rounds) -> tuple[dict[str, str], str]:
    """A delete's question for its person, sealed by ``rounds``: the call's arguments and the state."""
    proposal = proposal_of(parts)
    asked = Ask(proposal, "form", "Confirm?", {"type": "object"}, confirm_by="elicitation")
    return proposal.args, await rounds.seal(AGENT, "delete_vm", proposal.args, asked)


async def _retry(rounds: Rounds, args: dict[str, str], state: str) -> dict[str, object] | Answer:
    return await rounds.answer(AGENT, "delete_vm", args, state, ACCEPT, correlation_id="corr-2", client=None)


def _state_refusals(parts: Parts) -> list[tuple[str, str]]:
    return [(r["error_code"], r["reason_code"]) for r in parts.rows(phase="denied")
            if str(r.get("reason_code", "")).startswith("request_state")]


@pytest.mark.anyio
async def test_a_state_sealed_under_another_operators_secret_is_refused_and_audited(parts: Parts) -> None:
    execution = StandInExecution(plan_of("web-1"))
    args, state = await _first_round(parts, _rounds(parts, execution, PEPPER))
    for other in (OTHER_PEPPER, None):  # a replica set with another secret, or none
        with pytest.raises(ConfirmationInvalid) as refused:
            await _retry(_rounds(parts, execution, other), args, state)
        assert _reason(refused) == "request_state_invalid"
    assert execution.ran == []
    assert _state_refusals(parts) == [("confirmation_invalid", "request_state_invalid")] * 2
    done = await _retry(_rounds(parts, execution, PEPPER), args, state)  # a replica with the same secret
    assert isinstance(done, Answer) and done.value == {"state": "done"}
    assert len(execution.ran) == 1 and len(parts.rows(phase="elicited")) == 1


@pytest.mark.anyio
async def test_without_an_operators_secret_the_store_secret_alone_seals(parts: Parts) -> None:
    execution = StandInExecution(plan_of("web-1"))
    args, state = await _first_round(parts, _rounds(parts, execution, None))
    with pytest.raises(ConfirmationInvalid):  # a replica given a secret the others lack refuses it
        await _retry(_rounds(parts, execution, PEPPER), args, state)
    done = await _retry(_rounds(parts, execution, None), args, state)
    assert isinstance(done, Answer) and done.value == {"state": "done"} and len(execution.ran) == 1
    assert _state_refusals(parts) == [("confirmation_invalid", "request_state_invalid")]


@pytest.mark.anyio
async def test_the_operators_secret_is_written_nowhere(parts: Parts,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    execution = StandInExecution(plan_of("web-1"))
    with caplog.at_level(logging.DEBUG):
        args, state = await _first_round(parts, _rounds(parts, execution, PEPPER))
        with pytest.raises(ConfirmationInvalid) as refused:
            await _retry(_rounds(parts, execution, OTHER_PEPPER), args, state)
        await _retry(_rounds(parts, execution, PEPPER), args, state)
    written = b"".join(path.read_bytes() for path in Path(parts.tmp).rglob("*") if path.is_file())
    assert b"request_state_secrets" in written  # the store's own secret is there, as designed
    for pepper in (PEPPER, OTHER_PEPPER):
        for form in (pepper, pepper.hex().encode(), base64.b64encode(pepper), pepper[:16]):
            assert form not in written  # the state store, its WAL and the audit log
            assert form.decode() not in caplog.text and form.decode() not in state
            assert form.decode() not in str(refused.value.to_wire())


@pytest.mark.anyio
async def test_the_runtime_seals_under_the_secret_its_settings_hold(parts: Parts) -> None:
    """``compose_proposals`` (the runtime's wiring) mixes in ``Settings.request_state_secret``, and the
    edge takes the runtime's rounds (``rounds_of``)."""
    from types import SimpleNamespace

    from gateway.server.edge.mcp import rounds_of
    from gateway.server.proposal_path import compose_proposals

    execution = StandInExecution(plan_of("web-1"))
    made = proposal_parts(parts, execution)
    settings = replace(parts.settings, request_state_secret=PEPPER)
    path = compose_proposals(settings, parts.facts, gate=made.gate, trail=parts.trail, moves=made.moves,
                             store=parts.backends.store, execution=execution,  # type: ignore[arg-type]
                             placeholder=parts.backends.engine.placeholder)
    assert rounds_of(SimpleNamespace(rounds=path.rounds)) is path.rounds
    assert rounds_of(SimpleNamespace()) is None  # a gateway without rounds: confirmed with the token
    args, state = await _first_round(parts, path.rounds)
    with pytest.raises(ConfirmationInvalid):  # the store's secret alone does not open it
        await _retry(_rounds(parts, execution, None), args, state)
    done = await _retry(_rounds(parts, execution, PEPPER), args, state)
    assert isinstance(done, Answer) and len(execution.ran) == 1
