"""Server memory across floods of made-up tokens: RSS of `gateway serve --transport https` before and
after two identical floods of requests carrying invented ``gwt_`` tokens from one address, and the
list_targets latency of a valid agent idle and during a flood.

Plain script: ``python bench/flood.py [--requests 4000] [--concurrency 1000] [--floods 2]
[--tracemalloc DIR]``. It starts the server in a throwaway home (one target on a closed port:
nothing reaches vSphere). With ``--tracemalloc DIR`` the server runs under ``tracemalloc`` and dumps
a snapshot into DIR after each phase (on SIGUSR1); the script prints the top growth between the
snapshots taken before and after each flood. The soak bench (bench/soak.py) reuses its pieces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import socket
import ssl
import statistics
import string
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2
from argon2 import PasswordHasher
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store import SqliteStore

REPO = Path(__file__).resolve().parent.parent
#: the server's entry point: `gateway serve`, under tracemalloc with a SIGUSR1 snapshot when asked
SERVE_MAIN = """
import os, signal, sys, tracemalloc
where = os.environ.get("BENCH_TRACEMALLOC_DIR")
if where:
    tracemalloc.start(int(os.environ.get("BENCH_TRACEMALLOC_FRAMES", "6")))
    taken = [0]
    def dump(_sig, _frame):
        import gc
        gc.collect()
        taken[0] += 1
        path = os.path.join(where, f"snapshot-{taken[0]}.pickle")
        tracemalloc.take_snapshot().dump(path + ".part")
        os.replace(path + ".part", path)
    signal.signal(signal.SIGUSR1, dump)
if os.environ.get("BENCH_TRIM_SIGNAL"):
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    signal.signal(signal.SIGUSR2, lambda _sig, _frame: libc.malloc_trim(0))
from gateway.cli import main
raise SystemExit(main())
"""
ALPHABET = string.ascii_lowercase + string.digits
SECRET_ALPHABET = string.ascii_letters + string.digits + "-_"


def made_up_token() -> str:
    """A well-formed gateway token whose id is stored nowhere (the cheap refusal: no argon2)."""
    return ("gwt_" + "".join(secrets.choice(ALPHABET) for _ in range(12)) + "_"
            + "".join(secrets.choice(SECRET_ALPHABET) for _ in range(43)))


def proc_status(pid: int) -> dict[str, int]:
    """RSS (KiB), threads and open file descriptors of ``pid``."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            found["rss_kib"] = int(line.split()[1])
        elif line.startswith("Threads:"):
            found["threads"] = int(line.split()[1])
    found["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return found


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    cert: Path
    home: Path
    log: Path
    tokens: dict[str, str]
    snapshots: Path | None

    @property
    def base(self) -> str:
        return getattr(self, "base_override", None) or f"https://localhost:{self.port}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))

    def status(self) -> dict[str, int]:
        return proc_status(self.process.pid)

    def snapshot(self, timeout: float = 120.0) -> Path | None:
        """Ask the server for a tracemalloc snapshot and wait for its file (None without tracemalloc)."""
        if self.snapshots is None:
            return None
        before = set(self.snapshots.glob("snapshot-*.pickle"))
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = set(self.snapshots.glob("snapshot-*.pickle")) - before
            if new:
                return new.pop()
            time.sleep(0.2)
        raise SystemExit("the server wrote no tracemalloc snapshot")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_server(tmp: Path, *, snapshots: Path | None = None, extra_env: dict[str, str] | None = None,
                 targets_yaml: str | None = None, extra_argv: tuple[str, ...] = (),
                 roles: tuple[tuple[str, str, str], ...] = (("agent", "reader", "agent"),),
                 home_files: dict[str, str] | None = None, preamble: str = "") -> Server:
    """`gateway serve` over HTTPS in a fresh home under ``tmp``; ``roles``: (token name, role, kind);
    ``home_files``: name -> text written into the home (roles.yaml, rules.yaml); ``preamble``: Python
    run in the server process before the gateway starts."""
    home = tmp / "home"
    home.mkdir(mode=0o700)
    for name, text in (home_files or {}).items():
        (home / name).write_text(text)
        (home / name).chmod(0o600)
    targets = tmp / "targets.yaml"
    targets.write_text(targets_yaml or (
        f"targets:\n  - name: vc1\n    host: 127.0.0.1\n    port: {closed_port()}\n"
        "    credential_env_prefix: VC1\n    insecure: true\n"))
    hasher = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    tokens: dict[str, str] = {}
    with SqliteStore(home / "state.db") as store:
        for name, role, kind in roles:
            tokens[name] = create_token(store, name, role, expires_in=None, now=time.time(), hasher=hasher,
                                        kind=kind)[0]  # type: ignore[arg-type]
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
    env = {"PATH": os.environ.get("PATH", ""), "GATEWAY_HOME": str(home),
           "GATEWAY_TARGETS_FILE": str(targets), "VC1_USER": "u", "VC1_PASSWORD": "p",
           "PYTHONPATH": str(REPO), **(extra_env or {})}
    if snapshots is not None:
        snapshots.mkdir(parents=True, exist_ok=True)
        env["BENCH_TRACEMALLOC_DIR"] = str(snapshots)
    argv = [sys.executable, "-c", preamble + SERVE_MAIN, "serve", "--transport", "https",
            "--cert", str(cert.cert),
            "--key", str(cert.key), "--public-name", "localhost", "--host", "127.0.0.1", "--port", "0",
            *extra_argv]
    log = tmp / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"running on https://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
        if found:
            return Server(process, int(found.group(1)), cert.cert, home, log, tokens, snapshots)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the gateway did not start:\n{log.read_text(errors='replace')[-3000:]}")


async def flood(server: Server, requests: int, concurrency: int, path: str = "/mcp",
                source: str | None = None) -> Counter[int]:
    """``requests`` POSTs with made-up tokens, ``concurrency`` connections at once (one request each),
    from the loopback address ``source`` when given (127.0.0.2: not the valid callers' address)."""
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=0)
    transport = httpx2.AsyncHTTPTransport(verify=server.tls(), limits=limits, local_address=source)
    statuses: Counter[int] = Counter()
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    gate = asyncio.Semaphore(concurrency)
    async with httpx2.AsyncClient(base_url=server.base, transport=transport, timeout=120) as attackers:
        async def one() -> None:
            async with gate:
                try:
                    answer = await attackers.post(path, content=body, headers={
                        **headers, "Authorization": f"Bearer {made_up_token()}"})
                    statuses[answer.status_code] += 1
                except httpx2.HTTPError:
                    statuses[0] += 1

        await asyncio.gather(*(one() for _ in range(requests)))
    return statuses


