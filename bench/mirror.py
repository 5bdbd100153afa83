"""list_vms from the live inventory mirror against sweeping, with fair floors, SOAP bytes and scale rows.

Plain script: ``python bench/mirror.py [--vms 3000] [--runs 7] [--scale 300,3000,30000] [--agents 8]``;
``bench/run_all.py`` runs the same rows. For each size it starts one simulator and one
``gateway serve --transport https`` (a child process) with two targets on that simulator: ``mirror``
(the default, ``mirror: lazy``) and ``sweep`` (``mirror: off``), and times, rounds interleaved, the
simulator collecting its garbage before each timed call (its control endpoint's ``/gc``, untimed: the
garbage of one large reply would otherwise be collected during whichever column comes next):

raw floor       the same RetrievePropertiesEx the gateway sends for list_vms (its property set over the
                session's kept ContainerView), sent through pyVmomi's stub, the reply's bytes read and
                not decoded
pyVmomi floor   the same request and reply, decoded by pyVmomi (what a hand-written client pays)
2-property      the older floor: name and power state only, decoded by pyVmomi (labelled as such)
mirror          list_vms over HTTPS answered from the mirror (fresh: one zero-wait WaitForUpdatesEx first)
sweep           list_vms over HTTPS on the target without a mirror
details         get_vm_details of one VM: bare pyVmomi sending the gateway's requests (a sweep of every
                VM's name, then one retrieval; floor), over HTTPS with the VM named by the mirror (no
                name sweep: the mirror's index, checked by the live read) and over HTTPS sweeping names

Then, at ``--vms`` only: eight agents (``--agents``) each call list_vms once, concurrently, on a target
reached through a counting TCP relay, with and without the mirror; the bytes the simulator sent are
counted for that round and over an idle window, and reported per minute for agents polling once a
minute. The mirror's size is measured in this process (a mirror of its own on the same simulator, its
objects' deep size) and printed per 1,000 VMs. The gateway's RSS is read after each size's rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH), str(REPO / "tests")]

import floors  # noqa: E402
import httpx2  # noqa: E402
import yaml  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from pyVmomi import vim, vmodl  # noqa: E402
from support.simulator import (  # type: ignore[import-not-found]  # noqa: E402
    Simulator,
    build_simulator,
    credential_prefix,
    start_simulator,
    wait_until,
)

from gateway.config import Credentials, Target  # noqa: E402
from gateway.server.edge.tls import create_certificate  # noqa: E402
from gateway.vsphere import listings, soap_scan  # noqa: E402
from gateway.vsphere.collector import _view_spec, soap_call  # noqa: E402
from gateway.vsphere.mirror import Mirror  # noqa: E402
from gateway.vsphere.pool import SessionPool, VSphereSession  # noqa: E402

GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"
_PC: Any = vmodl.query.PropertyCollector


# ------------------------------------------------------------------------------------------- floors


def _list_vms_spec(view: Any) -> Any:
    queries, _active, _columns = listings._vm_plan(listings.VmQuery())
    return _view_spec(view, queries)


def kept_view(session: VSphereSession) -> Any:
    """The view list_vms reads through: the session's kept view of VMs and hosts (made by the first
    call, as the gateway's sessions keep theirs: ``gateway.vsphere.views``)."""
    content: Any = session.content
    view, _made = session.views.view(content, content.rootFolder, [vim.VirtualMachine, vim.HostSystem])
    return view


def raw_floor(session: VSphereSession, view: Any) -> int:
    """The gateway's list_vms RetrievePropertiesEx, bytes read, nothing decoded; returns the byte count."""
    collector = session.content.propertyCollector
    body = soap_call(session.si._stub, collector, "RetrievePropertiesEx",
                     [[_list_vms_spec(view)], _PC.RetrieveOptions()])
    return len(body)


def pyvmomi_floor(session: VSphereSession, view: Any) -> int:
    """The same request, the reply decoded by pyVmomi."""
    collector = session.content.propertyCollector
    result = collector.RetrievePropertiesEx([_list_vms_spec(view)], _PC.RetrieveOptions())
    return len(result.objects)


