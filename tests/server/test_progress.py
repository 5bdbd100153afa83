"""Task progress from vSphere reaches the MCP client over HTTPS, through the real pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.httpserver import mcp_client, serve
from support.simulator import (
    MakeSimulator,
    complete_rules,
    find_vm,
    pyvmomi_connect,
    read_properties,
    write_targets,
)

from gateway.server.runtime import Gateway
from gateway.settings import Settings

pytestmark = pytest.mark.anyio


async def test_a_slow_task_reports_progress_to_the_client(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    sim = make_simulator(vms=1)
    sim.control("/slow-task", {"method": "PowerOffVM_Task", "seconds": 2})
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim})
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "rules.yaml").write_text(yaml.safe_dump(complete_rules({"defaults": {"write": "allow"}})))
    gateway = Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp_path / "targets.yaml")))
    served = serve(tmp_path, gateway)
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress / (total or 1.0))

    try:
        async with mcp_client(served, served.tokens["alice"], "legacy") as client:
            result = await client.call_tool(
                "power_off_vm",
                {"target": "vc1", "vm": "DC0_C0_RP0_VM0", "guest_timeout_seconds": 0},
                progress_callback=on_progress,
            )
    finally:
        served.stop()
        await gateway.close()
    assert not result.is_error, result.content
    assert any(0 < f < 1 for f in seen), f"no intermediate progress relayed: {seen}"
    assert seen == sorted(seen), "progress must never go backwards"
    si = pyvmomi_connect(sim)
    state = read_properties(si, find_vm(si, "DC0_C0_RP0_VM0"), "runtime.powerState")["runtime.powerState"]
    assert state == "poweredOff"
