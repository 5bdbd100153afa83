"""Confirmation by the person at the MCP client (MCP elicitation): the pure route decision as a table,
``confirm_by`` in rules.yaml, and the real SDK client over HTTPS against the simulator: a delete confirmed
and declined in-band (checked with pyVmomi), a gated target's card URL, a client without elicitation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from support.answers import answer_of
from support.elicitation import Person, asking, confirm_rules, delete_args, rows_of, served_with
from support.httpserver import mcp_client
from support.simulator import MakeSimulator, Simulator, complete_rules_text, vm_exists

from gateway.config import ConfigProblems
from gateway.guard.elicitation import ClientAsks, Route, confirm_route
from gateway.guard.policy.model import ConfirmBy
from gateway.guard.policy.parse import parse_policy_text

pytestmark = pytest.mark.anyio

FORM, URL, BOTH, NONE = ClientAsks(form=True), ClientAsks(url=True), ClientAsks(True, True), ClientAsks()


# ---------------------------------------------------------------------------- the decision (pure)


@pytest.mark.parametrize(
    ("confirm_by", "gated", "client", "route", "token"),
    [
        ("tool", False, NONE, Route.TOKEN, True),
        ("tool", False, BOTH, Route.TOKEN, True),
        ("tool", True, BOTH, Route.TOKEN, True),
        ("either", False, FORM, Route.ASK_FORM, False),
        ("either", False, BOTH, Route.ASK_FORM, False),
        ("either", False, NONE, Route.TOKEN, True),
        ("either", False, URL, Route.TOKEN, True),
        ("elicitation", False, FORM, Route.ASK_FORM, False),
        ("elicitation", False, NONE, Route.REFUSE, False),
        ("elicitation", False, URL, Route.REFUSE, False),
        ("either", True, BOTH, Route.ASK_URL, True),
        ("elicitation", True, URL, Route.ASK_URL, True),
        ("either", True, FORM, Route.LINK, True),
        ("elicitation", True, NONE, Route.TOKEN, True),
        ("either", True, NONE, Route.TOKEN, True),
    ],
)
def test_confirm_route(confirm_by: str, gated: bool, client: ClientAsks, route: Route, token: bool) -> None:
    decided = confirm_route(confirm_by, gated, client)
    assert (decided.route, decided.token_for_agent) == (route, token)


def test_an_elicited_accept_never_confirms_a_gated_proposal() -> None:
    for how in ConfirmBy:
        for client in (FORM, URL, BOTH, NONE):
            assert confirm_route(how, True, client).route is not Route.ASK_FORM


# ---------------------------------------------------------------------------- rules.yaml


def test_confirm_by_per_target_and_per_rule_reaches_the_decision() -> None:
    from datetime import UTC, datetime

    from gateway.guard.policy.evaluate import evaluate
    from gateway.guard.policy.model import CallFacts
    from gateway.vocabulary import Category, Risk

    policy = parse_policy_text(complete_rules_text(
        "defaults: {destructive: allow}\n"
        "targets:\n  vc1: {confirm_by: either}\n"
        "rules:\n  - {name: lab, match: {targets: [lab]}, action: allow, confirm_by: elicitation}\n"
    ), "rules.yaml")
    assert policy.default_settings().confirm_by is ConfirmBy.TOOL
    assert policy.target_settings("vc1").to_dict()["confirm_by"] == "either"
    assert policy.rules[0].to_dict()["confirm_by"] == "elicitation"

    def decided(target: str) -> str:
        facts = CallFacts(tool="delete_vm", category=Category.DESTRUCTIVE, risk=Risk.CRITICAL, target=target,
                          target_tags=(), affected=(), caller="agent", role="admin")
        return evaluate(facts, policy, datetime.now(UTC)).confirm_by

    assert (decided("vc1"), decided("lab"), decided("other")) == ("either", "elicitation", "tool")


def test_a_bad_confirm_by_is_named_with_file_and_line() -> None:
    text = complete_rules_text("defaults:\n  destructive: allow\n  confirm_by: person\n")
    with pytest.raises(ConfigProblems) as caught:
        parse_policy_text(text, "rules.yaml")
    (problem,) = caught.value.problems
    assert problem.startswith("rules.yaml:3:") and "defaults.confirm_by" in problem
    assert "tool, elicitation, either" in problem


# ---------------------------------------------------------------------------- over HTTPS with the SDK client


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator()


async def test_the_person_confirms_a_delete_in_band(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    person = Person("accept")
    with served_with(tmp_path, sim, confirm_rules("either")) as served:
        async with asking(served, person, mode="legacy") as client:
            result = await client.call_tool("delete_vm", args)
        answer = answer_of(result)
        assert not result.is_error, answer
        assert answer["state"] == "executed" and answer["deleted_vm"] == vm
        (asked,) = person.asked
        assert asked.mode == "form"
        assert "'vc1'" in asked.message and sim.host in asked.message and vm in asked.message
        assert "token" not in json.dumps(answer)
        (elicited,) = rows_of(served, "elicited")
        assert (elicited["answer"], elicited["mode"], elicited["caller"]) == ("accept", "form", "alice")
        executing = rows_of(served, "executing")
        assert len(executing) == 1 and executing[0]["proposal_id"] == elicited["proposal_id"]
        assert len(rows_of(served, "executed")) == 1
    assert not vm_exists(sim, vm)


async def test_the_person_declines_a_delete_in_band(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    person = Person("decline")
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with asking(served, person, mode="legacy") as client:
            result = await client.call_tool("delete_vm", args)
        answer = answer_of(result)
        assert answer["state"] == "cancelled" and answer["person_answer"] == "decline"
        assert "token" not in answer
        (elicited,) = rows_of(served, "elicited")
        assert elicited["answer"] == "decline"
        assert [r["proposal_id"] for r in rows_of(served, "cancelled")] == [elicited["proposal_id"]]
        assert not rows_of(served, "executing")
    assert vm_exists(sim, vm)


async def test_a_cancelled_form_leaves_the_token_when_either_may_confirm(
    tmp_path: Path, sim: Simulator
) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("either")) as served:
        async with mcp_client(served, served.tokens["alice"], "legacy",
                              elicitation_callback=Person("cancel")) as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
            assert answer["state"] == "pending" and answer["person_answer"] == "cancel"
            done = answer_of(await client.call_tool("confirm_action", {"token": answer["token"]}))
        assert done["state"] == "executed"
        assert [r["answer"] for r in rows_of(served, "elicited")] == ["cancel"]
    assert not vm_exists(sim, vm)


async def test_a_gated_targets_elicitation_carries_the_cards_url(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    person = Person("accept")
    with served_with(tmp_path, sim, confirm_rules("either", approval=True)) as served:
        async with asking(served, person, mode="legacy") as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
        proposal = answer["proposal_id"]
        (asked,) = person.asked
        assert isinstance(asked, types.ElicitRequestURLParams)
        assert asked.url == f"{served.base}/ui#proposal={proposal}" == answer["card_url"]
        assert answer["state"] == "pending" and answer["requires_human_approval"] is True
        (elicited,) = rows_of(served, "elicited")
        assert (elicited["mode"], elicited["answer"]) == ("url", "accept")
        assert not rows_of(served, "executing")  # an accepted URL is no approval
    assert vm_exists(sim, vm)


async def test_a_client_without_elicitation_sees_todays_flow(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("either")) as served:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
            assert set(answer) == {"state", "proposal_id", "target", "target_host", "tool", "summary",
                                   "affected", "blast_radius", "token", "expires_in_seconds",
                                   "requires_human_approval", "dry_run", "confirm_with", "note"}
            assert answer["confirm_with"].startswith("confirm_action(token=")
            done = answer_of(await client.call_tool("confirm_action", {"token": answer["token"]}))
        assert done["state"] == "executed"
        assert not rows_of(served, "elicited")
    assert not vm_exists(sim, vm)


async def test_elicitation_required_refuses_a_client_that_cannot_ask(tmp_path: Path, sim: Simulator) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            result = await client.call_tool("delete_vm", args)
        assert result.is_error and answer_of(result)["error"]["code"] == "policy_denied"
        (denied,) = [r for r in rows_of(served, "denied") if r["tool"] == "delete_vm"]
        assert denied["reason_code"] == "elicitation_unavailable"
        assert not rows_of(served, "proposed")
    assert vm_exists(sim, vm)


class SlowPerson(Person):
    """A person who does not answer within the gateway's deadline (it is shortened for the test)."""

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        await anyio.sleep(5)  # longer than the 0.5 s deadline: the gateway stops waiting first
        return types.ElicitResult(action="accept", content={})


