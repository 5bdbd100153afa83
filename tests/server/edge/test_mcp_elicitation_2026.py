"""Confirmation by the person at the client on the 2026-07-28 revision (multi-round-trip), end to end: the
SDK's own client in its default mode (it opens with ``server/discover``) against the real HTTPS server
and the simulator, checked with pyVmomi. A delete on a ``confirm_by: elicitation`` target answers
``input_required``; the client asks its elicitation callback and retries with the answer and the sealed
``requestState``: accepted, the VM is deleted once, declined, nothing. A changed, replayed, another
caller's or another call's state is refused and audited; any replica opens and spends a state; a client
pinned to the old handshake is still asked on its stream by the same server."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from support.answers import answer_of
from support.elicitation import Person, asking, confirm_rules, delete_args, rows_of, served_with
from support.httpserver import Served, audit_rows, build_gateway, serve
from support.simulator import MakeSimulator, Simulator, vm_exists

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
ACCEPT: dict[str, types.InputResponse] = {"confirm": types.ElicitResult(action="accept", content={})}


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator()


def _refusals(served: Served) -> list[tuple[str, str, str]]:
    return [(r["caller"], r["error_code"], r["reason_code"]) for r in rows_of(served, "denied")
            if str(r.get("reason_code", "")).startswith("request_state")]


async def _first_round(client: Client, args: dict[str, Any]) -> types.InputRequiredResult:
    """The first round of a delete, driven by hand: the question and the sealed state."""
    first = await client.session.call_tool("delete_vm", args, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    assert first.request_state is not None
    return first


async def _retry(client: Client, args: dict[str, Any], state: str,
                 responses: dict[str, types.InputResponse] | None = None) -> dict[str, Any]:
    again = await client.session.call_tool("delete_vm", args, input_responses=responses or ACCEPT,
                                           request_state=state, allow_input_required=True)
    assert isinstance(again, types.CallToolResult), again
    return answer_of(again)


def _changed(state: str) -> str:
    at = len(state) // 2
    return state[:at] + ("A" if state[at] != "A" else "B") + state[at + 1:]


async def test_the_person_confirms_a_delete_in_a_round(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    person = Person("accept")
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, person) as client:
            result = await client.call_tool("delete_vm", args)
            assert client.protocol_version == MODERN
        answer = answer_of(result)
        assert not result.is_error, answer
        assert answer["state"] == "executed" and answer["deleted_vm"] == vm
        (asked,) = person.asked
        assert isinstance(asked, types.ElicitRequestFormParams)
        assert "'vc1'" in asked.message and sim.host in asked.message and vm in asked.message
        assert "Blast radius:" in asked.message and "disks" in asked.message
        assert "token" not in json.dumps(answer)
        (proposed,) = rows_of(served, "proposed")
        (elicited,) = rows_of(served, "elicited")
        assert (elicited["answer"], elicited["mode"], elicited["caller"]) == ("accept", "form", "alice")
        assert elicited["proposal_id"] == proposed["proposal_id"]
        (executing,) = rows_of(served, "executing")
        assert (executing["proposal_id"], executing["caller"]) == (proposed["proposal_id"], "alice")
        assert len(rows_of(served, "executed")) == 1
        assert not rows_of(served, "denied")
        calls = served.gateway.metrics.render()  # the first round and its retry: two rounds of one call
    assert not vm_exists(sim, vm)
    assert 'gateway_tool_calls_total{outcome="ok",target="vc1",tool="delete_vm"} 2.0' in calls


async def test_the_person_declines_a_delete_in_a_round(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    person = Person("decline")
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, person) as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
        assert answer["state"] == "cancelled" and answer["person_answer"] == "decline"
        assert "token" not in answer and len(person.asked) == 1
        (elicited,) = rows_of(served, "elicited")
        assert elicited["answer"] == "decline"
        assert [r["proposal_id"] for r in rows_of(served, "cancelled")] == [elicited["proposal_id"]]
        assert not rows_of(served, "executing")
    assert vm_exists(sim, vm)


async def test_a_cancel_leaves_the_token_when_either_may_confirm(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("either")) as served:
        async with asking(served, Person("cancel")) as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
            assert answer["state"] == "pending" and answer["person_answer"] == "cancel"
            done = answer_of(await client.call_tool("confirm_action", {"token": answer["token"]}))
        assert done["state"] == "executed"
        assert [r["answer"] for r in rows_of(served, "elicited")] == ["cancel"]
    assert not vm_exists(sim, vm)


async def test_a_gated_target_sends_the_person_to_the_card(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    person = Person("accept")
    with served_with(tmp_path, sim, confirm_rules("elicitation", approval=True)) as served:
        async with asking(served, person) as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
        (asked,) = person.asked
        assert isinstance(asked, types.ElicitRequestURLParams)
        assert asked.url == f"{served.base}/ui#proposal={answer['proposal_id']}" == answer["card_url"]
        assert answer["state"] == "pending" and answer["requires_human_approval"] is True
        assert answer["person_asked"] == "accept"
        (elicited,) = rows_of(served, "elicited")
        assert (elicited["mode"], elicited["answer"]) == ("url", "accept")
        assert not rows_of(served, "executing")  # an accepted URL is no approval
    assert vm_exists(sim, vm)


async def test_a_changed_replayed_or_other_calls_state_is_refused_and_audited(
    tmp_path: Path, sim: Simulator
) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, Person("accept")) as client:
            first = await _first_round(client, args)
            state = first.request_state
            assert state is not None
            request = (first.input_requests or {})["confirm"]
            assert isinstance(request, types.ElicitRequest)
            assert isinstance(request.params, types.ElicitRequestFormParams)
            changed = await _retry(client, args, _changed(state))
            other_call = await _retry(client, {**args, "force_power_off": False}, state)
            assert vm_exists(sim, vm)  # neither reached vSphere
            done = await _retry(client, args, state)
            replayed = await _retry(client, args, state)
        assert changed["error"]["code"] == "confirmation_invalid"
        assert changed["error"]["reason_code"] == "request_state_invalid"
        assert other_call["error"]["reason_code"] == "request_state_mismatch"
        assert done["state"] == "executed"
        assert (replayed["error"]["code"], replayed["error"]["reason_code"]) == (
            "confirmation_invalid", "request_state_spent")
        assert _refusals(served) == [
            ("alice", "confirmation_invalid", "request_state_invalid"),
            ("alice", "confirmation_invalid", "request_state_mismatch"),
            ("alice", "confirmation_invalid", "request_state_spent"),
        ]
        assert len(rows_of(served, "executing")) == len(rows_of(served, "executed")) == 1
        assert [r["answer"] for r in rows_of(served, "elicited")] == ["accept"]
        assert all(state not in json.dumps(r) for r in audit_rows(served.gateway))  # never written
    assert not vm_exists(sim, vm)


async def test_another_callers_state_is_refused_and_audited(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, Person("accept")) as alice:
            first = await _first_round(alice, args)
            assert first.request_state is not None
            async with asking(served, Person("accept"), who="bob") as bob:
                taken = await _retry(bob, args, first.request_state)
            assert (taken["error"]["code"], taken["error"]["reason_code"]) == (
                "confirmation_invalid", "request_state_not_yours")
            assert vm_exists(sim, vm)
            declined = await _retry(alice, args, first.request_state,
                                    {"confirm": types.ElicitResult(action="decline")})
        assert declined["state"] == "cancelled"  # bob's attempt did not spend alice's state
        assert _refusals(served) == [("bob", "confirmation_invalid", "request_state_not_yours")]
        assert not rows_of(served, "executing")
    assert vm_exists(sim, vm)


async def test_a_state_past_its_proposals_expiry_is_refused_and_audited(
    tmp_path: Path, sim: Simulator
) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, Person("accept")) as client:
            first = await _first_round(client, args)
            assert first.request_state is not None
            later = time.time() + 3600  # past the proposal's 120 s
            served.gateway.clock = lambda: later
            expired = await _retry(client, args, first.request_state)
        assert (expired["error"]["code"], expired["error"]["reason_code"]) == (
            "confirmation_expired", "request_state_expired")
        assert _refusals(served) == [("alice", "confirmation_expired", "request_state_expired")]
        assert not rows_of(served, "executing") and not rows_of(served, "elicited")
    assert vm_exists(sim, vm)


async def test_both_revisions_are_served_side_by_side(tmp_path: Path, sim: Simulator) -> None:
    (old_vm, old_args), (new_vm, new_args) = delete_args(sim, 0), delete_args(sim, 1)
    old_person, new_person = Person("accept"), Person("accept")
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, old_person, mode="legacy") as old, asking(served, new_person) as new:
            assert old.protocol_version != MODERN and new.protocol_version == MODERN
            old_done = answer_of(await old.call_tool("delete_vm", old_args))
            new_done = answer_of(await new.call_tool("delete_vm", new_args))
        assert old_done["state"] == new_done["state"] == "executed"
        assert len(old_person.asked) == len(new_person.asked) == 1
        assert [r["answer"] for r in rows_of(served, "elicited")] == ["accept", "accept"]
    assert not vm_exists(sim, old_vm) and not vm_exists(sim, new_vm)


async def test_any_replica_opens_a_state_and_spends_it_for_all(
    tmp_path: Path, make_simulator: MakeSimulator, pg_url: str
) -> None:
    sim = make_simulator()
    vm, args = delete_args(sim)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    replica_a = build_gateway(tmp_path / "a", sim, confirm_rules("elicitation"), database_url=pg_url)
    replica_b = build_gateway(tmp_path / "b", sim, confirm_rules("elicitation"), database_url=pg_url)
    served_a = serve(tmp_path / "a", replica_a)
    served_b = serve(tmp_path / "b", replica_b, tokens=served_a.tokens)
    try:
        async with asking(served_a, Person("accept")) as on_a:
            first = await _first_round(on_a, args)
            assert first.request_state is not None
            async with asking(served_b, Person("accept")) as on_b:
                done = await _retry(on_b, args, first.request_state)
            replayed = await _retry(on_a, args, first.request_state)
    finally:
        served_a.stop()
        served_b.stop()
        await replica_a.close()
        await replica_b.close()
    assert done["state"] == "executed", done
    assert replayed["error"]["reason_code"] == "request_state_spent"
    assert not vm_exists(sim, vm)
