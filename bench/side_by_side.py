"""Two builds side by side in one run: list_vms at ``--vms`` (mirror fresh, mirror with max_staleness,
sweeping; ratios to each side's raw floor) and get_vm_details p50 over HTTPS against bare pyVmomi.

    python bench/side_by_side.py --old-src DIR --old-vcsim BIN [--vms 3000] [--runs 7] [--small 50]

``--old-src`` is a source tree of the other build (``git archive main | tar -x -C DIR``) and
``--old-vcsim`` its launcher binary (``deploy/vcsim/build.sh`` run in a copy of its deploy/vcsim);
the new side is this checkout with deploy/vcsim/bin/vcsim-gw. Each side gets its own simulator and
``gateway serve --transport https`` (bench/mirror.py's ``serve``), rounds interleaved between sides.
The get_vm_details row compares only at a small ``--vms`` (say 4): its bare pyVmomi floor finds the VM
by decoding every VM's name, which at thousands of VMs costs more than the gateway's whole call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(BENCH.parent / "tests")]

import floors  # noqa: E402
import mirror as mb  # noqa: E402
import run_all  # noqa: E402
from support.simulator import build_simulator, open_pool, start_simulator  # type: ignore[import-not-found]  # noqa: E402

VM = "DC0_C0_RP0_VM0"
TARGETS = ("mirror", "stale", "sweep")


def ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def measure(  # noqa: C901 - a linear script of timed loops over both sides
    sides: dict[str, tuple[Any, Any, Any]], runs: int, small: int
) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}

    def timed(key: tuple[str, str], started: float) -> None:
        out.setdefault(key, []).append(time.perf_counter() - started)

    async with contextlib.AsyncExitStack() as stack:
        clients = {side: await stack.enter_async_context(parts[1].client()) for side, parts in sides.items()}
        for side, client in clients.items():
            for target in TARGETS:
                await client.call_tool("list_vms", {"target": target})
            for target in ("mirror", "stale"):
                sides[side][1].wait_synced(target, 600)
        for _ in range(runs):
            for side, client in clients.items():
                pool = sides[side][2]
                started = time.perf_counter()
                pool.run(lambda session: mb._with_view(session, mb.raw_floor))
                timed((side, "floor"), started)
                for target in TARGETS:
                    started = time.perf_counter()
                    result = await client.call_tool("list_vms", {"target": target})
                    timed((side, target), started)
                    if result.is_error:
                        raise SystemExit(f"{side}: list_vms on {target} failed: {result.content}")
        for _ in range(4):
            for side, client in clients.items():
                pool = sides[side][2]
                for _ in range(small):
                    started = time.perf_counter()
                    pool.run(lambda session: floors.vm_details(session, VM))
                    timed((side, "details floor"), started)
                for _ in range(small):
                    started = time.perf_counter()
                    result = await client.call_tool("get_vm_details", {"target": "sweep", "vm": VM})
                    timed((side, "details"), started)
                    if result.is_error:
                        raise SystemExit(f"{side}: get_vm_details failed: {result.content}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", type=Path, required=True)
    parser.add_argument("--old-vcsim", type=Path, required=True)
    parser.add_argument("--vms", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--small", type=int, default=50, help="get_vm_details calls per side per round")
    args = parser.parse_args(argv)
    run_all.VM = VM
    builds = {"old": (args.old_src, args.old_vcsim), "new": (BENCH.parent, build_simulator())}
    with contextlib.ExitStack() as stack:
        sides = {}
        for side, (src, binary) in builds.items():
            sim = start_simulator(binary=Path(binary), hosts_per_cluster=3, standalone_hosts=1,
                                  vms=max(1, args.vms // 2), startup_timeout=3600)
            stack.callback(sim.stop)
            mb.REPO = Path(src)  # the child gateway runs from this tree
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sbs-")))
            served = mb.serve(stack, tmp, sim, {name: sim.port for name in TARGETS})
            pool = open_pool(side, sim)
            stack.callback(pool.close)
            sides[side] = (sim, served, pool)
        out = asyncio.run(measure(sides, args.runs, args.small))
    print(f"\n`python bench/side_by_side.py {' '.join(argv or sys.argv[1:])}`\n")
    print("| side | what | value | ratio |\n| --- | --- | --- | --- |")
    for side in builds:
        floor = ms(out[(side, "floor")])
        print(f"| {side} | list_vms, {args.vms:,} VMs: raw floor | {floor:.1f} ms | 1.00x |")
        for target, label in zip(TARGETS, ("mirror, fresh", "mirror, max_staleness_seconds", "sweeping"),
                                 strict=True):
            value = ms(out[(side, target)])
            print(f"| {side} | list_vms over HTTPS, {label} | {value:.1f} ms | {value / floor:.2f}x |")
        base, ours = ms(out[(side, "details floor")]), ms(out[(side, "details")])
        print(f"| {side} | get_vm_details p50: bare pyVmomi / over HTTPS | {base:.2f} / {ours:.2f} ms | "
              f"adds {ours - base:.2f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