@asynccontextmanager
async def agent(server: Server, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, verify=server.tls(), timeout=120)
    transport = streamable_http_client(f"{server.base}/mcp", http_client=http)
    async with http, Client(transport, mode="legacy") as client:
        yield client


async def timed_calls(client: Client, tool: str, stop: asyncio.Event | None, count: int = 20,
                      args: dict[str, object] | None = None) -> list[float]:
    """Seconds per call of ``tool``: ``count`` calls, or calls until ``stop`` is set (at least one)."""
    times: list[float] = []
    while True:
        started = time.perf_counter()
        result = await client.call_tool(tool, args or {})
        times.append(time.perf_counter() - started)
        if result.is_error:
            raise SystemExit(f"{tool} failed: {result.content}")
        if (stop is not None and stop.is_set()) or (stop is None and len(times) >= count):
            return times


def attacker(server: Server, requests: int, concurrency: int, source: str | None = None
             ) -> subprocess.Popen[bytes]:
    """A flood in a child process of its own, so the valid agent's timings measure the server, not
    this process's event loop busy with a thousand handshakes; it prints the answers' counts as JSON."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--attack", server.base,
            "--cert", str(server.cert), "--requests", str(requests), "--concurrency", str(concurrency),
            *(["--source", source] if source else [])]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)


def attack_main(base: str, cert: Path, requests: int, concurrency: int, source: str | None) -> int:
    target = Server(None, 0, cert, Path(), Path(), {}, None)  # type: ignore[arg-type]
    target.base_override = base  # type: ignore[attr-defined]
    statuses = asyncio.run(flood(target, requests, concurrency, source=source))
    print(json.dumps({str(k): v for k, v in statuses.items()}))
    return 0


async def flood_with_agent(server: Server, requests: int, concurrency: int
                           ) -> tuple[Counter[int], list[float]]:
    """A flood from a child process while a valid agent calls list_targets over its own session."""
    async with agent(server, server.tokens["agent"]) as client:
        await timed_calls(client, "list_targets", None, 3)
        child = attacker(server, requests, concurrency)
        times: list[float] = []
        try:
            while child.poll() is None:
                times += await timed_calls(client, "list_targets", None, 1)
        finally:
            out, _ = await asyncio.to_thread(child.communicate)
        return Counter({int(k): v for k, v in json.loads(out).items()}), times


async def idle_calls(server: Server, count: int = 30) -> list[float]:
    async with agent(server, server.tokens["agent"]) as client:
        await timed_calls(client, "list_targets", None, 3)
        return await timed_calls(client, "list_targets", None, count)


def settle_rss(server: Server, seconds: float = 3.0) -> int:
    """The server's RSS once it has been quiet for ``seconds`` (the refused-token audit flushes, the
    flood's connections close)."""
    time.sleep(seconds)
    return server.status()["rss_kib"]


