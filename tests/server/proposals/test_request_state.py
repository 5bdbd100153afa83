"""The sealed ``requestState`` of a 2026-07-28 confirmation round (``server.proposals.request_state``):
AES-256-GCM under a key every replica derives from the store's secret; a changed, foreign-keyed or
malformed state refused as ``request_state_invalid``; another caller's, another call's and an expired
one refused with their own reason codes; the token it may carry never readable on the wire.
(End to end, with the SDK's client and the simulator: tests/server/edge/test_mcp_elicitation_2026.py.)"""

from __future__ import annotations

import base64
from dataclasses import replace

import pytest

from gateway.errors import ConfirmationExpired, ConfirmationInvalid, GatewayError
from gateway.proposals import Proposal
from gateway.server.proposals.request_state import (
    PREFIX,
    RoundState,
    Sealer,
    check_state,
    pending_again,
    wire_digest,
)

SECRET = bytes(range(32))
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
    peppered = Sealer(SECRET, pepper=b"operator secret")
    assert peppered.open(peppered.seal(STATE)) == STATE
    with pytest.raises(ConfirmationInvalid):
        Sealer(SECRET).open(peppered.seal(STATE))


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