def two_property_floor(session: VSphereSession, view: Any) -> int:
    """The old floor: name and power state of every VM, decoded by pyVmomi."""
    traverse = _PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
    spec = _PC.FilterSpec(objectSet=[_PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
                          propSet=[_PC.PropertySpec(type=vim.VirtualMachine,
                                                    pathSet=["name", "runtime.powerState"])])
    result = session.content.propertyCollector.RetrievePropertiesEx([spec], _PC.RetrieveOptions())
    return len(result.objects)


# ------------------------------------------------------------------------------------------- a counting relay


class CountingRelay:
    """A TCP relay to the simulator that counts the bytes the simulator sends back."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self.downstream = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.backend))
                threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
                threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(262144):
                if count:
                    with self._lock:
                        self.downstream += len(data)
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def take(self) -> int:
        with self._lock:
            value, self.downstream = self.downstream, 0
            return value

    def close(self) -> None:
        self.listener.close()


# ------------------------------------------------------------------------------------------- the gateway


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int
    cert: Path
    token: str
    log: Path

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        verify = ssl.create_default_context(cafile=str(self.cert))
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, verify=verify,
                                  timeout=600)
        transport = streamable_http_client(f"https://localhost:{self.port}/mcp", http_client=http)
        async with http, Client(transport, mode="legacy") as client:
            yield client

    def wait_synced(self, target: str, timeout: float) -> None:
        """Until the server logged that ``target``'s mirror is synced (its first sync or a resync)."""
        needle = f"target {target}: mirror synced"
        wait_until(lambda: needle in self.log.read_text(errors="replace"), timeout=timeout, interval=0.2,
                   what=f"{target} mirror synced")


def serve(stack: contextlib.ExitStack, tmp: Path, sim: Simulator, ports: dict[str, int],
          repo: Path = REPO, extra_env: dict[str, str] | None = None) -> Served:
    """``gateway serve --transport https`` with one target per entry of ``ports`` (name -> port of ``sim``
    or of a relay to it); names starting with ``sweep`` have ``mirror: off``. ``repo``: the folder
    holding the ``gateway`` package the server runs (bench/sweep.py passes an older one); ``extra_env``
    added to the child's environment (OTEL_* for bench/tracing.py)."""
    entries = []
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(repo), "GATEWAY_LOG_LEVEL": "INFO",
           **(extra_env or {})}
    for name, port in ports.items():
        prefix = credential_prefix(name)
        entries.append({"name": name, "host": "127.0.0.1", "port": port, "insecure": True,
                        "credential_env_prefix": prefix, "timeout_seconds": 600,
                        "mirror": "off" if name.startswith("sweep") else "lazy",
                        **({"max_staleness_seconds": 3600} if name.startswith("stale") else {})})
        env.update({f"{prefix}_USER": sim.user, f"{prefix}_PASSWORD": sim.password})
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"targets": entries}, sort_keys=False))
    home = tmp / "home"
    home.mkdir(mode=0o700)
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml")})
    # the child's own CLI creates the token, so a side-by-side against another build gets a store of that
    # build's schema (a newer schema stops an older gateway at start); cwd too: `python -c` puts the
    # working directory ahead of PYTHONPATH
    made = subprocess.run([sys.executable, "-c", GATEWAY_MAIN, "token", "create", "bench", "--role", "admin"],
                          env=env, cwd=repo, capture_output=True, text=True, check=True)
    token = made.stdout.splitlines()[0].strip()
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"]).cert
    port = free_port()
    argv = ["serve", "--transport", "https", "--cert", str(cert), "--key", str(cert.with_name("key.pem")),
            "--public-name", "localhost", "--host", "127.0.0.1", "--port", str(port)]
    log = tmp / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=env, cwd=repo,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(stop_process, process)
    try:
        wait_for_https(f"https://localhost:{port}/readyz", cert, process)
    except SystemExit as exc:  # say why: the last lines the server wrote
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"{exc} ({repo}): " + " | ".join(tail)) from None
    return Served(process, port, cert, token, log)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_https(url: str, cert: Path, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    context = ssl.create_default_context(cafile=str(cert))

    def ready() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the gateway exited with {process.returncode} while starting")
        with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=context) as client:
            return client.get(url).status_code == 200
        return False

    wait_until(ready, timeout=timeout, interval=0.2, what=url)


