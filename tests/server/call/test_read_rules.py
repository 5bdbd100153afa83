"""Read deny rules bite on every read path: the real HTTPS server and MCP client against the simulator,
answers from the mirror and from sweeps, single target and fan-out (gateway.server.call.read_rules)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.answers import answer_of
from support.gateway_env import PERMISSIVE, Env
from support.httpserver import Served, mcp_client, serve
from support.simulator import (
    MakeSimulator,
    complete_rules,
    find_vm,
    pyvmomi_connect,
    wait_until,
    write_targets,
)

from gateway.audit.query import read_rows
from gateway.auth.tokens import Principal
from gateway.errors import PolicyDenied
from gateway.server.runtime import Gateway
from gateway.settings import Settings

pytestmark = pytest.mark.anyio

HIDDEN, SHOWN = "DC0_C0_RP0_VM1", "DC0_C0_RP0_VM0"
#: each hides HIDDEN from the role reader (bob), never from admin (alice)
RULES: dict[str, dict[str, Any]] = {
    "by-vm-pattern": {"name": "hide-vm1", "action": "deny",
                      "match": {"roles": ["reader"], "tools": ["read"], "vm_patterns": ["*_VM1"]}},
    "by-folder": {"name": "hide-secret", "action": "deny",
                  "match": {"roles": ["reader"], "tools": ["read"], "folders": ["/DC0/vm/secret"]}},
}


def prepare_simulator(make_simulator: MakeSimulator) -> Any:
    """A simulator whose HIDDEN VM sits in folder /DC0/vm/secret and has power events of its own."""
    sim = make_simulator(vms=3)
    si = pyvmomi_connect(sim)
    vm = find_vm(si, HIDDEN)
    datacenter = si.content.rootFolder.childEntity[0]
    secret = datacenter.vmFolder.CreateFolder("secret")
    secret.MoveIntoFolder_Task([vm])
    vm.PowerOffVM_Task()
    vm.PowerOnVM_Task()
    return sim


@pytest.fixture(params=["mirror", "sweep"])
def served(request: pytest.FixtureRequest, make_simulator: MakeSimulator, tmp_path: Path) -> Iterator[Served]:
    sim = prepare_simulator(make_simulator)
    mirror = "eager" if request.param == "mirror" else "off"
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim}, {"vc1": {"mirror": mirror}})
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    rule = RULES[request.node.callspec.params["rule"]]
    (home / "rules.yaml").write_text(yaml.safe_dump(complete_rules({"rules": [rule]})))
    gw = Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp_path / "targets.yaml")))
    running = serve(tmp_path, gw)
    if mirror == "eager":
        wait_until(lambda: gw.mirrors.stats()["vc1"].state == "synced", timeout=30, what="mirror synced")
    yield running
    running.stop()


async def calls(served: Served, who: str, *requests: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    async with mcp_client(served, served.tokens[who], "legacy") as client:
        return [answer_of(await client.call_tool(tool, args)) for tool, args in requests]


def vm_names(listing: dict[str, Any]) -> list[str]:
    return [row["name"] for row in listing["vms"]]


READS = (
    ("list_vms", {"target": "vc1"}),
    ("list_vms", {"target": "all"}),
    ("list_vms", {"target": "vc1", "fields": ["name"], "limit": 1}),
    ("get_vm_details", {"target": "vc1", "vm": HIDDEN}),
    ("list_snapshots", {"target": "vc1", "vm": HIDDEN}),
    ("get_events", {"target": "vc1", "minutes": 600}),
    ("get_vm_details", {"target": "all", "vm": HIDDEN}),
)


@pytest.mark.parametrize("rule", list(RULES))
async def test_a_read_deny_rule_hides_the_vm_from_that_role_only(served: Served, rule: str) -> None:
    before = served.gateway.mirrors.stats().get("vc1")
    single, fanned, limited, details, snapshots, events, fanned_details = await calls(served, "bob", *READS)
    assert HIDDEN not in vm_names(single) and SHOWN in vm_names(single) and single["withheld"] == 1
    assert single["count"] == len(single["vms"])
    fan = fanned["vc1"]["ok"]
    assert HIDDEN not in vm_names(fan) and fan["withheld"] == 1
    assert limited["vms"] == [{"name": vm_names(single)[0]}] and limited["truncated"] is True
    for refused in (details, snapshots, fanned_details["vc1"]):
        assert refused["error"]["code"] == "policy_denied", refused
        assert RULES[rule]["name"] in refused["error"]["message"]
    assert HIDDEN not in json.dumps(events["events"]) and events["withheld"] >= 1

    a_single, a_fanned, _limited, a_details, a_snapshots, a_events, _ = await calls(served, "alice", *READS)
    assert HIDDEN in vm_names(a_single) and HIDDEN in vm_names(a_fanned["vc1"]["ok"])
    assert "withheld" not in a_single
    assert a_details["name"] == HIDDEN and a_snapshots["vm"] == HIDDEN
    assert HIDDEN in json.dumps(a_events["events"]), "the admin sees the hidden VM's events"

    after = served.gateway.mirrors.stats().get("vc1")
    if before is not None:  # answered from the mirror: it served the reads (kept answers, every role)
        assert after is not None and after.served > before.served
    else:
        assert after is None or after.served == 0
    denied = [r for r in read_rows(served.gateway.settings.audit_log, phase="denied", caller="bob")
              if r.get("tool") in ("get_vm_details", "list_snapshots")]
    assert {r["error_code"] for r in denied} == {"policy_denied"} and len(denied) == 2


# ---------------------------------------------------------------- a deny rule on reads, in the pipeline


async def test_read_deny_rule_is_enforced(env: Env) -> None:
    rules = {
        **PERMISSIVE,
        "rules": [
            {
                "name": "no-reads-for-watcher",
                "action": "deny",
                "match": {"tools": ["read"], "callers": ["watcher"]},
            }
        ],
    }
    gw = env.build(rules=rules)
    watcher = Principal(name="watcher", role="reader", surface="test")
    with pytest.raises(PolicyDenied, match="no-reads-for-watcher"):
        await gw.calls.call(watcher, "list_vms", {"target": "vc1"})
    (row,) = env.rows(phase="denied", tool="list_vms")
    assert row["decision"]["rule"] == "rule:no-reads-for-watcher"
    other = Principal(name="someone", role="reader", surface="test")
    assert (await gw.calls.call(other, "list_vms", {"target": "vc1"}))["count"] >= 2
