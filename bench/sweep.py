"""The read that cannot use the mirror: list_vms sweeping against the raw round trip, before and after.

Plain script: ``python bench/sweep.py [--scale 3000,30000] [--runs 7] [--before 0550c12]``;
``bench/run_all.py`` runs the same rows. For each size it starts one simulator and two
``gateway serve --transport https`` (child processes), each with one target on that simulator with
``mirror: off``: one runs this checkout, the other the package as it was at ``--before`` (extracted
with ``git archive`` into a temporary folder). Timed, rounds interleaved (the order rotating), medians:

raw floor       the exact retrieval the gateway makes for list_vms (its property set over a ContainerView,
                pages of ``collector.PAGE_OBJECTS``): RetrievePropertiesEx, then ContinueRetrievePropertiesEx
                with each page's token until none is left, sent through pyVmomi's stub one after the
                other, the replies' bytes read, nothing decoded. The view is the session's kept one (made
                by the warm-up call), as the gateway's sessions keep theirs (``gateway.vsphere.views``):
                the floor is the RetrievePropertiesEx round trip alone
raw, one reply  the same RetrievePropertiesEx without maxObjects, answered in one reply (the simulator
                honours maxObjects as vCenter does, so this is the floor of a client that does not page)
before / after  list_vms over HTTPS (MCP SDK client, TLS, bearer token) on the ``mirror: off`` target of
                the server running the ``--before`` package / this checkout
decode          the last one-reply raw reply decoded in this process by ``soap_scan.parse_retrieve_result``
                of each version (the decode alone, whole, no network; thread CPU time, so other load
                on the machine does not count; the gateway now decodes each page while the simulator
                computes the next, so only the last page's decode follows the retrieval)

Before each timed call the simulator runs a full garbage collection (its control endpoint's ``/gc``,
untimed): it shares the machine's cores with the gateway, and the garbage of one call (35 MB of XML at
30,000 VMs) would otherwise be collected during the next one, whichever column that is.

Beside the wall-clock rows, the CPU time each server process spent per list_vms (``/proc/PID/stat``,
user + system, median over the rounds): what the gateway itself costs for the call, which other
processes on a shared machine do not change much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH), str(REPO / "tests")]

import mirror as mirror_bench  # noqa: E402
from support.simulator import build_simulator, start_simulator  # type: ignore[import-not-found]  # noqa: E402

from gateway.config import Credentials, Target  # noqa: E402
from gateway.vsphere import soap_scan  # noqa: E402
from gateway.vsphere.collector import PAGE_OBJECTS, continuation_token, soap_call  # noqa: E402
from gateway.vsphere.pool import SessionPool, VSphereSession  # noqa: E402

BEFORE = "0550c12"
"""The commit before the decoder was rewritten (the regular-expression scanner, the reply read whole)."""


def checkout(ref: str, into: Path) -> Path:
    """The ``gateway`` package as it was at ``ref``, extracted under ``into`` (which is returned)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "gateway"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_decoder(tree: Path) -> ModuleType:
    """``soap_scan`` of another tree, loaded under its own name (it imports only the standard library)."""
    spec = importlib.util.spec_from_file_location("soap_scan_before", tree / "gateway/vsphere/soap_scan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    spec.loader.exec_module(module)
    return module


@dataclass
class SizeResult:
    vms: int
    reply_bytes: int
    medians: dict[str, float]


def measure(size: int, runs: int, before: str) -> SizeResult:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sweep-")))
        old_tree = checkout(before, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="old-"))))
        old_decoder = load_decoder(old_tree)
        started = time.perf_counter()
        sim = start_simulator(binary=build_simulator(), hosts_per_cluster=3, standalone_hosts=1,
                              vms=max(1, size // 2), startup_timeout=3600)
        stack.callback(sim.stop)
        print(f"{size} VMs: simulator up in {time.perf_counter() - started:.0f}s", flush=True)
        (tmp / "after").mkdir()
        (tmp / "before").mkdir()
        after = mirror_bench.serve(stack, tmp / "after", sim, {"sweep": sim.port})
        old = mirror_bench.serve(stack, tmp / "before", sim, {"sweep": sim.port}, repo=old_tree)
        target = Target(name="floor", host=sim.host, port=sim.port, insecure=True, timeout_seconds=600,
                        credential_env_prefix="FLOOR")
        pool = SessionPool(target, Credentials(sim.user, sim.password))
        stack.callback(pool.close)
        last: list[bytes] = []

        def raw(session: VSphereSession) -> int:
            view = mirror_bench.kept_view(session)
            body = soap_call(session.si._stub, session.content.propertyCollector, "RetrievePropertiesEx",
                             [[mirror_bench._list_vms_spec(view)], mirror_bench._PC.RetrieveOptions()])
            last[:] = [body]
            return len(body)

        def raw_paged(session: VSphereSession) -> int:
            stub, collector = session.si._stub, session.content.propertyCollector
            options = mirror_bench._PC.RetrieveOptions(maxObjects=PAGE_OBJECTS)
            spec = mirror_bench._list_vms_spec(mirror_bench.kept_view(session))
            body = soap_call(stub, collector, "RetrievePropertiesEx", [[spec], options])
            size = len(body)
            while token := continuation_token(body):
                body = soap_call(stub, collector, "ContinueRetrievePropertiesEx", [token])
                size += len(body)
            return size

        def decode(module: Any) -> Callable[[], float]:
            def run() -> float:
                started = time.thread_time()
                module.parse_retrieve_result(last[0])
                return time.thread_time() - started
            return run

        cpu: dict[str, list[float]] = {"before": [], "after": []}

        async def rows() -> dict[str, float]:
            async with after.client() as new_client, old.client() as old_client:
                def over_https(client: Any, server: mirror_bench.Served, name: str) -> Callable[[], float]:
                    def call() -> float:
                        used = cpu_seconds(server.process.pid)
                        elapsed = asyncio.run_coroutine_threadsafe(
                            mirror_bench.list_vms(client, "sweep"), loop).result()
                        cpu[name].append(cpu_seconds(server.process.pid) - used)
                        return elapsed
                    return call

                columns = {
                    "raw floor": lambda: pool.run(raw_paged),
                    "raw one reply": lambda: pool.run(raw),
                    "before": over_https(old_client, old, "before"),
                    "after": over_https(new_client, after, "after"),
                    "decode before": decode(old_decoder),
                    "decode after": decode(soap_scan),
                }
                return await asyncio.to_thread(mirror_bench.interleaved, columns, runs,
                                               lambda: sim.control("/gc"))

        loop = asyncio.new_event_loop()
        try:
            medians = loop.run_until_complete(rows())
        finally:
            loop.close()
        medians.update({f"cpu {name}": statistics.median(samples) for name, samples in cpu.items()})
        return SizeResult(size, len(last[0]), medians)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def rows(results: list[SizeResult], before_ref: str) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for r in results:
        label = f"list_vms sweeping, {r.vms:,} VMs:"
        raw = r.medians["raw floor"]
        reply = f"{r.reply_bytes / 1e6:,.2f} MB reply"
        out.append((f"{label} raw RetrievePropertiesEx in pages of {PAGE_OBJECTS}, bytes read only (floor)",
                    ms(raw), "1.00x"))
        one_reply = f"raw RetrievePropertiesEx in one reply, bytes read only ({reply})"
        for what, key in ((one_reply, "raw one reply"),
                          (f"over HTTPS, mirror: off, before ({before_ref})", "before"),
                          ("over HTTPS, mirror: off, now", "after"),
                          (f"decode alone, in-process, before ({before_ref})", "decode before"),
                          ("decode alone, in-process, now", "decode after")):
            out.append((f"{label} {what}", ms(r.medians[key]), f"{r.medians[key] / raw:.2f}x"))
        before = r.medians["cpu before"]
        for what, key in ((f"gateway CPU per call, before ({before_ref})", "cpu before"),
                          ("gateway CPU per call, now", "cpu after")):
            out.append((f"{label} {what}", ms(r.medians[key]), f"{r.medians[key] / before:.2f}x"))
    return out


def run(scale: list[int], runs: int, before: str = BEFORE) -> list[tuple[str, str, str]]:
    results = []
    for size in scale:
        try:
            results.append(measure(size, runs, before))
        except (SystemExit, TimeoutError, Exception) as exc:  # report what this machine allowed
            print(f"{size} VMs: not measured ({type(exc).__name__}: {exc})", flush=True)
            note = (f"list_vms sweeping, {size:,} VMs: not measured on this machine", type(exc).__name__, "")
            return [*rows(results, before), note]
    return rows(results, before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="3000,30000", help="comma-separated VM counts")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--before", default=BEFORE, help="the git commit measured as 'before'")
    args = parser.parse_args(argv)
    table = run([int(n) for n in args.scale.split(",") if n], args.runs, args.before)
    print(f"\n{datetime.now():%Y-%m-%d %H:%M} `python bench/sweep.py {' '.join(argv or sys.argv[1:])}`\n")
    print("| what | value | ratio |\n| --- | --- | --- |")
    for what, value, ratio in table:
        print(f"| {what} | {value} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
