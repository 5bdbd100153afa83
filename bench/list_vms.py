"""list_vms at scale: the gateway against a bare RetrievePropertiesEx floor, side by side.

Plain script: ``python bench/list_vms.py [--vms 3000] [--runs 9] [--no-stdio] [--no-https]``. Starts one
simulator (deploy/vcsim, through tests/support/simulator.py) holding about ``--vms`` VMs, then times:

(a) floor      one bare pyVmomi ``RetrievePropertiesEx`` of name + runtime.powerState over a ContainerView
               (view created and destroyed inside the timing, as the gateway does)
(b) in-process the gateway's list_vms read function with its default columns, through ``SessionPool.run``
(c) stdio      list_vms end to end: ``gateway serve --transport stdio`` (a child process) driven by the MCP
               SDK's client (audit, sanitising and JSON-RPC framing included)
(d) https      list_vms end to end: ``gateway serve --transport https`` (a child process: uvicorn, TLS,
               bearer token) driven by the SDK's streamable HTTP client in the 2025-11-25 (legacy)
               protocol, with the client's default limits

Every column is measured once per round, rounds interleaved (the order rotates), so that the load of
the machine at any moment weighs on all of them alike; it prints the median of ``--runs`` rounds per
column and its ratio to (a). Targets: (b) <= 1.3x, (c) <= 2.0x, (d) <= 1.5x. (a) and (b) share one
session pool and the servers are started and warmed up before the rounds, so logins and connection
set-up are outside every timing. When the SDK client refuses the answer over HTTPS (an event stream
over its 1 MiB event limit), (d) says so and is measured with that limit lifted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from pyVmomi import vim, vmodl  # noqa: E402
from support.simulator import (  # type: ignore[import-not-found]  # noqa: E402  (tests/ is on the path above)
    Simulator,
    build_simulator,
    credential_prefix,
    start_simulator,
    write_targets,
)

from gateway.auth.tokens import create_token  # noqa: E402
from gateway.config import Credentials, Target  # noqa: E402
from gateway.server.edge.tls import create_certificate  # noqa: E402
from gateway.store.sqlite import SqliteStore  # noqa: E402
from gateway.tools.read import READ_TOOLS  # noqa: E402
from gateway.vsphere.pool import SessionPool, VSphereSession  # noqa: E402

TARGETS = {"b": 1.3, "c": 2.0, "d": 1.5}
TARGET_RATIO = TARGETS["b"]
GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"  # the `gateway` command
TARGET_NAME = "bench"
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
# The gateway as a child process, driven by the SDK's client


@dataclass
class Home:
    """A throw-away gateway home: targets.yaml for the simulator and the environment to run with it."""

    path: Path
    env: dict[str, str]

    @classmethod
    def create(cls, tmp: Path, sim: Simulator) -> Home:
        # mirror: off: these rows measure the sweeping path (bench/mirror.py measures the mirror)
        env = write_targets(tmp / "targets.yaml", {TARGET_NAME: sim}, {TARGET_NAME: {"mirror": "off"}})
        env.update({"GATEWAY_HOME": str(tmp / "home"), "PATH": os.environ.get("PATH", ""),
                    "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml"), "PYTHONPATH": str(REPO)})
        (tmp / "home").mkdir(mode=0o700, exist_ok=True)
        return cls(tmp, env)


async def call_list_vms(client: Client) -> int:
    """One list_vms call with the default columns; its VM count. Raises on an error result."""
    result = await client.call_tool("list_vms", {"target": TARGET_NAME})
    if result.is_error:
        raise RuntimeError(f"list_vms failed: {json.dumps(str(result.content))[:300]}")
    answer = json.loads(result.content[0].text)  # the answer is one text block of JSON
    return int(answer.get("count", -1))


@contextlib.asynccontextmanager
async def stdio_client(home: Home) -> AsyncIterator[Client]:
    """``gateway serve --transport stdio`` and the SDK's client on its pipes (server start not timed)."""
    command = ["-c", GATEWAY_MAIN, "serve", "--transport", "stdio"]
    params = StdioServerParameters(command=sys.executable, args=command, env=home.env, cwd=str(REPO))
    async with Client(params, mode="legacy") as client:
        yield client


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class HttpsServer:
    """``gateway serve --transport https`` on a loopback port, with a certificate and a token for it."""

    process: subprocess.Popen[bytes]
    base: str
    cert: Path
    token: str
    log: Path

    @classmethod
    def start(cls, home: Home, timeout: float = 120.0) -> HttpsServer:
        with SqliteStore(Path(home.env["GATEWAY_HOME"]) / "state.db") as store:
            token, _ = create_token(store, "bench", "admin", expires_in=None, now=time.time())
        cert = create_certificate(home.path / "tls", ["localhost"], ["127.0.0.1"])
        port = _free_port()
        argv = ["serve", "--transport", "https", "--cert", str(cert.cert), "--key", str(cert.key),
                "--public-name", "localhost", "--host", "127.0.0.1", "--port", str(port)]
        log = home.path / "serve.log"
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=home.env, cwd=REPO,
                                       stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        server = cls(process, f"https://localhost:{port}", cert.cert, token, log)
        try:
            server.wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=self.tls()) as h:
                if h.get(f"{self.base}/readyz").status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.base} was not ready within {timeout:.0f}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @contextlib.asynccontextmanager
    async def client(self, max_sse_event_size: int | str | None = "default") -> AsyncIterator[Client]:
        """The SDK's client over streamable HTTP, legacy protocol; its default event limit unless given."""
        http = httpx2.AsyncClient(verify=self.tls(), headers={"Authorization": f"Bearer {self.token}"},
                                  timeout=300)
        options: dict[str, Any] = {} if max_sse_event_size == "default" else {
            "max_sse_event_size": max_sse_event_size}
        transport = streamable_http_client(f"{self.base}/mcp", http_client=http, **options)
        async with http, Client(transport, mode="legacy") as client:
            yield client