def growth(before: Path, after: Path, top: int = 12) -> list[str]:
    """The largest allocation growth between two tracemalloc snapshots, by traceback."""
    old = tracemalloc.Snapshot.load(str(before))
    new = tracemalloc.Snapshot.load(str(after))
    keep = [tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),
            tracemalloc.Filter(False, tracemalloc.__file__)]
    diff = new.filter_traces(keep).compare_to(old.filter_traces(keep), "traceback")
    total = sum(s.size_diff for s in diff)
    lines = [f"  traced total {total / 1024:+.1f} KiB in {sum(s.count_diff for s in diff):+d} blocks"]
    for stat in diff[:top]:
        frames = [f for f in stat.traceback if "/site-packages/" not in f.filename
                  or "uvicorn" in f.filename or "starlette" in f.filename or "mcp" in f.filename]
        shown = (frames or list(stat.traceback))[:4]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in shown)
        lines.append(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {where}")
    return lines


def p50(times: list[float]) -> float:
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--floods", type=int, default=2)
    parser.add_argument("--tracemalloc", type=Path, default=None,
                        help="dump server snapshots into this folder")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    parser.add_argument("--attack", default=None, help=argparse.SUPPRESS)  # the child: flood this base URL
    parser.add_argument("--cert", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack:
        return attack_main(args.attack, args.cert, args.requests, args.concurrency, args.source)
    extra = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        server = start_server(Path(tmp), snapshots=args.tracemalloc, extra_env=extra)
        try:
            idle = asyncio.run(idle_calls(server))
            rss = [settle_rss(server, 1.0)]
            shots = [server.snapshot()]
            during: list[list[float]] = []
            answers: list[Counter[int]] = []
            for _ in range(args.floods):
                statuses, times = asyncio.run(flood_with_agent(server, args.requests, args.concurrency))
                answers.append(statuses)
                during.append(times)
                rss.append(settle_rss(server))
                if extra.get("BENCH_TRIM_SIGNAL"):
                    print(f"before malloc_trim {rss[-1] / 1024:.1f} MiB", flush=True)
                    server.process.send_signal(signal.SIGUSR2)
                    rss[-1] = settle_rss(server, 1.0)
                shots.append(server.snapshot())
            status = server.status()
        except BaseException:
            print(server.log.read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            server.stop()
    print(f"floods of {args.requests} made-up gwt_ tokens, {args.concurrency} at a time, one address"
          + (f" (server env {' '.join(args.env)})" if args.env else ""))
    print(f"{'RSS before':<32}{rss[0] / 1024:>9.1f} MiB")
    for n, (statuses, times) in enumerate(zip(answers, during, strict=True), 1):
        ratio = rss[n] / rss[n - 1]
        print(f"{f'RSS after flood {n}':<32}{rss[n] / 1024:>9.1f} MiB {ratio:>6.3f}x the reading before"
              f"   answers {', '.join(f'{c}: {k}' for c, k in sorted(statuses.items()))}")
        print(f"{f'list_targets p50 in flood {n}':<32}{p50(times):>9.1f} ms "
              f"{p50(times) / p50(idle):>6.2f}x idle   ({len(times)} calls)")
    print(f"{'list_targets p50 idle':<32}{p50(idle):>9.1f} ms   ({len(idle)} calls)")
    print(f"{'after the floods':<32}threads {status['threads']}, open fds {status['fds']}")
    if args.tracemalloc is not None:
        for n in range(1, len(shots)):
            before, after = shots[n - 1], shots[n]
            assert before is not None and after is not None
            print(f"tracemalloc growth over flood {n}:")
            print("\n".join(growth(before, after)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
