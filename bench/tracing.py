"""The latency tracing adds per call, on and off, in one run.

Plain script: ``python bench/tracing.py [--calls 300] [--vms 20]``. One simulator, a local OTLP/HTTP
receiver (a thread of this script that takes ``POST /v1/traces`` and counts requests and bytes), and two
``gateway serve --transport https`` child processes on the same simulator that differ only in their
environment: one with no OTEL_* (the no-op tracer), one with ``OTEL_TRACES_EXPORTER=otlp`` exporting to
the receiver. Calls alternate between the two, one MCP client each (the SDK's, 2025-11-25): ``list_vms``
on a target with ``mirror: off`` (a sweep: authentication, decisions, queue wait, audit append and the
vSphere round trips, each a span) and ``list_targets`` (no vSphere). Medians and p90 per call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH.parent / "tests")]

import mirror as mirror_bench  # noqa: E402  (serve, a child gateway over HTTPS)
from mcp import Client  # noqa: E402
from support.simulator import build_simulator, start_simulator  # type: ignore[import-not-found]  # noqa: E402


class Receiver:
    """A local OTLP/HTTP traces receiver: answers 200 to every export and counts what arrived."""

    def __init__(self) -> None:
        counts = self.counts = {"requests": 0, "bytes": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                counts["requests"] += 1
                counts["bytes"] += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def timed(client: Client, tool: str, args: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = await client.call_tool(tool, args)
    elapsed = time.perf_counter() - started
    if result.is_error:
        raise SystemExit(f"{tool} failed: {result.content}")
    return elapsed


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(off: mirror_bench.Served, on: mirror_bench.Served, calls: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    async with off.client() as quiet, on.client() as traced:
        clients = {"off": quiet, "on": traced}
        for tool, args in (("list_vms", {"target": "sweep"}), ("list_targets", {})):
            for name, client in clients.items():  # warm-up: logins, first sweeps
                for _ in range(5):
                    await timed(client, tool, args)
                samples[f"{tool} {name}"] = []
            for index in range(calls):
                order = ("off", "on") if index % 2 == 0 else ("on", "off")
                for name in order:
                    samples[f"{tool} {name}"].append(await timed(clients[name], tool, args))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per tool and side")
    parser.add_argument("--vms", type=int, default=20, help="VMs per host in the simulator")
    options = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tracing-")))
        sim = start_simulator(binary=build_simulator(), vms=options.vms)
        stack.callback(sim.stop)
        receiver = Receiver()
        stack.callback(receiver.close)
        (tmp / "off").mkdir()
        (tmp / "on").mkdir()
        off = mirror_bench.serve(stack, tmp / "off", sim, {"sweep": sim.port})
        on = mirror_bench.serve(stack, tmp / "on", sim, {"sweep": sim.port}, extra_env={
            "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "bench-gateway", "OTEL_BSP_SCHEDULE_DELAY": "500"})
        samples = asyncio.run(measure(off, on, options.calls))
        deadline = time.monotonic() + 10
        while receiver.counts["requests"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
    print(f"tracing overhead per call ({options.calls} calls per row, alternating; "
          f"python bench/tracing.py --calls {options.calls} --vms {options.vms})")
    print(f"{'row':<22} {'p50 ms':>8} {'p90 ms':>8}")
    for name, values in samples.items():
        print(f"{name:<22} {statistics.median(values) * 1000:8.2f} {p(values, 0.9) * 1000:8.2f}")
    for tool in ("list_vms", "list_targets"):
        off_p50 = statistics.median(samples[f"{tool} off"])
        on_p50 = statistics.median(samples[f"{tool} on"])
        print(f"{tool}: tracing on adds {(on_p50 - off_p50) * 1000:+.2f} ms per call at p50 "
              f"({on_p50 / off_p50:.2f}x)")
    print(f"OTLP receiver: {receiver.counts['requests']} export requests, {receiver.counts['bytes']} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