async def test_no_answer_in_time_is_audited_and_cancels_a_person_only_proposal(
    tmp_path: Path, sim: Simulator
) -> None:
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("elicitation")) as served:
        served.gateway.proposals.in_band.timeout_seconds = 0.5
        async with asking(served, SlowPerson("accept"), mode="legacy") as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
        assert answer["state"] == "cancelled" and answer["person_answer"] == "timeout"
        assert [r["answer"] for r in rows_of(served, "elicited")] == ["timeout"]
        assert not rows_of(served, "executing")
    assert vm_exists(sim, vm)


def test_policy_show_names_confirm_by_per_target_and_rule(tmp_path: Path) -> None:
    from gateway.config import Target
    from gateway.guard.policy.describe import describe
    from gateway.guard.policy.store import PolicyStore

    path = tmp_path / "rules.yaml"
    path.write_text(complete_rules_text(
        "targets:\n  vc1: {confirm_by: elicitation}\n"
        "rules:\n  - {name: lab, match: {targets: [vc2]}, action: allow, confirm_by: either}\n"))
    shown = describe(PolicyStore(path), [Target("vc1", "vc1.example.com", "VC1"),
                                         Target("vc2", "vc2.example.com", "VC2")])
    assert shown["targets"]["vc1"]["confirm_by"] == "elicitation"
    assert shown["targets"]["vc1"]["set_by"]["confirm_by"] == "targets:vc1"
    assert shown["targets"]["vc2"]["confirm_by"] == "tool"
    assert shown["rules"][0]["confirm_by"] == "either"


async def test_a_stateless_revision_client_without_elicitation_confirms_with_its_token(
    tmp_path: Path, sim: Simulator
) -> None:
    # 2026-07-28 asks the person in rounds (tests/server/edge/test_mcp_elicitation_2026.py); a client that
    # declares no elicitation sees the plain flow there too
    vm, args = delete_args(sim)
    with served_with(tmp_path, sim, confirm_rules("either")) as served:
        async with mcp_client(served, served.tokens["alice"], "2026-07-28") as client:
            answer = answer_of(await client.call_tool("delete_vm", args))
            assert answer["state"] == "pending" and "person_answer" not in answer
            done = answer_of(await client.call_tool("confirm_action", {"token": answer["token"]}))
        assert done["state"] == "executed"
        assert not rows_of(served, "elicited")
    assert not vm_exists(sim, vm)
