"""Fair queueing on a target's lane, through the real gateway (``Gateway.call``: the gate, the reads,
the scheduler) over a simulator slowed from its control endpoint (``/delay``).

Nothing here asserts on elapsed time: each test compares the order in which calls finish, or the
shares of calls finished over a window counted in calls.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.gateway_env import Env, role, write_roles
from support.simulator import MakeSimulator, credentials_env, sim_target

from gateway.auth.tokens import Principal
from gateway.errors import GatewayError
from gateway.server.runtime import Gateway
from gateway.store.slots import PgSlots
from gateway.vsphere import lane
from gateway.vsphere.lane import Caller
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler

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
    await asyncio.gather(*(gw.calls.call(agent("warm"), "get_vm_details", READ) for _ in range(2)))
    env.sim.control("/delay", {"delay": delay_ms})


def queued(gw: Gateway) -> int:
    return int(gw.scheduler.stats()["vc1"]["queued"])


async def finishing(done: list[str], label: str, call: Awaitable[Any]) -> None:
    await call
    done.append(label)


@pytest.mark.anyio
async def test_b_behind_a_burst_of_24_is_served_within_two_call_times(env: Env) -> None:
    gw = slowed(env, 100)
    await warm(gw, env, 100)
    done: list[str] = []
    burst = [asyncio.create_task(finishing(done, "A",
                                           gw.calls.call(agent("agent-a"), "get_vm_details", READ)))
             for _ in range(24)]
    await until(lambda: queued(gw) >= 20)  # A's burst is in the lane: 2 running, the rest waiting
    await finishing(done, "B", gw.calls.call(agent("agent-b"), "get_vm_details", READ))
    ahead = done.index("B")
    await asyncio.gather(*burst)
    # B waits for one slot to free and then runs: the two calls running when it came, and at most
    # one more per slot, finish before it (strict arrival order: all but the last of A's)
    assert ahead <= 4, f"{ahead} of A's calls finished before B's"


@pytest.mark.anyio
async def test_a_burst_at_fixed_call_times_is_spread_over_the_slots_not_run_in_lock_step(env: Env) -> None:
    """At fixed call times the burst's two slots would free at the same instant, call after call, so a
    newcomer waits for half a call on average; the lane starts its calls apart instead. Counted in
    finishes that come together (closer than a tenth of a call), not in elapsed time."""
    gw = slowed(env, 100)
    await warm(gw, env, 100)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await gw.calls.call(agent("agent-a"), "get_vm_details", READ)
    call = loop.time() - started
    finished: list[float] = []

    async def a_call() -> None:
        await gw.calls.call(agent("agent-a"), "get_vm_details", READ)
        finished.append(loop.time())

    await asyncio.gather(*(a_call() for _ in range(16)))
    gaps = [b - a for a, b in itertools.pairwise(finished[4:])]  # past the first two rounds
    together = [round(g * 1000) for g in gaps if g < call / 10]
    # in lock step about every other finish comes with another (6 of 11 on the old lane); a loaded
    # machine can bring two together by chance now and then, never most
    assert len(together) <= 3, f"{len(together)} of {len(gaps)} finishes came together (ms apart: {together})"
    scrape = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(gw.metrics.render()) for s in family.samples}
    assert scrape[("gateway_target_starts_staggered_total", (("target", "vc1"),))] >= 1


async def shares(gw: Gateway, callers: Sequence[Principal], *, each: int, skip: int,
                 window: int) -> dict[str, int]:
    """Every caller queues ``each`` calls at once (in caller order); the calls each finished among
    finishing calls ``skip`` to ``skip + window``."""
    done: list[str] = []
    tasks = [asyncio.create_task(finishing(done, who.name, gw.calls.call(who, "get_vm_details", READ)))
             for who in callers for _ in range(each)]
    await until(lambda: len(done) >= skip + window, timeout=120)
    counted = done[skip:skip + window]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {who.name: counted.count(who.name) for who in callers}


@pytest.mark.anyio
async def test_eight_agents_with_equal_loads_finish_equal_shares(env: Env) -> None:
    gw = slowed(env, 20)
    await warm(gw, env, 20)
    got = await shares(gw, [agent(f"agent-{n}") for n in range(8)], each=24, skip=16, window=96)
    assert max(got.values()) / max(min(got.values()), 1) <= 1.25, got


@pytest.mark.anyio
async def test_a_caller_over_its_bound_is_refused_busy_at_once_while_others_are_served(env: Env) -> None:
    gw = slowed(env, 300, max_queued_per_caller=4)
    await warm(gw, env, 300)
    done: list[str] = []

    async def a_call() -> None:
        try:
            await gw.calls.call(agent("agent-a"), "get_vm_details", READ)
        except GatewayError as exc:
            done.append(f"A:{exc.code}:{exc.details.get('retry_after_seconds')}")
        else:
            done.append("A:ok")

    burst = [asyncio.create_task(a_call()) for _ in range(10)]  # 2 run, 4 wait, 4 are refused
    await until(lambda: len(done) >= 4)
    assert all(d.startswith("A:busy:") for d in done), done  # at once: before any of A's calls finished
    assert all(float(d.split(":")[2]) >= 1.0 for d in done)
    await finishing(done, "B", gw.calls.call(agent("agent-b"), "get_vm_details", READ))
    await asyncio.gather(*burst)
    assert done.count("A:ok") == 6 and done.index("B") <= 4 + 4, done
    await gw.path.busy.flush()
    rows = env.rows(phase="busy")
    assert [(r["caller"], r["target"], r["count"], r["error_code"], r["tools"]) for r in rows] == [
        ("agent-a", "vc1", 4, "busy", ["get_vm_details"])]
    assert not [r for r in env.rows() if r.get("error_code") == "busy" and r.get("phase") != "busy"]
    scrape = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(gw.metrics.render()) for s in family.samples}
    assert scrape[("gateway_target_admissions_refused_total", (("reason", "busy"), ("target", "vc1")))] == 4
    assert scrape[("gateway_target_queue_wait_seconds_count", (("target", "vc1"),))] >= 9  # warm + 6 A + B


@pytest.mark.anyio
async def test_a_role_with_a_higher_queue_weight_gets_its_larger_share(env: Env) -> None:
    write_roles(env.tmp, {"person": {**role(), "queue_weight": 3}, "batch": role()})
    gw = slowed(env, 20)
    await warm(gw, env, 20)
    got = await shares(gw, [agent("batch-job", "batch"), agent("alice", "person")], each=30, skip=4,
                       window=32)
    assert 2.4 <= got["alice"] / got["batch-job"] <= 3.6, got


@pytest.mark.anyio
async def test_list_targets_shows_each_targets_queue_depth(env: Env) -> None:
    gw = slowed(env, 300)
    await warm(gw, env, 300)
    burst = [asyncio.create_task(gw.calls.call(agent("agent-a"), "get_vm_details", READ)) for _ in range(6)]
    await until(lambda: queued(gw) == 4)
    listing = await gw.calls.call(agent("agent-b"), "list_targets", {})
    assert [(t["name"], t["queue_depth"], t["running"]) for t in listing["targets"]] == [("vc1", 4, 2)]
    await asyncio.gather(*burst)


def test_two_replicas_on_postgresql_keep_the_global_pool_size_and_both_progress(
        make_simulator: MakeSimulator, pg_url: str) -> None:
    """Two replicas (each its own scheduler and its own slot connections to one PostgreSQL) on one
    target with ``pool_size: 2``: replica 1's agent queues a burst of 16, then replica 2's agent asks
    for 4. Never more than 2 calls run at once across both, and replica 2's calls are not held behind
    replica 1's burst: the target's free slots are shared between the replicas' waiting calls."""
    sim = make_simulator(vms=2, method_delay={"CurrentTime": 100})
    target = sim_target("vc1", sim, pool_size=2)
    replicas = [Scheduler([target], credentials_env({"vc1": sim}), slots=PgSlots(pg_url)) for _ in range(2)]
    lock, running, peak, done = threading.Lock(), [0], [0], []

    def call(label: str) -> Callable[[VSphereSession], Any]:
        def fn(session: VSphereSession) -> Any:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            try:
                return session.si.CurrentTime()
            finally:
                with lock:
                    running[0] -= 1
                    done.append(label)
        return fn

    async def main() -> None:
        await asyncio.gather(*(r.run("vc1", call("warm")) for r in replicas))  # both logged in
        done.clear()
        burst = [asyncio.create_task(replicas[0].run("vc1", call("r1"), caller=Caller("agent-1")))
                 for _ in range(16)]
        await until(lambda: replicas[0].stats()["vc1"]["queued"] >= 14)
        second = [asyncio.create_task(replicas[1].run("vc1", call("r2"), caller=Caller("agent-2")))
                  for _ in range(4)]
        await asyncio.gather(*burst, *second)

    try:
        asyncio.run(main())
    finally:
        for r in replicas:
            r.close()
    assert peak[0] == 2, "pool_size 2 across both replicas"
    last = max(i for i, label in enumerate(done) if label == "r2")
    assert last <= 12, f"replica 2's last call finished {last + 1}th of 20: {done}"


def test_queue_wait_is_summed_inside_a_tool_call_and_absent_outside() -> None:
    """``queue_as`` starts a tool call's list of waits, the scheduler appends to it, and its rows read the
    sum in milliseconds (``queue_wait_ms``); outside a tool call, or with no wait, there is none."""
    assert lane.queue_wait_ms() is None
    with lane.queue_as("token:alice"):
        assert lane.queue_wait_ms() is None
        waits = lane.queue_waits_var.get()
        assert waits is not None
        waits.extend([0.0015, 0.0005])
        assert lane.queue_wait_ms() == 2.0
    assert lane.queue_wait_ms() is None
