"""Fair queueing on a target's lane, through the real gateway (``Gateway.call``: the gate, the reads,
the scheduler) over a simulator slowed from its control endpoint (``/delay``).

Nothing here asserts on elapsed time: each test compares the order in which calls finish, or the
shares of calls finished over a window counted in calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from gateway_env import Env

from gateway.auth.tokens import Principal
from gateway.server.runtime import Gateway

pytestmark = pytest.mark.anyio

VM = "DC0_C0_RP0_VM0"
READ = {"target": "vc1", "vm": VM}


def agent(name: str, role: str = "admin") -> Principal:
    return Principal(name=name, role=role, surface="test")


async def until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def slowed(env: Env, delay_ms: int, **targets: Any) -> Gateway:
    """A gateway on ``vc1`` (mirror off: every read goes to the target) whose SOAP calls take
    ``delay_ms`` more each (set after the first login, so the test starts warm)."""
    return env.build(targets_extra={"mirror": "off", "pool_size": 2, **targets})


async def warm(gw: Gateway, env: Env, delay_ms: int) -> None:
    await asyncio.gather(*(gw.call(agent("warm"), "get_vm_details", READ) for _ in range(2)))
    env.sim.control("/delay", {"delay": delay_ms})


def queued(gw: Gateway) -> int:
    return int(gw.scheduler.stats()["vc1"]["queued"])


async def finishing(done: list[str], label: str, call: Awaitable[Any]) -> None:
    await call
    done.append(label)


async def test_b_behind_a_burst_of_24_is_served_within_two_call_times(env: Env) -> None:
    gw = slowed(env, 100)
    await warm(gw, env, 100)
    done: list[str] = []
    burst = [asyncio.create_task(finishing(done, "A", gw.call(agent("agent-a"), "get_vm_details", READ)))
             for _ in range(24)]
    await until(lambda: queued(gw) >= 20)  # A's burst is in the lane: 2 running, the rest waiting
    await finishing(done, "B", gw.call(agent("agent-b"), "get_vm_details", READ))
    ahead = done.index("B")
    await asyncio.gather(*burst)
    # B waits for one slot to free and then runs: the two calls running when it came, and at most
    # one more per slot, finish before it (strict arrival order: all but the last of A's)
    assert ahead <= 4, f"{ahead} of A's calls finished before B's"


async def shares(gw: Gateway, callers: Sequence[Principal], *, each: int, skip: int,
                 window: int) -> dict[str, int]:
    """Every caller queues ``each`` calls at once (in caller order); the calls each finished among
    finishing calls ``skip`` to ``skip + window``."""
    done: list[str] = []
    tasks = [asyncio.create_task(finishing(done, who.name, gw.call(who, "get_vm_details", READ)))
             for who in callers for _ in range(each)]
    await until(lambda: len(done) >= skip + window, timeout=120)
    counted = done[skip:skip + window]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {who.name: counted.count(who.name) for who in callers}


async def test_eight_agents_with_equal_loads_finish_equal_shares(env: Env) -> None:
    gw = slowed(env, 20)
    await warm(gw, env, 20)
    got = await shares(gw, [agent(f"agent-{n}") for n in range(8)], each=24, skip=16, window=96)
    assert max(got.values()) / max(min(got.values()), 1) <= 1.25, got
