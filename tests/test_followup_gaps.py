"""Gaps of issues 9 and 10 closed after the big merge: readiness off the event loop, the web page's
approve right from the one decision, state preconditions answered only after the policy."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from simulator import MakeSimulator

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------- /readyz never holds the event loop


async def test_healthz_answers_while_readiness_is_stuck(
    tmp_path: Path, make_simulator: MakeSimulator
) -> None:
    """A state store that stops answering (a fault injected by replacing ``store.ping`` with one that
    blocks: neither SQLite nor the simulator can be made to hang on demand) must not stall /healthz,
    and /readyz answers 503 at its deadline instead of hanging."""
    from httpserver import real_gateway, serve

    gw = real_gateway(make_simulator(vms=1), tmp_path)
    entered, release = threading.Event(), threading.Event()

    calls: list[int] = []

    def stuck_store_ping_fault() -> bool:
        calls.append(1)
        entered.set()
        release.wait(60)
        return True

    served = serve(tmp_path, gw)
    try:
        gw.store.ping = stuck_store_ping_fault  # type: ignore[method-assign]
        answers: dict[str, httpx2.Response] = {}
        async with served.http() as http:

            async def ready() -> None:
                answers["ready"] = await http.get("/readyz", timeout=30)

            async with anyio.create_task_group() as tg:
                tg.start_soon(ready)
                with anyio.fail_after(20):
                    while not entered.is_set():
                        await anyio.sleep(0.02)
                async with served.http() as probe:
                    try:
                        health = await probe.get("/healthz", timeout=5)
                    except httpx2.TimeoutException:
                        pytest.fail("/healthz did not answer while a readiness check was stuck")
                assert health.status_code == 200
        assert answers["ready"].status_code == 503
        assert "did not answer" in " ".join(answers["ready"].json()["reasons"])
        async with served.http() as http:
            again = await http.get("/readyz", timeout=30)
        assert again.status_code == 503 and calls == [1], "a later probe joins the stuck check"
    finally:
        release.set()
        served.stop()
        await gw.close()


# ---------------------------------------------------------------- state preconditions after the policy

#: (case, tool, arguments, how to put VM0 in the state the plan objects to)
STATE_CASES = [
    ("orphaned power", "power_off_vm", {"vm": "DC0_C0_RP0_VM0"}, "orphaned"),
    ("orphaned snapshot", "create_snapshot", {"vm": "DC0_C0_RP0_VM0", "name": "s1"}, "orphaned"),
    ("orphaned delete", "delete_vm", {"vm": "DC0_C0_RP0_VM0", "force_power_off": True}, "orphaned"),
    (
        "orphaned bulk",
        "bulk_vm_action",
        {"action": "delete_vm", "name_regex": "DC0_C0_RP0_VM0", "force_power_off": True},
        "orphaned",
    ),
    ("hot add", "reconfigure_vm", {"vm": "DC0_C0_RP0_VM0", "cpu_count": 2}, "powered on"),
    ("no iso", "unmount_iso", {"vm": "DC0_C0_RP0_VM0"}, "powered on"),
    ("no snapshot", "revert_snapshot", {"vm": "DC0_C0_RP0_VM0"}, "powered on"),
]


@pytest.mark.parametrize(("case", "tool", "args", "state"), STATE_CASES, ids=[c[0] for c in STATE_CASES])
@pytest.mark.parametrize("denied", [True, False], ids=["denied", "allowed"])
async def test_a_denied_call_never_hears_about_object_state(
    tmp_path: Path,
    make_simulator: MakeSimulator,
    case: str,
    tool: str,
    args: dict[str, Any],
    state: str,
    denied: bool,
) -> None:
    """A deny rule naming the VM answers with the denial, whatever state the VM is in; a caller the policy
    lets through hears the state advice (``invalid_state``) and nothing reaches vSphere."""
    from gateway_env import HUMAN, PERMISSIVE, VM0, Env

    from gateway.errors import InvalidState, PolicyDenied

    env = Env(tmp_path, make_simulator(vms=2))
    rule = {"name": "hands-off-vm0", "action": "deny", "match": {"vm_patterns": [VM0]}}
    gw = env.build(rules={**PERMISSIVE, "rules": [rule] if denied else []})
    try:
        if state == "orphaned":
            env.sim.control("/vm/connection-state", {"vm": VM0, "state": "orphaned"})
        expected = PolicyDenied if denied else InvalidState
        with pytest.raises((PolicyDenied, InvalidState)) as caught:
            await gw.call(HUMAN, tool, {"target": "vc1", **args})
        assert type(caught.value) is expected, f"{case}: {caught.value.code}: {caught.value.message}"
        if denied:
            assert "hands-off-vm0" in caught.value.message
            for word in ("orphaned", "power", "hot", "iso", "snapshot"):
                assert word not in caught.value.message.lower(), caught.value.message
        assert env.vm_exists(VM0)
    finally:
        await gw.close()
