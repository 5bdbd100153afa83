"""A rules.yaml broken by an edit after a good load fails closed (issue 34), over the real HTTPS server,
the MCP client and the simulator: a write is refused with the file's parse error and never reaches
vSphere, the broken load and the recovery are audit rows, list_targets and the probes keep answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from support.answers import answer_of
from support.gateway_env import PERMISSIVE, VM0
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import (
    MakeSimulator,
    Simulator,
    complete_rules,
    find_vm,
    pyvmomi_connect,
    read_properties,
)


@pytest.fixture
def sim(make_simulator: MakeSimulator) -> Simulator:
    return make_simulator(vms=2)


@pytest.fixture
def served(sim: Simulator, tmp_path: Path) -> Iterator[Served]:
    running = serve(tmp_path, build_gateway(tmp_path, sim, PERMISSIVE))
    yield running
    running.stop()
    anyio.run(running.gateway.close)


def call(served: Served, tool: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    async def run() -> tuple[bool, dict[str, Any]]:
        async with mcp_client(served, served.tokens["alice"], "2026-07-28") as client:
            result = await client.call_tool(tool, args)
        return bool(result.is_error), answer_of(result)

    return anyio.run(run)


def power_state(sim: Simulator) -> str:
    si = pyvmomi_connect(sim)
    return str(read_properties(si, find_vm(si, VM0), "runtime.powerState")["runtime.powerState"])


def rules_rows(served: Served) -> list[dict[str, Any]]:
    return [r for r in audit_rows(served.gateway, config_loads=True)
            if r.get("phase") == "config_reload" and r.get("file") == "rules"]


def healthz(served: Served) -> int:
    return httpx2.get(f"{served.base}/healthz", verify=served.tls(), timeout=30).status_code


def test_a_broken_edit_refuses_a_write_with_the_parse_error_until_fixed(
    served: Served, sim: Simulator, tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    good = yaml.safe_dump(complete_rules(PERMISSIVE))
    failed, listed = call(served, "list_targets", {})
    assert not failed and listed["count"] == 1, listed
    assert power_state(sim) == "poweredOn"
    assert [r["outcome"] for r in rules_rows(served)] == ["loaded"]

    rules.write_text(good.replace("write: allow", "write: allow\n  dry_rn: true"))  # a typo after a good load
    failed, answer = call(served, "power_off_vm", {"target": "vc1", "vm": VM0})
    assert failed, answer
    error = answer["error"]
    assert error["code"] == "policy_denied", error
    assert f"{rules}:5:3" in error["message"] and "dry_rn: unknown key" in error["message"], error
    assert power_state(sim) == "poweredOn"  # nothing fell back to the permissive rules before
    denied = [r for r in audit_rows(served.gateway) if r.get("tool") == "power_off_vm"]
    assert denied and denied[-1]["phase"] == "denied", denied
    rows = rules_rows(served)
    assert [r["outcome"] for r in rows] == ["loaded", "refused"], rows
    assert "dry_rn" in rows[1]["error"] and "no earlier rules" in rows[1]["effect"], rows[1]
    failed, listed = call(served, "list_targets", {})  # not policy-decided: it keeps answering
    assert not failed and listed["count"] == 1, listed
    assert healthz(served) == 200
    broken = served.gateway.policy.broken
    assert broken is not None and "dry_rn" in broken[1]

    rules.write_text(good)
    failed, answer = call(served, "power_off_vm", {"target": "vc1", "vm": VM0})
    assert not failed, answer
    assert power_state(sim) == "poweredOff"
    rows = rules_rows(served)
    assert [(r["outcome"], r.get("recovered")) for r in rows] == [
        ("loaded", None), ("refused", None), ("loaded", True)], rows
    assert served.gateway.policy.broken is None


def test_policy_show_says_the_rules_are_broken_and_since_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    import os
    from datetime import UTC, datetime

    from gateway.cli import main

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(complete_rules(PERMISSIVE)).replace("write: allow", "write: [allow"))
    os.utime(rules, (1_800_000_000, 1_800_000_000))
    (tmp_path / "targets.yaml").write_text("targets: []\n")
    assert main(["policy", "show", "--json", "--home", str(tmp_path), "--rules", str(rules)]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["broken"] is True and shown["status"] == "error", shown
    assert shown["broken_since"] == datetime.fromtimestamp(1_800_000_000, UTC).isoformat(timespec="seconds")
    assert f"{rules}:5:" in shown["errors"][0] and "not valid YAML" in shown["errors"][0], shown
    assert "no earlier rules stay in force" in shown["effect"]
