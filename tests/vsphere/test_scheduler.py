"""Scheduler against simulators: FIFO slots, queue timeout, deadlines, bulkheads, fan-out, a free event loop.

Each test drives its own event loop with ``asyncio.run`` and closes its scheduler.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from support.simulator import (
    MakeSimulator,
    Simulator,
    closed_port,
    credential_prefix,
    credentials_env,
    sim_target,
)

from gateway import errors
from gateway.config import Target
from gateway.vsphere.pool import VSphereSession
from gateway.vsphere.scheduler import Scheduler

T = TypeVar("T")


def local_target(name: str, port: int, **options: Any) -> Target:
    return Target(name=name, host="127.0.0.1", port=port, credential_env_prefix=credential_prefix(name),
                  insecure=True, **options)


def now(session: VSphereSession) -> Any:
    return session.si.CurrentTime()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for ``condition`` on the event loop, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def run_with(scheduler: Scheduler, main: Callable[[], Awaitable[T]]) -> T:
    async def wrapped() -> T:
        try:
            return await main()
        finally:
            scheduler.close()
    return asyncio.run(wrapped())


def test_unknown_target_lists_known_names(sim_vc1: Simulator) -> None:
    scheduler = Scheduler([sim_target("vc1", sim_vc1), sim_target("vc2", sim_vc1)], {})
    with pytest.raises(errors.NotFound, match="vc1, vc2"):
        scheduler.target("vc9")
    assert [t.name for t in scheduler.targets] == ["vc1", "vc2"]
    with pytest.raises(errors.NotFound):
        run_with(scheduler, lambda: scheduler.run("vc9", now))


def test_missing_credentials_fail_only_that_target(sim_vc1: Simulator) -> None:
    good, bare = sim_target("vc1", sim_vc1), sim_target("bare", sim_vc1)
    scheduler = Scheduler([good, bare], credentials_env({"vc1": sim_vc1}))

    async def main() -> None:
        with pytest.raises(errors.ConfigError, match=f"{bare.credential_env_prefix}_PASSWORD"):
            await scheduler.run("bare", now)
        assert await scheduler.run("vc1", now) is not None

    run_with(scheduler, main)


def test_calls_run_in_arrival_order_with_one_slot(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(method_delay={"CurrentTime": 20})
    scheduler = Scheduler([sim_target("vc", sim, pool_size=1)], credentials_env({"vc": sim}))
    gate = threading.Event()
    order: list[int] = []

    def call(index: int) -> Callable[[VSphereSession], Any]:
        def fn(session: VSphereSession) -> Any:
            if index == 0:
                assert gate.wait(10), "the test never opened the gate"
            order.append(index)
            return session.si.CurrentTime()
        return fn

    async def main() -> None:
        tasks = [asyncio.create_task(scheduler.run("vc", call(i))) for i in range(8)]
        await until(lambda: scheduler.stats()["vc"]["queued"] == 7)
        stats = scheduler.stats()["vc"]
        assert stats["running"] == 1 and stats["slots"] == 1
        gate.set()
        await asyncio.gather(*tasks)
        assert order == list(range(8))
        after = scheduler.stats()["vc"]
        assert after["queued"] == 0 and after["running"] == 0 and after["sessions"] == 1

    run_with(scheduler, main)


def test_queue_timeout_names_the_target_and_frees_the_queue(sim_vc1: Simulator) -> None:
    scheduler = Scheduler([sim_target("vc1", sim_vc1, pool_size=1)], credentials_env({"vc1": sim_vc1}),
                          queue_timeout=0.2)
    gate = threading.Event()

    def blocker(session: VSphereSession) -> str:
        assert gate.wait(10)
        return "done"

    async def main() -> None:
        first = asyncio.create_task(scheduler.run("vc1", blocker))
        await until(lambda: scheduler.stats()["vc1"]["running"] == 1)
        with pytest.raises(errors.QueueTimeout) as caught:
            await scheduler.run("vc1", now)
        assert "target 'vc1'" in caught.value.message and caught.value.details["target"] == "vc1"
        assert scheduler.stats()["vc1"]["queued"] == 0
        gate.set()
        assert await first == "done"
        assert await scheduler.run("vc1", now) is not None  # the slot was not leaked

    run_with(scheduler, main)


def test_cancelled_waiter_leaves_no_trace(sim_vc1: Simulator) -> None:
    scheduler = Scheduler([sim_target("vc1", sim_vc1, pool_size=1)], credentials_env({"vc1": sim_vc1}))
    gate = threading.Event()

    async def main() -> None:
        first = asyncio.create_task(scheduler.run("vc1", lambda s: gate.wait(10)))
        await until(lambda: scheduler.stats()["vc1"]["running"] == 1)
        waiting = asyncio.create_task(scheduler.run("vc1", now))
        await until(lambda: scheduler.stats()["vc1"]["queued"] == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert scheduler.stats()["vc1"]["queued"] == 0
        gate.set()
        assert await first is True
        assert await scheduler.run("vc1", now) is not None
        await until(lambda: scheduler.stats()["vc1"]["running"] == 0)

    run_with(scheduler, main)


def test_hung_target_hits_its_deadline_without_holding_up_a_healthy_one(
    sim_vc1: Simulator, silent_port: int
) -> None:
    hung = local_target("hung", silent_port, pool_size=1, timeout_seconds=4)
    env = {**credentials_env({"vc1": sim_vc1}), "SIM_HUNG_USER": "u", "SIM_HUNG_PASSWORD": "p"}
    scheduler = Scheduler([hung, sim_target("vc1", sim_vc1)], env)

    async def main() -> None:
        stuck = asyncio.create_task(scheduler.run("hung", now, deadline=2))
        await until(lambda: scheduler.stats()["hung"]["running"] == 1)
        for _ in range(3):
            assert await scheduler.run("vc1", now) is not None
        assert not stuck.done()
        with pytest.raises(errors.Timeout) as caught:
            await stuck
        assert "target 'hung'" in caught.value.message and "deadline" in caught.value.message
        # The worker thread is still stuck in the handshake: it keeps the hung target's only slot.
        assert scheduler.stats()["hung"]["running"] == 1
        assert scheduler.stats()["vc1"]["running"] == 0

    run_with(scheduler, main)


def test_fan_out_returns_partial_results(sim_vc1: Simulator, make_simulator: MakeSimulator) -> None:
    slow = make_simulator(method_delay={"CurrentTime": 3000})
    targets = [sim_target("vc1", sim_vc1), local_target("down", closed_port()), sim_target("slow", slow)]
    env = {**credentials_env({"vc1": sim_vc1, "slow": slow}), "SIM_DOWN_USER": "u", "SIM_DOWN_PASSWORD": "p"}
    scheduler = Scheduler(targets, env)

    async def main() -> dict[str, dict[str, Any]]:
        return await scheduler.fan_out(["vc1", "down", "slow", "vc1"], lambda s: s.content.about.apiType,
                                       deadline=30)

    async def slow_main() -> dict[str, dict[str, Any]]:
        return await scheduler.fan_out(["vc1", "down", "slow"], now, deadline=1.0)

    results = asyncio.run(main())
    assert list(results) == ["vc1", "down", "slow"]
    assert results["vc1"] == {"ok": "VirtualCenter"} and results["slow"] == {"ok": "VirtualCenter"}
    assert results["down"]["error"]["code"] == "unreachable"

    results = run_with(scheduler, slow_main)
    assert "ok" in results["vc1"]
    assert results["down"]["error"]["code"] == "unreachable"
    assert results["slow"]["error"]["code"] == "timeout"
    assert "target 'slow'" in results["slow"]["error"]["message"]


def test_fan_out_rejects_unknown_names_before_running(sim_vc1: Simulator) -> None:
    scheduler = Scheduler([sim_target("vc1", sim_vc1)], credentials_env({"vc1": sim_vc1}))
    with pytest.raises(errors.NotFound):
        run_with(scheduler, lambda: scheduler.fan_out(["vc1", "nope"], now, deadline=5))
    assert scheduler.stats()["vc1"]["logins"] == 0


def test_event_loop_stays_responsive_during_a_slow_call(make_simulator: MakeSimulator) -> None:
    sim = make_simulator(method_delay={"CurrentTime": 400})
    scheduler = Scheduler([sim_target("vc", sim)], credentials_env({"vc": sim}))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ticks = 0
        probes = 0

        async def probe() -> None:
            nonlocal probes
            probes += 1

        def slow(session: VSphereSession) -> Any:
            # A round trip through the loop from inside the worker: it deadlocks if the loop is blocked.
            asyncio.run_coroutine_threadsafe(probe(), loop).result(timeout=10)
            return session.si.CurrentTime()

        call = asyncio.create_task(scheduler.run("vc", slow))
        while not call.done():
            ticks += 1
            await asyncio.sleep(0.01)
        assert await call is not None
        assert probes == 1 and ticks >= 2

    run_with(scheduler, main)


def test_close_refuses_new_calls_and_logs_out(sim_vc1: Simulator) -> None:
    scheduler = Scheduler([sim_target("vc1", sim_vc1)], credentials_env({"vc1": sim_vc1}))

    async def main() -> None:
        await scheduler.run("vc1", now)
        assert scheduler.stats()["vc1"]["sessions"] == 1
        scheduler.close()
        assert scheduler.stats()["vc1"]["sessions"] == 0
        with pytest.raises(errors.Unreachable, match="shutting down"):
            await scheduler.run("vc1", now)

    asyncio.run(main())
