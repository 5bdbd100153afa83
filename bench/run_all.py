"""``make bench``: every benchmark side by side in one run, printed as one table of ratios.

    python bench/run_all.py [--vms 3000] [--runs 5] [--calls 10000] [--no-peer] [--quick]

It starts what it needs (simulators from deploy/vcsim, a hung target, ``gateway serve --transport
https`` as a child process, the peer's server) and measures, in this order:

1. list_vms at about ``--vms`` VMs: the bare pyVmomi floor (one RetrievePropertiesEx, bench/list_vms.py),
   the gateway's read function and its whole pipeline in-process, over stdio, over HTTPS; and the peer
   (PyPI ``vmware-monitor``, in its own venv bench/.peer-venv): its listing function and its own MCP
   server over HTTPS. Medians of ``--runs``; ratios to the floor.
2. A small call's latency: get_vm_details over HTTPS against the same reads made with bare pyVmomi
   (the gateway's own requests: a name sweep, then its one retrieval; bench/floors.py), the older
   smaller floor (labelled), and a tool doing nothing on the bare MCP SDK over HTTPS (bench/mcp_floor.py:
   what any MCP call over HTTPS costs here), samples interleaved, p50 and p99.
3. Isolation and fairness: a dozen clients, four on each of three targets (healthy; slowed with the
   simulator's method delay; hung: a socket that accepts and never answers). The healthy target's p50
   with such neighbours against alone, calls per client on the slow target, the hung target's outcome.
4. Audit appends per second, durable and not, and audited changes per second with the intent row
   against one row per change (bench/audit_append.py).
5. The server's resident memory after 2,000 and after ``--calls`` calls across 10 targets.
6. A bearer token check: first sight (argon2id) against cached (bench/token_check.py).
7. Event-loop responsiveness: /healthz p99 while a stuck audit lock, a pathological regex and eight
   full listings run, against idle (bench/event_loop.py; its own simulator and server).
8. The live inventory mirror (bench/mirror.py): fair floors (the gateway's own RetrievePropertiesEx, raw
   and pyVmomi-decoded), list_vms over HTTPS from the mirror and sweeping, get_vm_details with the VM
   named by the mirror and sweeping names against its fair floor, SOAP bytes per minute with eight
   agents polling, the mirror's size per 1,000 VMs, and scale rows at 300 / 3,000 / 30,000 VMs.
   The list_vms rows of section 1 are the sweeping path (every lab target has ``mirror: off``).
9. The read that cannot use the mirror (bench/sweep.py): list_vms over HTTPS on a ``mirror: off``
   target at 3,000 and 30,000 VMs against the raw RetrievePropertiesEx, this checkout beside the
   package as it was before the decoder work (``sweep.BEFORE``), and the decode alone of each.
10. Fair queueing (bench/fairness.py; its own simulator, every SOAP call slowed, fixed and varying,
    side by side): agent B's get_vm_details alone against behind agent A's burst of 24 with
    per-caller queues (starts spread and not) and with strict FIFO, and the calls finished per second
    during the burst, fair against FIFO.
11. The answer path (bench/answer_path.py): a bare HTTPS JSON POST, the MCP SDK's own no-op tool and the
    gateway's cheapest call (list_pending_actions) on the 2026-07-28 revision and on the legacy
    handshake, side by side; list_vms from the mirror over HTTPS on both against the raw sweep at
    3,000 and 30,000 VMs.

The table goes to stdout and, unless ``--quick``, into bench/RESULTS.md with the date and core count.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

import answer_path  # noqa: E402
import anyio  # noqa: E402
import audit_append  # noqa: E402
import event_loop  # noqa: E402
import fairness as fairness_bench  # noqa: E402
import floors  # noqa: E402
import httpx2  # noqa: E402
import list_vms as floor_bench  # noqa: E402
import mcp_floor  # noqa: E402
import mirror as mirror_bench  # noqa: E402
import sweep as sweep_bench  # noqa: E402
import token_check  # noqa: E402
import yaml  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from gateway.auth.tokens import Principal, TokenAuthenticator, create_token  # noqa: E402
from gateway.config import Credentials, Target  # noqa: E402
from gateway.dev.simulators import SimulatorProcess, build_simulator, start_simulator, write_targets  # noqa: E402
from gateway.server.edge.tls import create_certificate  # noqa: E402
from gateway.server.runtime import Gateway  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.store.sqlite import SqliteStore  # noqa: E402
from gateway.vsphere.pool import SessionPool  # noqa: E402

GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"
VM = "DC0_C0_RP0_VM0"
SMALL = [f"t{i}" for i in range(10)]
MIRROR_SCALE = [300, 3000, 30000]
MIRROR_SCALE_QUICK = [300]
SWEEP_SCALE = [3000, 30000]
SWEEP_SCALE_QUICK = [300]
ANSWER_SCALE = [3000, 30000]
ANSWER_SCALE_QUICK = [300]
PEER_PY = BENCH / ".peer-venv" / "bin" / "python"


# ------------------------------------------------------------------------------------------- the table


@dataclass
class Table:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, what: str, value: str, ratio: str = "") -> None:
        self.rows.append((what, value, ratio))
        print(f"  {what:<72} {value:>16} {ratio:>10}", flush=True)

    def markdown(self) -> str:
        lines = ["| measurement | value | ratio |", "| --- | ---: | ---: |"]
        return "\n".join(lines + [f"| {w} | {v} | {r} |" for w, v, r in self.rows])


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------------------------- the lab


class HungTarget:
    """A TCP listener that accepts connections and never answers (a vCenter that stopped responding)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.listener.accept()[0])

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@dataclass
class Lab:
    tmp: Path
    sims: dict[str, SimulatorProcess]
    env: dict[str, str]
    token: str
    cert: Path
    port: int
    server: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}/mcp"

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.server.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024

    @contextlib.asynccontextmanager
    async def session(self, url: str | None = None, token: str | None = None) -> AsyncIterator[Client]:
        verify = ssl.create_default_context(cafile=str(self.cert))
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token or self.token}"}, verify=verify,
                                  timeout=300)
        transport = streamable_http_client(url or self.url, http_client=http)  # the SDK's default limits
        async with http, Client(transport, mode="legacy") as client:
            yield client


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_https(url: str, cert: Path, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    context = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args!r} exited with {process.returncode} while starting")
        with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=context) as client:
            if client.get(url).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout:.0f}s")