async def https_client(stack: contextlib.AsyncExitStack, server: HttpsServer) -> tuple[Client, str]:
    """A warmed-up HTTPS client and how it is configured: the SDK's defaults when they accept the answer,
    else (an event stream over the client's 1 MiB event limit) with that limit lifted, said so."""
    limit: int | str | None = "default"
    try:
        async with server.client() as probe:
            await call_list_vms(probe)
    except Exception as exc:
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:  # the task groups' wrapping
            exc = exc.exceptions[0]
        print(f"(d) the SDK client with its default limits failed: {type(exc).__name__}: {exc}")
        limit = None
    client = await stack.enter_async_context(server.client(limit))
    await call_list_vms(client)
    return client, "SDK client defaults" if limit == "default" else "client's SSE event limit lifted"


# ------------------------------------------------------------------------------------------------------
# Side by side


Probe = Callable[[], Awaitable[int]]


def _sync(pool: SessionPool, fn: Callable[[VSphereSession], int]) -> Probe:
    async def probe() -> int:
        return pool.run(fn)  # on the loop's thread: nothing else runs meanwhile

    return probe


async def rounds(probes: dict[str, Probe], runs: int) -> tuple[dict[str, list[float]], int]:
    """Seconds per probe over ``runs`` rounds (one warm-up round first), the order rotating each round,
    and the VM count, which every probe must agree on."""
    names = list(probes)
    counts = {name: await probes[name]() for name in names}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the measurements disagree on the VM count: {counts}")
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(runs):
        for name in names[index % len(names):] + names[: index % len(names)]:
            started = time.perf_counter()
            await probes[name]()
            samples[name].append(time.perf_counter() - started)
    return samples, counts["a"]


_LABELS = {"a": "floor, bare RetrievePropertiesEx", "b": "list_vms in-process (read function)",
           "c": "list_vms over stdio MCP", "d": "list_vms over HTTPS MCP"}


def report(samples: dict[str, list[float]], notes: dict[str, str]) -> None:
    base = statistics.median(samples["a"])
    for name, values in samples.items():
        median = statistics.median(values)
        ratio = median / base
        line = f"({name}) {_LABELS[name]:36s} {median * 1000:8.1f} ms   {ratio:.2f}x"
        if name in TARGETS:
            verdict = "within" if ratio <= TARGETS[name] else "OVER"
            line += f"  ({verdict} the {TARGETS[name]}x target)"
        if name in notes:
            line += f"  [{notes[name]}]"
        spread = f"min {min(values) * 1000:.0f} / max {max(values) * 1000:.0f} ms"
        print(f"{line}  {spread}")


async def measure(sim: Simulator, pool: SessionPool, runs: int, stdio: bool, https: bool) -> None:
    probes: dict[str, Probe] = {"a": _sync(pool, floor), "b": _sync(pool, in_process)}
    notes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-list-vms-") as tmp:
        home = Home.create(Path(tmp), sim)
        async with contextlib.AsyncExitStack() as stack:
            if stdio:
                stdio_session = await stack.enter_async_context(stdio_client(home))
                probes["c"] = lambda: call_list_vms(stdio_session)
            if https:
                server = HttpsServer.start(home)
                stack.callback(server.stop)
                https_session, notes["d"] = await https_client(stack, server)
                probes["d"] = lambda: call_list_vms(https_session)
            samples, count = await rounds(probes, runs)
    print(f"VMs: {count}, rounds: {runs} (medians; every column once per round, the order rotating)")
    report(samples, notes)


def measure_stdio(sim: Simulator, runs: int) -> float | None:
    """Median seconds of list_vms over ``gateway serve --transport stdio`` (server start not timed)."""

    async def run() -> float:
        with tempfile.TemporaryDirectory(prefix="bench-list-vms-") as tmp:
            async with stdio_client(Home.create(Path(tmp), sim)) as client:
                await call_list_vms(client)
                samples = []
                for _ in range(runs):
                    started = time.perf_counter()
                    await call_list_vms(client)
                    samples.append(time.perf_counter() - started)
                return statistics.median(samples)

    try:
        return asyncio.run(run())
    except Exception as exc:  # report and carry on: the other measurements still stand
        print(f"(c) failed: {type(exc).__name__}: {exc}")
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=3000, help="about this many VMs (rounded down to even)")
    parser.add_argument("--runs", type=int, default=9, help="timed rounds (median per column)")
    parser.add_argument("--no-stdio", action="store_true", help="skip (c), list_vms over stdio")
    parser.add_argument("--no-https", action="store_true", help="skip (d), list_vms over HTTPS")
    args = parser.parse_args(argv)

    binary = build_simulator()
    per_pool = max(1, args.vms // 2)  # one cluster root pool and one standalone host
    started = time.perf_counter()
    sim = start_simulator(binary=binary, clusters=1, hosts_per_cluster=3, standalone_hosts=1, vms=per_pool,
                          startup_timeout=300)
    print(f"simulator with {2 * per_pool} VMs up in {time.perf_counter() - started:.1f}s")
    target = Target(name=TARGET_NAME, host=sim.host, port=sim.port, insecure=True, timeout_seconds=300,
                    credential_env_prefix=credential_prefix(TARGET_NAME))
    pool = SessionPool(target, Credentials(sim.user, sim.password))
    try:
        asyncio.run(measure(sim, pool, args.runs, stdio=not args.no_stdio, https=not args.no_https))
    finally:
        pool.close()
        sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
