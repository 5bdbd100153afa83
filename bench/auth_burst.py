"""Server memory under a burst of wrong secrets: RSS of `gateway serve --transport https` while N
connections at once send a well-formed token whose id exists and whose secret is wrong (the costly
case: each such request may run an argon2id check at the hash's memory cost), against its idle RSS.

Plain script: ``python bench/auth_burst.py [--connections 300] [--memory-kib 65536]``. It starts the
server in a throwaway home (one target on a closed port: nothing reaches vSphere), creates two tokens
with production argon2 costs, measures, and prints one table: idle RSS, peak RSS during the burst, the
ratio, the answers the burst got, and the answer and latency of a valid token sent mid-burst.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2
from argon2 import PasswordHasher

from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store import SqliteStore

REPO = Path(__file__).resolve().parent.parent


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


class Sampler:
    """Samples a process's RSS every few milliseconds in a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            self._stop.wait(0.005)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


def start(home: Path, cert: Path, key: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    targets = home / "targets.yaml"
    targets.write_text(f"targets:\n  - name: vc1\n    host: 127.0.0.1\n    port: {closed_port()}\n"
                       "    credential_env_prefix: VC1\n    insecure: true\n")
    env = {"PATH": os.environ.get("PATH", ""), "GATEWAY_HOME": str(home),
           "GATEWAY_TARGETS_FILE": str(targets), "VC1_USER": "u", "VC1_PASSWORD": "p",
           "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", "from gateway.cli import main; raise SystemExit(main())", "serve",
            "--transport", "https", "--cert", str(cert), "--key", str(key), "--public-name", "localhost",
            "--host", "127.0.0.1", "--port", "0", "--max-concurrent", "1000"]
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"running on https://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
        if found:
            return process, int(found.group(1))
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the gateway did not start:\n{log.read_text(errors='replace')[-2000:]}")


async def burst(base: str, tls: ssl.SSLContext, wrong: str, valid: str, connections: int
                ) -> tuple[Counter[int], int, float]:
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=0)
    statuses: Counter[int] = Counter()
    async with httpx2.AsyncClient(base_url=base, verify=tls, limits=limits, timeout=120) as attackers, \
            httpx2.AsyncClient(base_url=base, verify=tls, timeout=120) as honest:
        async def attack() -> None:
            try:
                statuses[(await attackers.get("/metrics", headers={"Authorization": f"Bearer {wrong}"}))
                         .status_code] += 1
            except httpx2.HTTPError:
                statuses[0] += 1

        tasks = [asyncio.create_task(attack()) for _ in range(connections)]
        await asyncio.sleep(0.2)  # the burst is under way
        started = time.perf_counter()
        answer = await honest.get("/metrics", headers={"Authorization": f"Bearer {valid}"})
        latency = time.perf_counter() - started
        await asyncio.gather(*tasks)
    return statuses, answer.status_code, latency


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--memory-kib", type=int, default=65536, help="argon2 memory cost of the tokens")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        hasher = PasswordHasher(memory_cost=args.memory_kib)
        with SqliteStore(home / "state.db") as store:
            now = time.time()
            victim, _ = create_token(store, "victim", "reader", expires_in=None, now=now, hasher=hasher)
            valid, _ = create_token(store, "valid", "reader", expires_in=None, now=now, hasher=hasher)
        paths = create_certificate(Path(tmp) / "tls", ["localhost"], ["127.0.0.1"])
        process, port = start(home, paths.cert, paths.key, Path(tmp) / "serve.log")
        try:
            tls = ssl.create_default_context(cafile=str(paths.cert))
            base = f"https://localhost:{port}"
            with httpx2.Client(base_url=base, verify=tls) as warm:
                warm.get("/healthz")
            time.sleep(1.0)  # let start-up allocations settle before the idle reading
            idle = rss_kib(process.pid)
            wrong = victim[:-6] + ("AAAAAA" if not victim.endswith("AAAAAA") else "BBBBBB")
            with Sampler(process.pid) as sampler:
                statuses, valid_status, latency = asyncio.run(
                    burst(base, tls, wrong, valid, args.connections))
            peak = max(sampler.peak, rss_kib(process.pid))
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    print(f"wrong-secret burst: {args.connections} connections at once, argon2 memory {args.memory_kib} KiB")
    print(f"{'idle RSS':<34}{idle / 1024:>10.1f} MiB")
    print(f"{'peak RSS during the burst':<34}{peak / 1024:>10.1f} MiB{peak / idle:>8.2f}x idle")
    print(f"{'burst answers':<34}{', '.join(f'{code}: {n}' for code, n in sorted(statuses.items()))}")
    print(f"{'valid token mid-burst':<34}{valid_status:>10d}   {latency * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