def start_lab(stack: contextlib.ExitStack, vms: int) -> Lab:
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
    binary = build_simulator()
    started = time.perf_counter()
    sims = {"big": start_simulator(binary=binary, hosts_per_cluster=3, standalone_hosts=1, vms=vms // 2,
                                   startup_timeout=600)}
    sims.update({name: start_simulator(binary=binary) for name in SMALL})
    sims["slow"] = start_simulator(binary=binary, method_delay={"RetrievePropertiesEx": 300})
    for sim in sims.values():
        stack.callback(sim.stop)
    hung = HungTarget()
    stack.callback(hung.close)
    print(f"simulators up in {time.perf_counter() - started:.0f}s", flush=True)
    # The rows below measure the sweeping path (and isolation on a slowed RetrievePropertiesEx): no mirrors.
    # The mirror's own rows come from bench/mirror.py (section 7).
    env = write_targets(tmp / "targets.yaml", sims, {name: {"mirror": "off"} for name in sims})
    targets = yaml.safe_load((tmp / "targets.yaml").read_text())
    targets["targets"].append({"name": "hung", "host": "127.0.0.1", "port": hung.port, "insecure": True,
                               "credential_env_prefix": "SIM_HUNG", "timeout_seconds": 3, "mirror": "off"})
    (tmp / "targets.yaml").write_text(yaml.safe_dump(targets, sort_keys=False))
    env.update({"SIM_HUNG_USER": "nobody", "SIM_HUNG_PASSWORD": "never-asked"})
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
    with (tmp / "serve.log").open("wb") as log:
        server = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=env, cwd=REPO,
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    stack.callback(stop_process, server)
    wait_for_https(f"https://localhost:{port}/readyz", cert, server)
    return Lab(tmp, sims, env, token, cert, port, server)


