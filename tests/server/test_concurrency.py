"""Fairness and isolation with a dozen MCP clients over HTTPS on three targets.

One target is healthy, one is slowed with the simulator's per-method delay (one slot, so its calls
queue), and one accepts TCP connections and never answers. Calls on the slow target must finish in
arrival order; calls on the healthy target must finish while the others are still stuck.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.answers import answer_of
from support.httpserver import Served, mcp_client, serve
from support.simulator import MakeSimulator, credential_prefix, wait_until, write_targets

from gateway.server.runtime import Gateway
from gateway.settings import Settings

pytestmark = pytest.mark.anyio


def three_target_gateway(tmp: Path, make_simulator: MakeSimulator, silent_port: int, **flags: Any) -> Gateway:
    fast = make_simulator(vms=2)
    slow = make_simulator(vms=2, method_delay={"RetrievePropertiesEx": 400})
    # mirror: off: these tests are about slots on the sweeping path (a mirror would answer reads without one)
    env = write_targets(tmp / "targets.yaml", {"fast": fast, "slow": slow},
                        {"slow": {"pool_size": 1, "mirror": "off"}, "fast": {"mirror": "off"}})
    text = (tmp / "targets.yaml").read_text()
    text += (
        f"- name: hung\n  host: 127.0.0.1\n  port: {silent_port}\n  credential_env_prefix: "
        f"{credential_prefix('hung')}\n  insecure: true\n  timeout_seconds: 3\n  mirror: 'off'\n"
    )
    (tmp / "targets.yaml").write_text(text)
    env.update({f"{credential_prefix('hung')}_USER": "u", f"{credential_prefix('hung')}_PASSWORD": "p"})
    home = tmp / "home"
    home.mkdir(mode=0o700)
    return Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp / "targets.yaml"), **flags))


async def test_same_target_queues_in_order_and_other_targets_run_free(
    tmp_path: Path, make_simulator: MakeSimulator, silent_port: int
) -> None:
    gateway = three_target_gateway(tmp_path, make_simulator, silent_port)
    served: Served = serve(tmp_path, gateway)
    token = served.tokens["alice"]
    finished: list[str] = []
    errors: dict[str, str] = {}
    slow_done_when_fast_done: list[int] = []

    async def one_call(label: str, target: str) -> None:
        async with mcp_client(served, token, "legacy") as client:
            result = await client.call_tool("list_vms", {"target": target})
        if result.is_error:
            errors[label] = str(answer_of(result).get("error", {}).get("code"))
        finished.append(label)

    def lane(target: str) -> dict[str, int]:
        return gateway.scheduler.stats()[target]

    try:
        async with anyio.create_task_group() as tg:
            for i in range(4):  # hung target first: its calls hold their slots until the deadline
                tg.start_soon(one_call, f"hung-{i}", "hung")
            for i in range(4):  # slow target: start each only once the previous one is queued or running
                tg.start_soon(one_call, f"slow-{i}", "slow")
                await anyio.to_thread.run_sync(
                    lambda n=i: wait_until(
                        lambda: lane("slow")["queued"] + lane("slow")["running"] >= n + 1,
                        timeout=30,
                        what=f"slow call {n} queued",
                    )
                )
            assert lane("slow")["running"] == 1 and lane("slow")["queued"] == 3
            for i in range(4):
                tg.start_soon(one_call, f"fast-{i}", "fast")
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: sum(label.startswith("fast") for label in finished) == 4,
                    timeout=60,
                    what="fast calls finish",
                )
            )
            slow_done_when_fast_done.append(sum(label.startswith("slow") for label in finished))
            hung_done = sum(label.startswith("hung") for label in finished)
            assert hung_done == 0, "the hung target's calls cannot have finished before the healthy ones"
    finally:
        served.stop()
        await gateway.close()

    slow_order = [label for label in finished if label.startswith("slow")]
    assert slow_order == ["slow-0", "slow-1", "slow-2", "slow-3"], finished
    assert slow_done_when_fast_done[0] < 4, "the healthy target waited for the slow one"
    assert not any(label.startswith(("fast", "slow")) for label in errors), errors
    assert {errors[f"hung-{i}"] for i in range(4)} <= {"timeout", "unreachable"}, errors


async def test_calls_naming_no_target_do_not_wait_behind_a_vcenter(
    tmp_path: Path, make_simulator: MakeSimulator, silent_port: int
) -> None:
    gateway = three_target_gateway(tmp_path, make_simulator, silent_port, enable_destructive=True)
    served = serve(tmp_path, gateway)
    token = served.tokens["alice"]
    order: list[str] = []

    async def stuck() -> None:
        async with mcp_client(served, token, "legacy") as client:
            await client.call_tool("list_vms", {"target": "hung"})
        order.append("hung")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stuck)
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: gateway.scheduler.stats()["hung"]["running"] >= 1,
                    timeout=30,
                    what="hung call running",
                )
            )
            async with mcp_client(served, token, "legacy") as client:
                tools = await client.list_tools()
                pending = await client.call_tool("list_pending_actions", {})
            order.append("no-target calls")
            assert tools.tools and not pending.is_error
    finally:
        served.stop()
        await gateway.close()
    assert order == ["no-target calls", "hung"]
