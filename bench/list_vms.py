"""list_vms at scale: the gateway's read against a bare RetrievePropertiesEx floor, side by side.

Plain script: ``python bench/list_vms.py [--vms 3000] [--runs 7] [--no-stdio]``. Starts one simulator
(deploy/vcsim, through tests/simulator.py) holding about ``--vms`` VMs, then times, median of ``--runs``:

(a) floor      one bare pyVmomi ``RetrievePropertiesEx`` of name + runtime.powerState over a ContainerView
               (view created and destroyed inside the timing, as the gateway does)
(b) in-process the gateway's list_vms read function with its default columns, through ``SessionPool.run``
(c) stdio      list_vms end to end: ``gateway serve --transport stdio`` driven by the MCP SDK's client
               (audit, sanitising and JSON framing included); see ``measure_stdio``

and prints each with its ratio to (a). The target for (b) is at most 1.3x the floor. (a) and (b) use
the same session pool, so login and connection set-up are outside every timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from pyVmomi import vim, vmodl  # noqa: E402
from simulator import (  # type: ignore[import-not-found]  # noqa: E402  (tests/ is on the path above)
    Simulator,
    build_simulator,
    credential_prefix,
    start_simulator,
    write_targets,
)

from gateway.config import Credentials, Target  # noqa: E402
from gateway.tools.read import READ_TOOLS  # noqa: E402
from gateway.vsphere.pool import SessionPool, VSphereSession  # noqa: E402

TARGET_RATIO = 1.3
_PC: Any = vmodl.query.PropertyCollector


def floor(session: VSphereSession) -> int:
    """(a): name and power state of every VM in one RetrievePropertiesEx, decoded by pyVmomi."""
    content: Any = session.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
    try:
        traverse = _PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
        spec = _PC.FilterSpec(
            objectSet=[_PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
            propSet=[_PC.PropertySpec(type=vim.VirtualMachine, pathSet=["name", "runtime.powerState"])])
        result = content.propertyCollector.RetrievePropertiesEx([spec], _PC.RetrieveOptions())
        return len(result.objects)
    finally:
        view.DestroyView()


_LIST_VMS = next(spec for spec in READ_TOOLS if spec.name == "list_vms")


def in_process(session: VSphereSession) -> int:
    """(b): the list_vms tool's read function, default columns, as the pipeline calls it per target."""
    assert _LIST_VMS.read is not None
    result = _LIST_VMS.read(session, _LIST_VMS.validate({"target": session.target.name}))
    return int(result["count"])


def timed(fn: Callable[[], int], runs: int) -> tuple[float, int]:
    """Median seconds of ``runs`` calls (after one warm-up call) and the count the last call returned."""
    count = fn()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        count = fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), count


# ------------------------------------------------------------------------------------------------------
# (c) end to end over stdio MCP. HOOK: replace or extend this function to measure another transport;
# it returns the median seconds of one list_vms tools/call, or None when it could not run.


def measure_stdio(sim: Simulator, runs: int) -> float | None:
    """Median seconds of list_vms over ``gateway serve --transport stdio`` (server start not timed)."""
    try:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters
    except ImportError as exc:  # pragma: no cover - the SDK is a dependency; be explicit if it is missing
        print(f"(c) skipped: the MCP SDK is not importable ({exc})")
        return None
    with tempfile.TemporaryDirectory(prefix="bench-list-vms-") as tmp:
        env = write_targets(Path(tmp) / "targets.yaml", {"bench": sim})
        env.update({"GATEWAY_HOME": str(Path(tmp) / "home"), "PATH": os.environ.get("PATH", ""),
                    "GATEWAY_TARGETS_FILE": str(Path(tmp) / "targets.yaml"), "PYTHONPATH": str(REPO)})
        main_call = "from gateway.cli import main; raise SystemExit(main())"
        command = ["-c", main_call, "serve", "--transport", "stdio"]
        params = StdioServerParameters(command=sys.executable, args=command, env=env, cwd=str(REPO))

        async def run() -> float:
            async with Client(params, mode="legacy") as client:
                samples = []
                for attempt in range(runs + 1):  # the first call logs in and warms up: not counted
                    started = time.perf_counter()
                    result = await client.call_tool("list_vms", {"target": "bench"})
                    if result.is_error:
                        said = json.dumps(str(result.content))[:300]
                        raise RuntimeError(f"list_vms failed over stdio: {said}")
                    if attempt:
                        samples.append(time.perf_counter() - started)
                return statistics.median(samples)

        try:
            return asyncio.run(run())
        except Exception as exc:  # report and carry on: (a) and (b) still stand
            print(f"(c) failed: {type(exc).__name__}: {exc}")
            return None


# ------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=3000, help="about this many VMs (rounded down to even)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per measurement (median)")
    parser.add_argument("--no-stdio", action="store_true", help="skip (c), the end-to-end stdio measurement")
    args = parser.parse_args(argv)

    binary = build_simulator()
    per_pool = max(1, args.vms // 2)  # one cluster root pool and one standalone host
    started = time.perf_counter()
    sim = start_simulator(binary=binary, clusters=1, hosts_per_cluster=3, standalone_hosts=1, vms=per_pool,
                          startup_timeout=300)
    print(f"simulator with {2 * per_pool} VMs up in {time.perf_counter() - started:.1f}s")
    target = Target(name="bench", host=sim.host, port=sim.port, insecure=True, timeout_seconds=300,
                    credential_env_prefix=credential_prefix("bench"))
    pool = SessionPool(target, Credentials(sim.user, sim.password))
    try:
        base, base_count = timed(lambda: pool.run(floor), args.runs)
        ours, our_count = timed(lambda: pool.run(in_process), args.runs)
        if base_count != our_count:
            raise SystemExit(f"the floor saw {base_count} VMs but list_vms returned {our_count}")
        print(f"VMs: {our_count}, runs: {args.runs} (median)")
        print(f"(a) floor, bare RetrievePropertiesEx    {base * 1000:8.1f} ms   1.00x")
        verdict = "within" if ours / base <= TARGET_RATIO else "OVER"
        print(f"(b) list_vms in-process                 {ours * 1000:8.1f} ms   {ours / base:.2f}x "
              f"({verdict} the {TARGET_RATIO}x target)")
        stdio = None if args.no_stdio else measure_stdio(sim, args.runs)
        if stdio is not None:
            print(f"(c) list_vms over stdio MCP             {stdio * 1000:8.1f} ms   {stdio / base:.2f}x")
    finally:
        pool.close()
        sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