def stop_process(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# ------------------------------------------------------------------------------------------- calls


async def call(client: Client, tool: str, args: dict[str, Any]) -> tuple[float, str]:
    """Seconds taken and the outcome: "ok" or the error code."""
    started = time.perf_counter()
    result = await client.call_tool(tool, args)
    elapsed = time.perf_counter() - started
    if not result.is_error:
        return elapsed, "ok"
    error = json.loads(result.content[0].text).get("error", {})  # the answer is one text block of JSON
    return elapsed, str(error.get("code", result.content))


async def https_samples(lab: Lab, tool: str, args: dict[str, Any], n: int) -> list[float]:
    async with lab.session() as client:
        await call(client, tool, args)  # warm-up: login, first-sight token check
        samples = []
        for _ in range(n):
            seconds, outcome = await call(client, tool, args)
            if outcome != "ok":
                raise SystemExit(f"{tool} {args} failed over HTTPS: {outcome}")
            samples.append(seconds)
    return samples


def pool_for(lab: Lab, name: str) -> SessionPool:
    sim = lab.sims[name]
    target = Target(name=name, host=sim.host, port=sim.port, insecure=True, timeout_seconds=300,
                    credential_env_prefix="BENCH")
    return SessionPool(target, Credentials(sim.user, sim.password))


async def pipeline_median(lab: Lab, runs: int) -> float:
    """list_vms through ``Calls.call`` in this process: roles, policy, scheduler, sanitizing, audit."""
    settings = Settings.from_env(lab.env, home=str(lab.tmp / "inproc"), targets=str(lab.tmp / "targets.yaml"))
    gateway = Gateway.build(settings)
    caller = Principal("bench", "admin", surface="bench")
    try:
        await gateway.calls.call(caller, "list_vms", {"target": "big"})
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            await gateway.calls.call(caller, "list_vms", {"target": "big"})
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)
    finally:
        await gateway.close()


# ------------------------------------------------------------------------------------------- 1. list_vms


def list_vms_rows(lab: Lab, table: Table, runs: int, peer: bool) -> None:
    pool = pool_for(lab, "big")
    try:
        floor, count = floor_bench.timed(lambda: pool.run(floor_bench.floor), runs)
        read_fn, _ = floor_bench.timed(lambda: pool.run(floor_bench.in_process), runs)
    finally:
        pool.close()
    label = f"list_vms, {count} VMs:"
    table.add(f"{label} bare pyVmomi RetrievePropertiesEx of 2 properties (older floor; fair floors: "
              "section 7)", ms(floor), "1.00x")
    over_https = anyio.run(https_samples, lab, "list_vms", {"target": "big"}, runs)
    results: dict[str, float | str | None] = {
        "gateway read function in-process": read_fn,
        "gateway pipeline in-process (policy, audit, sanitizing)": anyio.run(pipeline_median, lab, runs),
        "gateway over stdio (MCP client, child process)": floor_bench.measure_stdio(lab.sims["big"], runs),
        "gateway over HTTPS (MCP client, TLS, bearer token)": statistics.median(over_https),
    }
    if peer:
        results.update(peer_medians(lab, runs, count))
    else:
        results["peer vmware-monitor"] = "not measured: this run was given --no-peer"
    for what, seconds in results.items():
        if isinstance(seconds, str):
            table.add(f"{label} {what}", seconds)
        elif seconds is not None:
            table.add(f"{label} {what}", ms(seconds), f"{seconds / floor:.2f}x")


def peer_installed() -> bool:
    return PEER_PY.is_file() and subprocess.run(
        [str(PEER_PY), "-m", "pip", "show", "-q", "vmware-monitor"], capture_output=True, check=False,
    ).returncode == 0


