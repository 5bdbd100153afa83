"""Event-loop responsiveness: /healthz p99 over HTTPS while the server is under each kind of pressure.

    python bench/event_loop.py [--vms 3000] [--interval 0.02] [--probe-timeout 5] [--lock-seconds 20]
                               [--regex-seconds 15] [--listings 8]

Starts one simulator holding about ``--vms`` VMs and ``gateway serve --transport https`` (a child
process), then probes ``GET /healthz`` from a thread of its own every ``--interval`` seconds over one
kept-alive TLS connection, in four phases, one after the other:

  idle     nothing else runs (the baseline)
  listings ``--listings`` concurrent list_vms calls over all ~``--vms`` VMs (eight MCP clients)
  lock     another process holds the audit log's lock (``<audit log>.lock``, flock) for
           ``--lock-seconds`` while four clients make calls that must write audit rows
  regex    a list_vms call whose name filter is the pathological ``^DC((.*)*)*x`` (catastrophic
           backtracking on every VM name), for at most ``--regex-seconds``

For each phase it prints the probe's p50, p99 and max, how many probes timed out (a probe that gets
no answer within ``--probe-timeout`` counts as that many seconds: a frozen loop shows as a number, not
a crash), the p99 as a ratio to the idle p99, and the outcomes of the calls that made the pressure.
The regex phase runs last because a server thread stuck in a regex may keep burning CPU after the
client gives up. When the server dies, the remaining phases say so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from gateway.auth.tokens import create_token  # noqa: E402
from gateway.dev.simulators import build_simulator, start_simulator, write_targets  # noqa: E402
from gateway.server.edge.tls import create_certificate  # noqa: E402
from gateway.store.sqlite import SqliteStore  # noqa: E402

GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"
PATHOLOGICAL = "^DC((.*)*)*x"
TARGET = "big"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# ------------------------------------------------------------------------------------------- the server


@dataclass
class Server:
    home: Path
    cert: Path
    port: int
    token: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base(self) -> str:
        return f"https://localhost:{self.port}"

    @property
    def audit_lock(self) -> Path:
        return self.home / "audit.jsonl.lock"

    def alive(self) -> bool:
        return self.process.poll() is None

    @contextlib.asynccontextmanager
    async def client(self, timeout: float) -> AsyncIterator[Client]:
        verify = ssl.create_default_context(cafile=str(self.cert))
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, verify=verify,
                                  timeout=timeout)
        transport = streamable_http_client(f"{self.base}/mcp", http_client=http)
        async with http, Client(transport, mode="legacy") as client:
            yield client


def start_server(stack: contextlib.ExitStack, vms: int) -> Server:
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-loop-")))
    started = time.perf_counter()
    sim = start_simulator(binary=build_simulator(), hosts_per_cluster=3, standalone_hosts=1, vms=vms // 2,
                          startup_timeout=600)
    stack.callback(sim.stop)
    print(f"simulator with ~{vms} VMs up in {time.perf_counter() - started:.0f}s", flush=True)
    env = write_targets(tmp / "targets.yaml", {TARGET: sim})
    home = tmp / "home"
    home.mkdir(mode=0o700)
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "bench", "admin", expires_in=None, now=time.time())
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"]).cert
    env.update({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "GATEWAY_HOME": str(home),
                "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml")})
    port = free_port()
    argv = ["serve", "--transport", "https", "--cert", str(cert), "--key", str(cert.with_name("key.pem")),
            "--public-name", "localhost", "--host", "127.0.0.1", "--port", str(port)]
    log = tmp / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=env, cwd=REPO,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(stop_process, process)
    server = Server(home, cert, port, token, process, log)
    wait_ready(server)
    return server


def wait_ready(server: Server, timeout: float = 120) -> None:
    context = ssl.create_default_context(cafile=str(server.cert))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise SystemExit(f"the gateway exited with {server.process.returncode} while starting; "
                             f"see {server.log}:\n{server.log.read_text()[-2000:]}")
        with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=context) as client:
            if client.get(f"{server.base}/readyz").status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"{server.base}/readyz did not answer within {timeout:.0f}s")


def stop_process(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# ------------------------------------------------------------------------------------------- the probe


@dataclass
class Probe:
    """GET /healthz every ``interval`` seconds from a thread of its own, until stopped."""

    server: Server
    interval: float
    timeout: float
    samples: list[float] = field(default_factory=list)
    timeouts: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Probe:
        self._thread = threading.Thread(target=self._run, daemon=True, name="healthz-probe")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 30)

    def _run(self) -> None:
        context = ssl.create_default_context(cafile=str(self.server.cert))
        url = f"{self.server.base}/healthz"
        with httpx2.Client(verify=context, timeout=self.timeout) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = client.get(url).status_code
                    elapsed = time.perf_counter() - started
                    if status != 200:
                        self.errors[f"HTTP {status}"] += 1
                    self.samples.append(elapsed)
                except httpx2.TimeoutException:
                    self.timeouts += 1
                    self.samples.append(self.timeout)  # a frozen loop is a number, not a crash
                except (httpx2.TransportError, OSError) as exc:
                    self.errors[type(exc).__name__] += 1
                    self._stop.wait(self.interval)
                self._stop.wait(max(0.0, self.interval - (time.perf_counter() - started)))


# ------------------------------------------------------------------------------------------- pressure


async def call_tool(server: Server, tool: str, args: dict[str, Any], timeout: float) -> str:
    """The outcome of one call: ok, the error code, or what went wrong on the way."""
    try:
        with anyio.fail_after(timeout):
            async with server.client(timeout) as client:
                result = await client.call_tool(tool, args)
    except TimeoutError:
        return f"no answer in {timeout:g}s"
    except Exception as exc:  # the bench reports whatever happened instead of crashing
        return type(exc).__name__
    if not result.is_error:
        return "ok"
    error = json.loads(result.content[0].text).get("error", {})  # the answer is one text block of JSON
    return str(error.get("code", "error"))


async def concurrent_calls(server: Server, calls: list[tuple[str, dict[str, Any]]],
                           timeout: float) -> Counter[str]:
    outcomes: Counter[str] = Counter()

    async def one(tool: str, args: dict[str, Any]) -> None:
        outcomes[await call_tool(server, tool, args, timeout)] += 1

    async with anyio.create_task_group() as group:
        for tool, args in calls:
            group.start_soon(one, tool, args)
    return outcomes


class LockHolder:
    """Another process holding the audit log's lock (exclusive flock) until released."""

    CODE = ("import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")

    def __init__(self, lock_file: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", self.CODE, str(lock_file)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "held":
            raise SystemExit(f"could not take the audit lock {lock_file}")

    def release(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(30)
        self.process.stdout.close()


# ------------------------------------------------------------------------------------------- phases


@dataclass
class Phase:
    name: str
    samples: list[float]
    timeouts: int
    errors: Counter[str]
    outcomes: Counter[str]
    note: str = ""


def run_phase(server: Server, args: argparse.Namespace, name: str) -> Phase:
    if not server.alive():
        return Phase(name, [], 0, Counter(), Counter(), note=f"server exited ({server.process.returncode})")
    probe = Probe(server, args.interval, args.probe_timeout).start()
    outcomes: Counter[str] = Counter()
    note = ""
    try:
        if name == "idle":
            time.sleep(args.idle_seconds)
        elif name == "listings":
            calls = [("list_vms", {"target": TARGET})] * args.listings
            outcomes = anyio.run(concurrent_calls, server, calls, args.call_timeout)
        elif name == "lock":
            holder = LockHolder(server.audit_lock)
            try:
                calls = [("list_vms", {"target": TARGET, "name": "DC0_H0_VM0"})] * 4
                outcomes = anyio.run(concurrent_calls, server, calls, args.lock_seconds)
            finally:
                holder.release()
            note = f"lock held {args.lock_seconds:g}s at most (released once the calls ended)"
        elif name == "regex":
            calls = [("list_vms", {"target": TARGET, "regex": PATHOLOGICAL})]
            outcomes = anyio.run(concurrent_calls, server, calls, args.regex_seconds)
    finally:
        probe.stop()
    return Phase(name, probe.samples, probe.timeouts, probe.errors, outcomes, note)


def report(phases: list[Phase]) -> None:
    base = next((pct(p.samples, 0.99) for p in phases if p.name == "idle" and p.samples), float("nan"))
    print(f"{'phase':<10}{'probes':>8}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'timeouts':>10}"
          f"{'p99/idle':>10}  calls")
    for phase in phases:
        if not phase.samples:
            print(f"{phase.name:<10}{'-':>8}  not measured: {phase.note or 'no probe answered'}")
            continue
        p99 = pct(phase.samples, 0.99)
        ratio = p99 / base if base == base and base > 0 else float("nan")
        calls = ", ".join(f"{n}x {k}" for k, n in phase.outcomes.most_common()) or "-"
        errors = "; probe errors: " + ", ".join(f"{n}x {k}" for k, n in phase.errors.items()) \
            if phase.errors else ""
        print(f"{phase.name:<10}{len(phase.samples):>8}{pct(phase.samples, 0.5) * 1000:>10.1f}"
              f"{p99 * 1000:>10.1f}{max(phase.samples) * 1000:>10.1f}{phase.timeouts:>10}{ratio:>9.1f}x  "
              f"{calls}{errors}{'; ' + phase.note if phase.note else ''}")


#: what each phase is, in words (for tables)
PHASE_LABELS = {
    "idle": "idle",
    "listings": "while 8 list_vms of all VMs run",
    "lock": "while another process holds the audit lock",
    "regex": f"while list_vms filters with {PATHOLOGICAL}",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--vms", type=int, default=3000)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between probes")
    parser.add_argument("--probe-timeout", type=float, default=5.0, help="a probe's deadline (seconds)")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--listings", type=int, default=8, help="concurrent list_vms calls")
    parser.add_argument("--call-timeout", type=float, default=300.0, help="deadline of each listing call")
    parser.add_argument("--lock-seconds", type=float, default=20.0, help="longest hold of the audit lock")
    parser.add_argument("--regex-seconds", type=float, default=15.0, help="deadline of the regex call")
    parser.add_argument("--phases", default="idle,listings,lock,regex")
    return parser.parse_args(argv)


def measure(argv: list[str] | None = None) -> list[Phase]:
    """Start the lab, run every phase, stop the lab; the phases measured (also used by run_all.py)."""
    args = parse_args(argv)
    phases: list[Phase] = []
    with contextlib.ExitStack() as stack:
        server = start_server(stack, args.vms)
        print(f"gateway serving at {server.base} (log {server.log})", flush=True)
        for name in args.phases.split(","):
            print(f"phase {name} ...", flush=True)
            phases.append(run_phase(server, args, name.strip()))
    return phases


def main(argv: list[str] | None = None) -> int:
    phases = measure(argv)
    print()
    report(phases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
