"""What the guard layer costs per call, measured side by side against the same call without it.

Plain script: ``python bench/guard_overhead.py [--calls 300]``. Starts one simulator and builds a real
gateway over it (policy file, audit file with durable appends, state store, roles), then alternates:

(a) bare   the tool's own handler through the same scheduler slot and session pool (no guard)
(b) guard  ``Calls.call`` for the same tool and arguments: role check, validation, breaker, rate
           limit, policy decision, sanitising, audit row (fsync'd)

for a read (``get_vm_details``) and a write (``power_off_vm`` / ``power_on_vm`` in turn), and prints
medians, the added microseconds and the ratio. Interleaving the two keeps machine noise common to both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import yaml  # noqa: E402
from support.simulator import build_simulator, start_simulator, write_targets  # type: ignore[import-not-found]  # noqa: E402

from gateway.auth.tokens import Principal  # noqa: E402
from gateway.guard.limits import RunawayBreaker  # noqa: E402
from gateway.server.runtime import Gateway  # noqa: E402
from gateway.settings import Settings  # noqa: E402

CALLER = Principal(name="bench", role="admin", surface="bench")
VM = "DC0_C0_RP0_VM0"


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def compare(
    label: str, bare: Callable[[int], Awaitable[Any]], guarded: Callable[[int], Awaitable[Any]], calls: int
) -> dict[str, Any]:
    a: list[float] = []
    b: list[float] = []
    for i in range(calls):
        a.append(await timed(lambda i=i: bare(i)))  # type: ignore[misc]
        b.append(await timed(lambda i=i: guarded(i)))  # type: ignore[misc]
    ma, mb = statistics.median(a), statistics.median(b)
    return {
        "call": label,
        "bare_ms": ma * 1e3,
        "guarded_ms": mb * 1e3,
        "added_us": (mb - ma) * 1e6,
        "ratio": mb / ma,
    }


async def main(calls: int) -> list[dict[str, Any]]:
    sim = start_simulator(binary=build_simulator(), vms=2)
    tmp = Path(tempfile.mkdtemp(prefix="guard-bench-"))
    try:
        env = write_targets(tmp / "targets.yaml", {"vc1": sim})
        (tmp / "rules.yaml").write_text(
            yaml.safe_dump({"defaults": {"write": "allow", "max_calls_per_minute": {"write": 100_000}},
                            "protected": [], "rules": [], "targets": {}, "maintenance_windows": []})
        )
        gw = Gateway.build(Settings.from_env({"GATEWAY_HOME": str(tmp), **env}))
        # alternating identical writes are the benchmark, not a runaway: give the breaker a wide budget
        gw.path.writes.breaker = RunawayBreaker(max_repeats=10**9)
        details = gw.registry.get("get_vm_details")
        assert details is not None and details.read is not None
        read_fn = details.read
        read_args = {"target": "vc1", "vm": VM}

        async def bare_read(_: int) -> Any:
            return await gw.scheduler.run("vc1", lambda s: read_fn(s, read_args))

        async def guarded_read(_: int) -> Any:
            return await gw.calls.call(CALLER, "get_vm_details", read_args)

        ops = ("power_off_vm", "power_on_vm")

        async def bare_write(i: int) -> Any:
            spec = gw.registry.get(ops[i % 2])
            assert spec is not None and spec.plan is not None and spec.execute is not None
            plan_fn, execute = spec.plan, spec.execute
            args = spec.validate(
                {"target": "vc1", "vm": VM, **({"guest_timeout_seconds": 0} if i % 2 == 0 else {})}
            )
            return await gw.scheduler.run("vc1", lambda s: execute(s, plan_fn(s, args), lambda f, m: None))

        async def guarded_write(i: int) -> Any:
            extra = {"guest_timeout_seconds": 0} if i % 2 == 0 else {}
            return await gw.calls.call(CALLER, ops[i % 2], {"target": "vc1", "vm": VM, **extra})

        # each write pair must leave the VM as it found it: bare off/on, then guarded off/on
        async def bare_pair(i: int) -> None:
            await bare_write(0)
            await bare_write(1)

        async def guarded_pair(i: int) -> None:
            await guarded_write(0)
            await guarded_write(1)

        await guarded_read(0)
        rows = [
            await compare("get_vm_details (read)", bare_read, guarded_read, calls),
            await compare("power off + on (2 writes)", bare_pair, guarded_pair, max(10, calls // 10)),
        ]
        await gw.close()
        return rows
    finally:
        sim.stop()


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["| call | bare (ms) | guarded (ms) | added (µs) | ratio |", "| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {r['call']} | {r['bare_ms']:.2f} | {r['guarded_ms']:.2f} | {r['added_us']:.0f} | "
        f"{r['ratio']:.2f}x |"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    print(render(asyncio.run(main(parser.parse_args().calls))))