def ensure_peer() -> str | None:
    """Create bench/.peer-venv with vmware-monitor when missing (a venv left without it, by an install
    cut short, is completed); None when ready, else why not, naming PyPI when it could not be reached."""
    if peer_installed():
        return None
    print("installing the peer (vmware-monitor) into bench/.peer-venv ...", flush=True)
    steps = [] if PEER_PY.is_file() else [[sys.executable, "-m", "venv", str(PEER_PY.parent.parent)]]
    for argv in (*steps, [str(PEER_PY), "-m", "pip", "install", "-q", "vmware-monitor"]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode:
            why = done.stderr.strip()[-300:]
            offline = ("Could not find a version", "NewConnectionError", "Max retries",
                       "Temporary failure in name resolution", "Network is unreachable")
            if any(sign in why for sign in offline):
                return f"not measured: PyPI could not be reached from this machine (pip: {why[-160:]})"
            return f"not measured: {' '.join(argv[-3:])} failed: {why}"
    return None


def peer_medians(lab: Lab, runs: int, count: int) -> dict[str, float | str]:
    problem = ensure_peer()
    if problem:
        return {"peer vmware-monitor": problem}
    shown = subprocess.run([str(PEER_PY), "-m", "pip", "show", "vmware-monitor"], capture_output=True,
                           text=True, check=False).stdout
    name = f"peer vmware-monitor {shown.split('Version: ')[-1].split()[0]}"
    sim = lab.sims["big"]
    home = lab.tmp / "peer"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "OPS_HOME": str(home / "ops"), "PEER_PASSWORD": sim.password}
    where = ["--host", sim.host, "--port", str(sim.port), "--user", sim.user]
    listed = subprocess.run([str(PEER_PY), str(BENCH / "peer.py"), "list", *where, "--runs", str(runs)],
                            env=env, capture_output=True, text=True, check=False)
    if listed.returncode:
        return {name: f"not measured: {listed.stderr.strip()[-300:]}"}
    function = json.loads(listed.stdout.splitlines()[-1])
    if function["count"] != count:
        return {name: f"not comparable: it listed {function['count']} VMs, the floor {count}"}
    return {f"{name}, its listing function in-process": function["median_s"],
            f"{name}, its MCP server over HTTPS": peer_over_https(lab, env, where, runs)}


def peer_over_https(lab: Lab, env: dict[str, str], where: list[str], runs: int) -> float | str:
    port = free_port()
    argv = [str(PEER_PY), str(BENCH / "peer.py"), "serve", *where, "--listen", str(port), "--cert",
            str(lab.cert), "--key", str(lab.cert.with_name("key.pem")), "--home", str(lab.tmp / "peer")]
    with (lab.tmp / "peer.log").open("wb") as log:
        server = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    try:
        assert server.stdout is not None
        token = server.stdout.readline().decode().strip().removeprefix("TOKEN=")
        wait_for_https(f"https://localhost:{port}/healthz", lab.cert, server)

        async def median() -> float:
            async with lab.session(f"https://localhost:{port}/mcp", token) as client:
                samples = [(await call(client, "list_virtual_machines", {"target": "sim"}))
                           for _ in range(runs + 1)]
            if any(outcome != "ok" for _, outcome in samples):
                raise RuntimeError(f"the peer's list_virtual_machines failed: {samples}")
            return statistics.median(seconds for seconds, _ in samples[1:])

        return anyio.run(median)
    except (RuntimeError, SystemExit, OSError) as exc:
        return f"not measured: {exc}"
    finally:
        stop_process(server)


# ------------------------------------------------------------------------------------------- 2. small call