def stop_process(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


async def list_vms(client: Client, target: str) -> float:
    started = time.perf_counter()
    result = await client.call_tool("list_vms", {"target": target})
    elapsed = time.perf_counter() - started
    if result.is_error:
        raise SystemExit(f"list_vms on {target} failed: {result.content}")
    return elapsed


# ------------------------------------------------------------------------------------------- measurements


def deep_size(value: Any, seen: set[int] | None = None) -> int:
    """Bytes held by ``value`` and what it refers to (containers, ObjectProps), each object once."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        size += sum(deep_size(v, seen) for v in value)
    elif isinstance(value, soap_scan.ObjectProps):
        size += deep_size(value.type, seen) + deep_size(value.moid, seen) + deep_size(value.props, seen)
    return size


def mirror_size(sim: Simulator, timeout: float) -> tuple[int, int, float]:
    """(objects, bytes, sync seconds) of a mirror of ``sim`` built in this process."""
    target = Target(name="size", host=sim.host, port=sim.port, insecure=True, timeout_seconds=600,
                    credential_env_prefix="SIZE")
    mirror = Mirror(target, SessionPool(target, Credentials(sim.user, sim.password)))
    started = time.perf_counter()
    mirror.start()
    try:
        wait_until(lambda: mirror.ready, timeout=timeout, interval=0.1, what="in-process mirror synced")
        seconds = time.perf_counter() - started
        with mirror._lock:
            objects = dict(mirror._objects)
        vms = sum(1 for o in objects.values() if o.type == "VirtualMachine")
        return vms, deep_size(objects), seconds
    finally:
        mirror.close()


def interleaved(columns: dict[str, Callable[[], Any]], runs: int,
                settle: Callable[[], object] | None = None) -> dict[str, float]:
    """Median seconds per column over ``runs`` rounds (after one warm-up each), the order rotating; a
    column returning a float reports its own seconds (the part of its work that is the measurement).
    ``settle`` runs before each timed call, untimed (a simulator's garbage collection)."""
    names = list(columns)
    for name in names:
        columns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(runs):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            if settle is not None:
                settle()
            started = time.perf_counter()
            value = columns[name]()
            elapsed = time.perf_counter() - started
            samples[name].append(value if isinstance(value, float) else elapsed)
    return {name: statistics.median(values) for name, values in samples.items()}


@dataclass
class SizeResult:
    vms: int
    reply_bytes: int
    medians: dict[str, float]
    rss_mb: float
    sync_seconds: float | None = None
    mirror_bytes: int | None = None
    polling: dict[str, float] | None = None


def measure(size: int, runs: int, agents: int, polling: bool, sized: bool = False) -> SizeResult:
    """One size's rows; the agents' polling with ``polling``, the mirror's own size with ``polling`` or
    ``sized`` (beside the server's RSS: the largest size's pair is the one ``make bench`` reports)."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-mirror-")))
        started = time.perf_counter()
        sim = start_simulator(binary=build_simulator(), hosts_per_cluster=3, standalone_hosts=1,
                              vms=max(1, size // 2), startup_timeout=3600)
        stack.callback(sim.stop)
        print(f"{size} VMs: simulator up in {time.perf_counter() - started:.0f}s", flush=True)
        counted = ("mirror-counted", "sweep-counted") if polling else ()
        relays = {name: CountingRelay(sim.port) for name in counted}
        for relay in relays.values():
            stack.callback(relay.close)
        served = serve(stack, tmp, sim, {"mirror": sim.port, "stale": sim.port, "sweep": sim.port,
                                         **{n: r.port for n, r in relays.items()}})
        target = Target(name="floor", host=sim.host, port=sim.port, insecure=True, timeout_seconds=600,
                        credential_env_prefix="FLOOR")
        pool = SessionPool(target, Credentials(sim.user, sim.password))
        stack.callback(pool.close)
        reply_bytes = pool.run(lambda s: _with_view(s, raw_floor))
        sync_timeout = 60 + size / 20

        async def gateway_rows() -> tuple[dict[str, float], dict[str, float] | None]:
            async with served.client() as client:
                await list_vms(client, "mirror")  # swept: starts the mirror
                await asyncio.to_thread(served.wait_synced, "mirror", sync_timeout)
                await list_vms(client, "stale")
                await asyncio.to_thread(served.wait_synced, "stale", sync_timeout)

                def over_https(name: str) -> Callable[[], float]:
                    return lambda: asyncio.run_coroutine_threadsafe(list_vms(client, name), loop).result()

                def details_over_https(name: str) -> Callable[[], float]:
                    return lambda: asyncio.run_coroutine_threadsafe(vm_details(client, name), loop).result()

                loop_columns = {
                    "mirror": over_https("mirror"), "stale": over_https("stale"),
                    "sweep": over_https("sweep"),
                    "zero-wait poll": lambda: pool.run(zero_wait_poll),
                    "raw floor": lambda: pool.run(lambda s: _with_view(s, raw_floor)),
                    "pyVmomi floor": lambda: pool.run(lambda s: _with_view(s, pyvmomi_floor)),
                    "2-property floor": lambda: pool.run(lambda s: _with_view(s, two_property_floor)),
                    "details floor": lambda: pool.run(lambda s: floors.vm_details(s, DETAILS_VM)),
                    "details mirror": details_over_https("mirror"),
                    "details sweep": details_over_https("sweep"),
                }
                medians = await asyncio.to_thread(interleaved, loop_columns, runs, lambda: sim.control("/gc"))
            bytes_per_minute = await poll_rows(served, relays, agents, sync_timeout) if polling else None
            return medians, bytes_per_minute

        loop = asyncio.new_event_loop()
        try:
            medians, bytes_per_minute = loop.run_until_complete(gateway_rows())
        finally:
            loop.close()
        rss = served.rss_mb()
        result = SizeResult(size, reply_bytes, medians, rss, polling=bytes_per_minute)
        if polling or sized:
            _count, result.mirror_bytes, result.sync_seconds = mirror_size(sim, sync_timeout)
        return result


DETAILS_VM = "DC0_C0_RP0_VM0"


async def vm_details(client: Client, target: str) -> float:
    started = time.perf_counter()
    result = await client.call_tool("get_vm_details", {"target": target, "vm": DETAILS_VM})
    elapsed = time.perf_counter() - started
    if result.is_error:
        raise SystemExit(f"get_vm_details on {target} failed: {result.content}")
    return elapsed


def zero_wait_poll(session: VSphereSession) -> float:
    """One zero-wait WaitForUpdatesEx on a filter over every VM's name (after its initial read)."""
    content: Any = session.content
    view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
    collector = content.propertyCollector.CreatePropertyCollector()
    try:
        traverse = _PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
        collector.CreateFilter(_PC.FilterSpec(
            objectSet=[_PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
            propSet=[_PC.PropertySpec(type=vim.VirtualMachine, pathSet=["name"])]), partialUpdates=False)
        first = collector.WaitForUpdatesEx("", _PC.WaitOptions(maxWaitSeconds=0))
        started = time.perf_counter()
        collector.WaitForUpdatesEx(first.version, _PC.WaitOptions(maxWaitSeconds=0))
        return time.perf_counter() - started
    finally:
        collector.DestroyPropertyCollector()
        view.DestroyView()


def _with_view(session: VSphereSession, fn: Callable[[VSphereSession, Any], int]) -> int:
    return fn(session, kept_view(session))


IDLE_SECONDS = 20.0


async def poll_rows(served: Served, relays: dict[str, CountingRelay], agents: int,
                    sync_timeout: float) -> dict[str, float]:
    """SOAP bytes per minute from the simulator with ``agents`` agents each polling once a minute."""
    out: dict[str, float] = {}
    async with served.client() as warm:
        await list_vms(warm, "mirror-counted")
        await asyncio.to_thread(served.wait_synced, "mirror-counted", sync_timeout)
        await list_vms(warm, "sweep-counted")
    for name, relay in relays.items():
        clients = [served.client() for _ in range(agents)]
        async with contextlib.AsyncExitStack() as stack:
            opened = [await stack.enter_async_context(c) for c in clients]
            relay.take()
            await asyncio.gather(*(list_vms(c, name) for c in opened))
            round_bytes = relay.take()
        await asyncio.sleep(IDLE_SECONDS)  # the idle traffic of the window: the mirror's waits, if any
        idle_per_minute = relay.take() * 60 / IDLE_SECONDS
        out[name] = round_bytes + idle_per_minute
        out[name + " round"] = round_bytes
        out[name + " idle/min"] = idle_per_minute
    return out


# ------------------------------------------------------------------------------------------- rows


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def mb(count: float) -> str:
    return f"{count / 1e6:,.2f} MB"


def rows(results: list[SizeResult], agents: int) -> list[tuple[str, str, str]]:
    """(what, value, ratio) rows for the results table."""
    out: list[tuple[str, str, str]] = []
    for r in results:
        label = f"list_vms, {r.vms:,} VMs:"
        raw = r.medians["raw floor"]
        out.append((f"{label} raw RetrievePropertiesEx, gateway's property set, bytes read only (floor, "
                    f"{mb(r.reply_bytes)} reply)", ms(raw), "1.00x"))
        for what, key in (("same reply decoded by pyVmomi", "pyVmomi floor"),
                          ("2-property pyVmomi read (older floor: name, power state)", "2-property floor"),
                          ("one zero-wait WaitForUpdatesEx on a filter of all VMs (the freshness poll)",
                           "zero-wait poll"),
                          ("over HTTPS from the mirror (fresh: zero-wait poll first)", "mirror"),
                          ("over HTTPS from the mirror (max_staleness_seconds: no poll)", "stale"),
                          ("over HTTPS sweeping (mirror: off)", "sweep")):
            out.append((f"{label} {what}", ms(r.medians[key]), f"{r.medians[key] / raw:.2f}x"))
        details, one = r.medians["details floor"], f"get_vm_details, {r.vms:,} VMs:"
        out.append((f"{one} bare pyVmomi with the gateway's requests (name sweep, one retrieval; floor)",
                    ms(details), "1.00x"))
        for what, key in (("over HTTPS, the VM named by the mirror (no name sweep)", "details mirror"),
                          ("over HTTPS sweeping names (mirror: off)", "details sweep")):
            out.append((f"{one} {what}", ms(r.medians[key]), f"{r.medians[key] / details:.2f}x"))
        if r.mirror_bytes is not None:
            out.append((f"{label} server RSS after the {r.vms:,}-VM rows, beside its two mirrors' own "
                        f"objects ({2 * r.mirror_bytes / 1e6:,.0f} MB: targets mirror and stale)",
                        f"{r.rss_mb:,.0f} MB", f"{r.rss_mb * 1e6 / (2 * r.mirror_bytes):.1f}x"))
        else:
            out.append((f"{label} gateway RSS after these calls", f"{r.rss_mb:,.0f} MB", ""))
        if r.mirror_bytes is not None and r.sync_seconds is not None:
            out.append((f"{label} mirror size per 1,000 VMs (deep size of its objects)",
                        f"{r.mirror_bytes / r.vms * 1000 / 1e6:,.2f} MB", ""))
            out.append((f"{label} mirror first sync (in-process)", f"{r.sync_seconds:,.1f} s", ""))
        if r.polling:
            sweep, mirror = r.polling["sweep-counted"], r.polling["mirror-counted"]
            out.append((f"{label} {agents} agents polling once a minute: SOAP bytes/min from the simulator, "
                        "sweeping", mb(sweep), "1.00x"))
            round_, idle = r.polling["mirror-counted round"], r.polling["mirror-counted idle/min"]
            out.append((f"{label} same, from the mirror (round {mb(round_)} + idle {mb(idle)}/min)",
                        mb(mirror), f"{mirror / sweep:.3f}x"))
    return out


def run(vms: int, runs: int, scale: list[int], agents: int) -> list[tuple[str, str, str]]:
    sizes = sorted(set(scale) | {vms})
    results = []
    for size in sizes:
        try:
            results.append(measure(size, runs, agents, polling=size == vms, sized=size == sizes[-1]))
        except (SystemExit, TimeoutError, Exception) as exc:  # report what this machine allowed
            print(f"{size} VMs: not measured ({type(exc).__name__}: {exc})", flush=True)
            note = (f"list_vms, {size:,} VMs: not measured on this machine", type(exc).__name__, "")
            return [*rows(results, agents), note]
    return rows(results, agents)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--scale", default="300,3000,30000", help="comma-separated VM counts for scale rows")
    parser.add_argument("--agents", type=int, default=8)
    args = parser.parse_args(argv)
    scale = [int(n) for n in args.scale.split(",") if n]
    table = run(args.vms, args.runs, scale, args.agents)
    print(f"\n{datetime.now():%Y-%m-%d %H:%M} `python bench/mirror.py {' '.join(argv or sys.argv[1:])}`\n")
    print("| what | value | ratio |\n| --- | --- | --- |")
    for what, value, ratio in table:
        print(f"| {what} | {value} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
