"""PostgreSQL against SQLite, one run, ratios printed (a real PostgreSQL is started for the run).

    python bench/postgres.py [--checks 3000] [--rows 1500] [--reads 200]

- cached token check: ``TokenAuthenticator.verify`` of a token already proven (the per-request path:
  it reads the token change counter from the store every time), per engine;
- a small read over HTTPS: ``list_vms`` on a two-VM simulator through ``gateway serve --transport https``
  with the SDK client (2026-07-28 revision), milliseconds per call, one server per engine;
- throughput of 16 agents (each its own client, ``--calls`` list_vms calls) on 4 simulated targets through
  Debian's nginx (deploy/nginx/gateway-replicas.conf), with one replica and with two, on PostgreSQL;
- audit appends per second into the PostgreSQL table from two processes at once (two replicas), and
  whether the chain verifies afterwards; the JSONL file's durable two-process rate beside it.
Figures depend on the machine (shared, 2 cores here); compare the ratios, not the absolute values.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import anyio  # noqa: E402
import httpx2  # noqa: E402
from argon2 import PasswordHasher  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from support.postgres import discard, start_postgres  # noqa: E402
from support.simulator import write_targets  # noqa: E402

from gateway.audit.pg_reader import PgAuditReader  # noqa: E402
from gateway.audit.verify import verify  # noqa: E402
from gateway.auth.tokens import TokenAuthenticator, create_token  # noqa: E402
from gateway.dev.simulators import SimulatorProcess, start_simulator  # noqa: E402
from gateway.server.edge.tls import create_certificate  # noqa: E402
from gateway.store import SqliteStore, StateStore  # noqa: E402
from gateway.store.postgres import PostgresStore  # noqa: E402

HASH = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
EVENT = ('{"phase": "call", "tool": "get_vm_details", "target": "prod-vc1", "caller": "ops-agent", '
         '"args": {"vm": "web-1"}, "outcome": "ok", "result": {"name": "web-1", "cpus": 4}}')
APPENDER = """
import json, os, sys, time
sys.path.insert(0, os.environ["ROOT"])
event = json.loads(os.environ["EVENT"])
if os.environ.get("STORE_AT"):
    from gateway.store.postgres import PostgresStore
    from gateway.audit.pg_sink import PgAuditSink
    store = PostgresStore(os.environ["STORE_AT"], max_size=2)
    sink = PgAuditSink(store)
else:
    from gateway.audit.file_sink import AuditSink
    sink = AuditSink(os.environ["AUDIT_FILE"])
sys.stdin.readline()
start = time.time()
for _ in range(int(sys.argv[1])):
    sink.write(event)
print(start, time.time(), flush=True)
"""


def token_checks(store: StateStore, checks: int) -> float:
    """Microseconds per cached token check."""
    token, _ = create_token(store, "bench", "reader", expires_in=None, now=time.time(), hasher=HASH)
    auth = TokenAuthenticator(store, hasher=HASH)
    assert auth.verify(token) is not None  # proven once: the rest take the cached path
    start = time.perf_counter()
    for _ in range(checks):
        auth.verify(token)
    return (time.perf_counter() - start) / checks * 1e6


GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"


def https_reads(sim: SimulatorProcess, tmp: Path, url: str | None, calls: int) -> float:
    """Milliseconds per small read (list_vms, two VMs) over HTTPS, on PostgreSQL when ``url`` is given,
    else on SQLite; the server and the client's connection are warmed up outside the timing."""
    home = tmp / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp / "targets.yaml", {"vc1": sim})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml"),
                "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)})
    store: StateStore = SqliteStore(home / "state.db")
    if url is not None:
        env["GATEWAY_DATABASE_URL"] = url
        store.close()
        store = PostgresStore(url)
    with store:
        token, _ = create_token(store, "bench", "admin", expires_in=None, now=time.time(), hasher=HASH)
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["serve", "--transport", "https", "--cert", str(cert.cert), "--key", str(cert.key),
            "--public-name", "localhost", "--host", "127.0.0.1", "--port", str(port)]
    base = f"https://localhost:{port}"
    tls = ssl.create_default_context(cafile=str(cert.cert))
    with (tmp / "serve.log").open("wb") as out:
        process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=env, cwd=ROOT,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / "serve.log").read_text(errors="replace")[-2000:])
            with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=tls) as probe_http:
                if probe_http.get(f"{base}/readyz").status_code == 200:
                    break
            time.sleep(0.2)

        async def timed() -> float:
            http = httpx2.AsyncClient(verify=tls, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http),
                                    mode="2026-07-28") as client:
                for _ in range(5):
                    assert not (await client.call_tool("list_vms", {"target": "vc1"})).is_error
                start = time.perf_counter()
                for _ in range(calls):
                    assert not (await client.call_tool("list_vms", {"target": "vc1"})).is_error
                return (time.perf_counter() - start) / calls * 1e3

        return anyio.run(timed)
    finally:
        process.terminate()
        process.wait(30)