def small_call_rows(lab: Lab, table: Table, samples: int) -> None:
    """get_vm_details over HTTPS against its floors and against a tool that does nothing on the bare MCP
    SDK over HTTPS (what any MCP call over HTTPS costs here), samples interleaved."""
    pool = pool_for(lab, "t0")
    try:
        found = anyio.run(_small_call_samples, lab, pool, samples)
    finally:
        pool.close()
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        base = pct(found["floor"], q)
        table.add(f"get_vm_details {label}: the same reads with bare pyVmomi (the gateway's requests)",
                  ms(base), "1.00x")
        fewer = pct(found["fewer"], q)
        table.add(f"get_vm_details {label}: bare pyVmomi, older floor (the VM's own properties only)",
                  ms(fewer), f"{fewer / base:.2f}x")
        noop = pct(found["noop"], q)
        table.add(f"get_vm_details {label}: a tool doing nothing, bare MCP SDK over HTTPS (no vSphere)",
                  ms(noop), f"{noop / base:.2f}x")
        ours = pct(found["https"], q)
        table.add(f"get_vm_details {label}: over HTTPS (adds {ms(ours - base)})", ms(ours),
                  f"{ours / base:.2f}x")


async def _small_call_samples(lab: Lab, pool: SessionPool, samples: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"floor": [], "fewer": [], "noop": [], "https": []}
    args = {"target": "t0", "vm": VM}
    with contextlib.ExitStack() as stack:
        noop_url, noop_cert = mcp_floor.serve(stack, lab.tmp / "mcp-floor")
        async with lab.session() as client, mcp_floor.client(noop_url, noop_cert) as bare:
            for _ in range(5):  # warm-up: logins, first-sight token check
                await call(client, "get_vm_details", args)
                await bare.call_tool("noop", {})
                pool.run(lambda session: floors.vm_details(session, VM))
                pool.run(lambda session: floors.vm_details_fewer(session, VM))
            for _ in range(samples):
                for key, fn in (("floor", floors.vm_details), ("fewer", floors.vm_details_fewer)):
                    started = time.perf_counter()
                    pool.run(functools.partial(fn, name=VM))
                    found[key].append(time.perf_counter() - started)
                started = time.perf_counter()
                await bare.call_tool("noop", {})
                found["noop"].append(time.perf_counter() - started)
                seconds, outcome = await call(client, "get_vm_details", args)
                if outcome != "ok":
                    raise SystemExit(f"get_vm_details {args} failed over HTTPS: {outcome}")
                found["https"].append(seconds)
    return found


# ------------------------------------------------------------------------------------------- 3. isolation


async def isolation(lab: Lab, seconds: float) -> dict[str, Any]:
    """The healthy target's latencies alone for ``seconds``, then as long again with 4 clients looping on
    the slowed and 4 on the hung target; calls completed per slow client; the hung target's outcomes."""
    healthy: dict[str, list[float]] = {"alone": [], "mixed": []}
    per_client: Counter[str] = Counter()
    hung: dict[str, list[float]] = {}

    async def loop(target: str, index: int, phase: str, stop: anyio.Event) -> None:
        async with lab.session() as client:
            while not stop.is_set():
                took, outcome = await call(client, "get_vm_details", {"target": target, "vm": VM})
                if target == "hung":
                    hung.setdefault(outcome, []).append(took)
                elif outcome != "ok":
                    raise SystemExit(f"get_vm_details on {target} failed: {outcome}")
                elif target == "t0":
                    healthy[phase].append(took)
                else:
                    per_client[f"{index}"] += 1

    for phase, neighbours in (("alone", ()), ("mixed", ("slow", "hung"))):
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            for index in range(4):
                for target in ("t0", *neighbours):
                    group.start_soon(loop, target, index, phase, stop)
            await anyio.sleep(seconds)
            stop.set()
    return {"alone": pct(healthy["alone"], 0.5), "mixed": pct(healthy["mixed"], 0.5),
            "slow": [per_client[f"{i}"] for i in range(4)],
            "hung": {code: (len(times), statistics.median(times)) for code, times in hung.items()}}


def isolation_rows(lab: Lab, table: Table, seconds: float) -> None:
    found = anyio.run(isolation, lab, seconds)
    table.add("12 clients: healthy target, get_vm_details p50, 4 clients alone", ms(found["alone"]), "1.00x")
    table.add("12 clients: the same with 4 more on a slowed and 4 on a hung target", ms(found["mixed"]),
              f"{found['mixed'] / found['alone']:.2f}x")
    slow = found["slow"]
    table.add("12 clients: slowed target, calls completed per client (min / max)",
              f"{min(slow)} / {max(slow)}", f"{min(slow) / max(slow):.2f}" if max(slow) else "")
    outcomes = ", ".join(f"{n} {code} after {ms(took)}" for code, (n, took) in sorted(found["hung"].items()))
    table.add("12 clients: hung target, outcomes of its calls", outcomes or "none finished")


# ------------------------------------------------------------------------------------------- 4-6


def audit_rows(table: Table, rows: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        durable = audit_append.one_process(Path(tmp), rows, durable=True)
        fast = audit_append.one_process(Path(tmp), rows, durable=False)
    table.add("audit append, durable (fdatasync per row), rows/s", f"{durable:,.0f}", "1.00x")
    table.add("audit append, not durable, rows/s", f"{fast:,.0f}", f"{fast / durable:.1f}x")
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as tmp:
        single, intent = audit_append.intent_ratio(Path(tmp), rows)
    table.add("audited changes/s, one durable row per change (today)", f"{single:,.0f}", "1.00x")
    table.add("audited changes/s, intent row + outcome row", f"{intent:,.0f}", f"{intent / single:.2f}x")


async def memory(lab: Lab, total: int, checkpoints: tuple[int, ...]) -> tuple[dict[int, float], float]:
    """``total`` list_vms calls over HTTPS from 8 clients, round robin on the 10 small targets."""
    numbers = itertools.count()
    done = 0
    rss: dict[int, float] = {}

    async def client_loop() -> None:
        nonlocal done
        async with lab.session() as client:
            while (n := next(numbers)) < total:
                _, outcome = await call(client, "list_vms", {"target": SMALL[n % len(SMALL)]})
                if outcome != "ok":
                    raise SystemExit(f"list_vms failed during the memory run: {outcome}")
                done += 1
                if done in checkpoints:
                    rss[done] = lab.rss_mb()

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(8):
            group.start_soon(client_loop)
    return rss, total / (time.perf_counter() - started)


def memory_rows(lab: Lab, table: Table, calls: int) -> None:
    first, middle = min(2000, calls // 5), calls // 2
    table.add("server RSS after start-up and the calls above", f"{lab.rss_mb():.0f} MB")
    rss, rate = anyio.run(memory, lab, calls, (first, middle, calls))
    table.add(f"server RSS after {first:,} list_vms calls over 10 targets (8 clients)",
              f"{rss[first]:.0f} MB", "1.00x")
    for count in (middle, calls):
        table.add(f"server RSS after {count:,} calls ({rate:.0f} calls/s)", f"{rss[count]:.0f} MB",
                  f"{rss[count] / rss[first]:.2f}x")


def token_rows(table: Table) -> None:
    with tempfile.TemporaryDirectory() as tmp, SqliteStore(Path(tmp) / "state.db") as store:
        token, _ = create_token(store, "bench", "reader", expires_in=None, now=time.time())
        first = token_check._first_sight(store, token, 3)
        auth = TokenAuthenticator(store)
        auth.verify(token)
        cached = token_check._per_call(lambda: auth.verify(token, "bench"), 20_000)
    table.add("token check, first sight (argon2id)", ms(first), "1x")
    table.add("token check, cached (same token again)", f"{cached * 1e6:.1f} us", f"1/{first / cached:,.0f}")


# ------------------------------------------------------------------------------------------- main


APART: Final = "## Measured apart from `make bench`"
"""RESULTS.md's closing section of figures from other commands (soak, floods), each with its command:
a new `make bench` run keeps it as it was."""


def kept_apart() -> list[str]:
    """The current RESULTS.md's section ``APART`` (heading included), or nothing."""
    path = BENCH / "RESULTS.md"
    old = path.read_text() if path.is_file() else ""
    start = old.find(APART)
    return [old[start:].rstrip(), ""] if start >= 0 else []


def results_markdown(table: Table, args: argparse.Namespace, seconds: float) -> str:
    command = "make bench" if not any(vars(args).values()) else "python bench/run_all.py " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
        for k, v in vars(args).items() if v not in (None, False))
    return "\n".join([
        "# Benchmark results", "",
        f"Latest `make bench` run: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores (`nproc`), "
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}; the simulators, the "
        f"gateway and the clients all ran on this one machine. Took {seconds / 60:.1f} min. Reproduce with "
        f"`{command}`; bench/README.md says what each row measures.", "",
        table.markdown(), "", "Notes (details in bench/README.md):", "",
        "- The list_vms floor is bare pyVmomi; the gateway decodes replies with its own reader (< 1.0x).",
        "- Every client is the MCP SDK's with its default settings (a 1 MiB limit per server-sent event:",
        "  the gateway answers calls without progress as one JSON body, so large listings pass).", "",
        *kept_apart()])