def agents_through_nginx(sims: dict[str, SimulatorProcess], tmp: Path, url: str, token: str, replicas: int,
                         agents: int, calls: int) -> float:
    """Calls per second of ``agents`` concurrent agents spread over the targets, through nginx
    round-robin in front of ``replicas`` (1 or 2) ``gateway serve --transport http`` on PostgreSQL."""
    from test_deploy import NGINX_MAIN, free_port, need, stop, wait_for_port
    from test_replicas import _serve, replicas_site

    tmp.mkdir()
    env = write_targets(tmp / "targets.yaml", sims)
    env.update({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT), "GATEWAY_DATABASE_URL": url,
                "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml")})
    ports = [free_port() for _ in range(replicas)]
    processes = []
    try:
        for index, port in enumerate(ports):
            home = tmp / f"home-{index}"
            home.mkdir(mode=0o700)
            processes.append(_serve({**env, "GATEWAY_HOME": str(home)}, port, tmp / f"{index}.log"))
        for index, (process, port) in enumerate(zip(processes, ports, strict=True)):
            wait_for_port(port, process, tmp / f"{index}.log")
        listen = free_port()
        cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
        upstream = (ports[0], ports[-1])  # one replica: both upstream lines name it
        (tmp / "gateway.conf").write_text(replicas_site(upstream, listen, cert.cert, cert.key))
        (tmp / "nginx.conf").write_text(NGINX_MAIN.format(tmp=tmp))
        proxy = subprocess.Popen([need("nginx", "nginx-light"), "-p", str(tmp), "-c", str(tmp / "nginx.conf"),
                                  "-e", str(tmp / "error.log")], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(listen, proxy, tmp / "error.log")
            base = f"https://localhost:{listen}"
            tls = ssl.create_default_context(cafile=str(cert.cert))
            names = sorted(sims)

            async def agent(index: int) -> None:
                http = httpx2.AsyncClient(verify=tls, headers={"Authorization": f"Bearer {token}"},
                                          timeout=120)
                async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http),
                                        mode="2026-07-28") as client:
                    for _ in range(calls):
                        result = await client.call_tool("list_vms", {"target": names[index % len(names)]})
                        assert not result.is_error, result.content

            async def run() -> float:
                async with anyio.create_task_group() as warm:  # logins to every target outside the timing
                    for i in range(len(names) * replicas):
                        warm.start_soon(agent, i)
                start = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for i in range(agents):
                        group.start_soon(agent, i)
                return agents * calls / (time.perf_counter() - start)

            return anyio.run(run)
        finally:
            stop(proxy)
    finally:
        for process in processes:
            stop(process)


def two_appenders(rows: int, env: dict[str, str]) -> float:
    """Rows per second of two processes appending together."""
    full = {**os.environ, "ROOT": str(ROOT), "EVENT": EVENT, **env}
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(rows)], env=full,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    spans = [tuple(map(float, proc.communicate(timeout=600)[0].split())) for proc in procs]
    return 2 * rows / (max(end for _, end in spans) - min(start for start, _ in spans))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=1500)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--calls", type=int, default=10, help="calls per agent in the throughput rows")
    args = parser.parse_args()
    server = start_postgres()
    sim = start_simulator()
    try:
        with tempfile.TemporaryDirectory() as tmp, SqliteStore(Path(tmp) / "state.db") as lite, \
                PostgresStore(server.create_database()) as pg:
            sqlite_us, pg_us = token_checks(lite, args.checks), token_checks(pg, args.checks)
            (Path(tmp) / "lite").mkdir()
            (Path(tmp) / "pg").mkdir()
            lite_ms = https_reads(sim, Path(tmp) / "lite", None, args.reads)
            pg_ms = https_reads(sim, Path(tmp) / "pg", server.create_database(), args.reads)
            shared = server.create_database()
            with PostgresStore(shared) as agents_store:
                token, _ = create_token(agents_store, "agents", "admin", expires_in=None, now=time.time(),
                                        hasher=HASH)
            sims = {f"vc{i}": start_simulator() for i in range(1, 5)}
            try:
                rates = [agents_through_nginx(sims, Path(tmp) / f"r{n}", shared, token, n, 16, args.calls)
                         for n in (1, 2)]
            finally:
                for each in sims.values():
                    each.stop()
            url = server.create_database()
            pg_rate = two_appenders(args.rows, {"STORE_AT": url})
            with PostgresStore(url) as check:
                report = PgAuditReader(check).verify()
            audit_file = Path(tmp) / "audit.jsonl"
            file_rate = two_appenders(args.rows, {"AUDIT_FILE": str(audit_file)})
            file_ok = verify(audit_file).ok
    finally:
        sim.stop()
        discard(server)
    print(f"cached token check: sqlite {sqlite_us:.0f} us, postgresql {pg_us:.0f} us "
          f"(+{pg_us - sqlite_us:.0f} us per call, x{pg_us / sqlite_us:.1f})")
    print(f"small read over HTTPS (list_vms, 2 VMs): sqlite {lite_ms:.1f} ms, postgresql {pg_ms:.1f} ms "
          f"(+{pg_ms - lite_ms:.1f} ms per call, x{pg_ms / lite_ms:.2f})")
    print(f"16 agents on 4 targets through nginx: one replica {rates[0]:.1f} calls/s, two replicas "
          f"{rates[1]:.1f} calls/s (x{rates[1] / rates[0]:.2f})")
    print(f"audit appends, 2 processes at once: postgresql {pg_rate:.0f} rows/s (chain verifies: "
          f"{report.ok}, {report.rows} rows); jsonl file (durable) {file_rate:.0f} rows/s "
          f"(verifies: {file_ok}); "
          f"ratio pg/file x{pg_rate / file_rate:.2f}")
    print("note: the test server runs with fsync=off (throwaway data directory); a production server "
          "flushes every commit, so its append rate is bounded by its disk")


if __name__ == "__main__":
    main()