def event_loop_rows(table: Table, vms: int, quick: bool) -> None:
    """/healthz p99 under pressure against idle (bench/event_loop.py, its own simulator and server)."""
    argv = ["--vms", str(vms)] + (["--idle-seconds", "2", "--lock-seconds", "8", "--regex-seconds", "6"]
                                  if quick else [])
    phases = event_loop.measure(argv)
    idle = next((event_loop.pct(p.samples, 0.99) for p in phases if p.name == "idle" and p.samples), 0.0)
    for phase in phases:
        label = f"/healthz p99 over HTTPS, {event_loop.PHASE_LABELS.get(phase.name, phase.name)}"
        if not phase.samples:
            table.add(label, f"not measured: {phase.note}")
            continue
        p99 = event_loop.pct(phase.samples, 0.99)
        timeouts = f" ({phase.timeouts} probes timed out)" if phase.timeouts else ""
        table.add(label + timeouts, ms(p99), f"{p99 / idle:.1f}x" if idle else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, help="VMs on the big target (default 3000)")
    parser.add_argument("--runs", type=int, help="timed list_vms runs per measurement, median (default 5)")
    parser.add_argument("--calls", type=int, help="calls in the memory run (default 10000)")
    parser.add_argument("--no-peer", action="store_true", help="skip the peer (vmware-monitor)")
    parser.add_argument("--quick", action="store_true", help="small sizes, RESULTS.md left alone")
    args = parser.parse_args(argv)
    vms, runs, calls = args.vms or (300 if args.quick else 3000), args.runs or 5, args.calls or (
        1000 if args.quick else 10_000)
    samples = 60 if args.quick else 300
    started = time.perf_counter()
    table = Table()
    with contextlib.ExitStack() as stack:
        lab = start_lab(stack, vms)
        list_vms_rows(lab, table, runs, peer=not args.no_peer)
        small_call_rows(lab, table, samples)
        isolation_rows(lab, table, 4 if args.quick else 15)
        audit_rows(table, 500 if args.quick else 2000)
        memory_rows(lab, table, calls)
        token_rows(table)
    event_loop_rows(table, vms, args.quick)
    for what, value, ratio in mirror_bench.run(vms, runs, MIRROR_SCALE_QUICK if args.quick else MIRROR_SCALE,
                                               agents=8):
        table.add(what, value, ratio)
    for what, value, ratio in sweep_bench.run(SWEEP_SCALE_QUICK if args.quick else SWEEP_SCALE, runs):
        table.add(what, value, ratio)
    for what, value, ratio in fairness_bench.run(rounds=3 if args.quick else 5):
        table.add(what, value, ratio)
    for what, value, ratio in answer_path.run(100 if args.quick else 300, 3 if args.quick else 5,
                                              ANSWER_SCALE_QUICK if args.quick else ANSWER_SCALE, runs):
        table.add(what, value, ratio)
    print("\n" + table.markdown())
    if not args.quick:
        (BENCH / "RESULTS.md").write_text(results_markdown(table, args, time.perf_counter() - started))
        print(f"\nwritten to {BENCH / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
