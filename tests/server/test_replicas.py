"""Two ``gateway serve`` replicas on one PostgreSQL behind Debian's nginx with plain round-robin: real
processes, real server, real simulator, the real MCP client SDK.

- An agent speaking the stateless 2026-07-28 revision works through the balancer whichever replica
  answers each request (both do).
- A proposal made through replica A is confirmed through replica B; eight confirms racing across both
  execute it exactly once.
- A token revoked with the CLI is refused by both replicas on the next request.
- The audit chain written by both replicas verifies.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from argon2 import PasswordHasher
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import GATEWAY_MAIN
from support.postgres import PgServer, discard, start_postgres
from support.processes import NGINX_MAIN, free_port, local_nginx_recipe, need, stop, wait_for_port
from support.simulator import MakeSimulator, Simulator, complete_rules_text, wait_until, write_targets

from gateway.auth.roles import load_roles
from gateway.auth.tokens import create_token
from gateway.cli import build_parser
from gateway.config import parse_targets
from gateway.server.edge.tls import create_certificate
from gateway.settings import Settings
from gateway.store.postgres import PostgresStore, display_url

REPO = Path(__file__).resolve().parents[2]
FAST_HASH = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
MODE = "2026-07-28"  # the stateless revision: any replica serves any request


@dataclass
class Replicas:
    sim: Simulator
    token: str
    ports: tuple[int, int]  # the replicas' own loopback ports (plain HTTP)
    balancer: int  # nginx, TLS
    cert: Path
    env: dict[str, str]
    logs: tuple[Path, Path]
    pg_url: str
    processes: list[subprocess.Popen[bytes]]


def replicas_site(ports: tuple[int, int], listen_port: int, cert: Path, key: Path) -> str:
    """deploy/nginx/gateway-replicas.conf with its addresses, name and certificate paths made local."""
    upstreams = {"server 127.0.0.1:8080 ": f"server 127.0.0.1:{ports[0]} ",
                 "server 127.0.0.1:8081 ": f"server 127.0.0.1:{ports[1]} "}
    return local_nginx_recipe("gateway-replicas.conf", upstreams, listen_port, cert, key)


def _serve(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = ["serve", "--transport", "http", "--port", str(port), "--public-name", "localhost",
            "--forwarded-allow-ips", "127.0.0.1", "--enable-destructive"]
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], env=env, cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)


@pytest.fixture
def replicas(make_simulator: MakeSimulator, pg_server: PgServer, pg_url: str,
             tmp_path: Path) -> Iterator[Replicas]:
    nginx = need("nginx", "nginx-light")
    sim = make_simulator()
    with closing(PostgresStore(pg_url)) as store:
        token, _ = create_token(store, "agent", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    # pool_size 1: at most one vSphere call at a time on vc1, across both replicas together
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim}, {"vc1": {"pool_size": 1}})
    (tmp_path / "rules.yaml").write_text(
        complete_rules_text("defaults:\n  read: allow\n  write: allow\n  destructive: allow\n"))
    # the database URL (with its password) travels in the environment, never on a command line
    env.update({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "GATEWAY_DATABASE_URL": pg_url,
                "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "GATEWAY_RULES_FILE": str(tmp_path / "rules.yaml")})
    ports = (free_port(), free_port())
    logs = (tmp_path / "a.log", tmp_path / "b.log")
    processes = []
    try:
        for name, port, log in zip("ab", ports, logs, strict=True):
            home = tmp_path / f"home-{name}"
            home.mkdir(mode=0o700)
            processes.append(_serve({**env, "GATEWAY_HOME": str(home)}, port, log))
        for process, port, log in zip(processes, ports, logs, strict=True):
            wait_for_port(port, process, log)
        listen = free_port()
        cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
        site = replicas_site(ports, listen, cert.cert, cert.key)
        (tmp_path / "gateway.conf").write_text(site)
        (tmp_path / "nginx.conf").write_text(NGINX_MAIN.format(tmp=tmp_path))
        with (tmp_path / "nginx.out").open("wb") as sink:
            proxy = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                                      "-e", str(tmp_path / "error.log")],
                                     stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_for_port(listen, proxy, tmp_path / "error.log")
            cli_env = {**env, "GATEWAY_HOME": str(tmp_path / "cli")}
            yield Replicas(sim, token, ports, listen, cert.cert, cli_env, logs, pg_url, processes)
        finally:
            stop(proxy)
    finally:
        for process in processes:
            stop(process)


def _http(base: str, token: str, cert: Path | None) -> httpx2.AsyncClient:
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(cert)) if cert else False
    return httpx2.AsyncClient(base_url=base, verify=verify, timeout=60,
                              headers={"Authorization": f"Bearer {token}"})


async def _call(base: str, token: str, cert: Path | None, tool: str,
                args: dict[str, Any]) -> tuple[bool, Any]:
    http = _http(base, token, cert)
    transport = streamable_http_client(f"{base}/mcp", http_client=http)
    async with http, Client(transport, mode=MODE) as client:
        result = await client.call_tool(tool, args)
    try:
        return bool(result.is_error), answer_of(result)
    except (AssertionError, ValueError):  # not the gateway's JSON: show what came back
        return bool(result.is_error), [c.model_dump() for c in result.content]


def _replica(r: Replicas, index: int) -> str:
    # a replica's own port, as nginx reaches it (Host names the public name; the check allows it)
    return f"http://localhost:{r.ports[index]}"


def _gateway_cli(r: Replicas, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", GATEWAY_MAIN, *args], env=r.env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def _served_mcp(log: Path) -> int:
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "POST /mcp" in line)


def test_round_robin_serves_an_agent_from_both_replicas(replicas: Replicas) -> None:
    base = f"https://localhost:{replicas.balancer}"

    async def agent() -> list[bool]:
        return [(await _call(base, replicas.token, replicas.cert, "list_vms", {"target": "vc1"}))[0]
                for _ in range(4)]

    assert anyio.run(agent) == [False] * 4
    assert all(_served_mcp(log) > 0 for log in replicas.logs), "round-robin reached both replicas"


def _metric(r: Replicas, index: int, line_start: str) -> float | None:
    """One sample of a replica's /metrics (its own port), or None when it has none yet."""
    answer = httpx2.get(f"{_replica(r, index)}/metrics", headers={"Authorization": f"Bearer {r.token}"},
                        timeout=30)
    for line in answer.text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_both_replicas_mirrors_see_a_direct_power_off(replicas: Replicas) -> None:
    """Each replica's inventory mirror keeps its own session and update queue on the one vCenter: a
    power-off made directly in vSphere shows in the next read of both, answered by their mirrors."""
    from support.simulator import find_vm, pyvmomi_connect

    def power(index: int) -> str:
        async def read() -> Any:
            return await _call(_replica(replicas, index), replicas.token, None, "list_vms", {"target": "vc1"})
        failed, answer = anyio.run(read)
        assert not failed, answer
        (vm,) = [v for v in answer["vms"] if v["name"] == "DC0_C0_RP0_VM0"]
        return str(vm["power_state"])

    synced = 'gateway_mirror_synced{target="vc1"}'
    served = 'gateway_mirror_reads_total{source="mirror",target="vc1"}'
    for index in (0, 1):
        assert power(index) == "poweredOn"  # the first read starts the (lazy) mirror
        wait_until(lambda i=index: _metric(replicas, i, synced) == 1.0, timeout=60, what="mirror synced")
    before = [_metric(replicas, i, served) or 0.0 for i in (0, 1)]
    task = find_vm(pyvmomi_connect(replicas.sim), "DC0_C0_RP0_VM0").PowerOffVM_Task()
    wait_until(lambda: task.info.state in ("success", "error"), timeout=30, what="the power-off")
    assert [power(0), power(1)] == ["poweredOff", "poweredOff"]
    after = [_metric(replicas, i, served) or 0.0 for i in (0, 1)]
    assert all(a == b + 1 for a, b in zip(after, before, strict=True)), (before, after)  # from the mirrors


def test_a_2025_11_25_session_is_served_by_both_replicas_with_plain_round_robin(replicas: Replicas) -> None:
    """One 2025-11-25 client (initialize, then several calls) through nginx round-robin, no hash on
    Mcp-Session-Id: in replica mode the gateway issues no session id, so every request stands alone and
    whichever replica it reaches answers it."""
    base = f"https://localhost:{replicas.balancer}"
    session_ids: list[str] = []

    async def record(response: httpx2.Response) -> None:
        if "mcp-session-id" in response.headers:
            session_ids.append(response.headers["mcp-session-id"])

    async def agent() -> list[bool]:
        http = _http(base, replicas.token, replicas.cert)
        http.event_hooks["response"].append(record)
        transport = streamable_http_client(f"{base}/mcp", http_client=http)
        async with http, Client(transport, mode="legacy") as client:
            assert client.protocol_version == "2025-11-25"
            return [bool((await client.call_tool("list_vms", {"target": "vc1"})).is_error) for _ in range(6)]

    before = [_served_mcp(log) for log in replicas.logs]
    assert anyio.run(agent) == [False] * 6
    assert session_ids == [], "replica mode issues no Mcp-Session-Id"
    served = [_served_mcp(log) - b for log, b in zip(replicas.logs, before, strict=True)]
    assert all(n > 0 for n in served), f"one client session reached both replicas: {served}"


def test_proposal_on_one_replica_is_confirmed_on_the_other_exactly_once(replicas: Replicas) -> None:
    vm = "DC0_C0_RP0_VM1"

    async def scenario() -> tuple[Any, list[tuple[bool, Any]]]:
        failed, proposal = await _call(_replica(replicas, 0), replicas.token, None, "delete_vm",
                                       {"target": "vc1", "vm": vm, "force_power_off": True})
        assert not failed, proposal
        results: list[tuple[bool, Any]] = []

        async def confirm(index: int) -> None:
            results.append(await _call(_replica(replicas, index % 2), replicas.token, None, "confirm_action",
                                       {"token": proposal["token"]}))

        async with anyio.create_task_group() as group:
            for i in range(8):
                group.start_soon(confirm, i)
        return proposal, results

    proposal, results = anyio.run(scenario)
    assert proposal["state"] == "pending"
    assert [failed for failed, _ in results].count(False) == 1, results
    assert vm not in {v["name"] for v in replicas.sim.inventory()["vms"]}
    with closing(PostgresStore(replicas.pg_url)) as store:
        found = store.get_proposal(proposal["proposal_id"])
        assert found is not None and found.state == "executed"
    verified = _gateway_cli(replicas, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    shown = _gateway_cli(replicas, "audit", "log", "--json", "--last", "0")
    rows = [r for line in shown.stdout.splitlines()
            if (r := json.loads(line)).get("proposal_id") == proposal["proposal_id"]]
    phases = [r["phase"] for r in rows]
    assert phases.count("executed") == 1, phases
    # every confirm attempt is one row: the winner's executing (its compare-and-set came first), and
    # one row per loser, whichever replica served it and wherever it lost
    attempts = [p for p in phases if p not in ("proposed", "executed")]
    assert attempts.count("executing") == 1, phases
    assert len(attempts) == 8, phases


def test_pool_size_bounds_both_replicas_together(replicas: Replicas) -> None:
    replicas.sim.control("/delay", {"method_delay": {"RetrievePropertiesEx": 300}})
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(replicas.sim.control("/inflight")["calls"].get("RetrievePropertiesEx", 0))

    refused: list[Any] = []

    async def agents() -> list[bool]:
        failures: list[bool] = []

        async def agent(index: int) -> None:
            for _ in range(2):
                failed, answer = await _call(_replica(replicas, index % 2), replicas.token, None, "list_vms",
                                             {"target": "vc1"})
                failures.append(failed)
                if failed:
                    refused.append(answer)

        async with anyio.create_task_group() as group:
            for i in range(4):
                group.start_soon(agent, i)
        return failures

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        failures = anyio.run(agents)
    finally:
        done.set()
        watcher.join(30)
    assert failures == [False] * 8, refused
    assert max(seen) == 1, "two calls ran on vc1 at once although its pool_size is 1"
    assert all(_served_mcp(log) > 0 for log in replicas.logs)


def test_a_replica_killed_during_a_confirmed_change_leaves_it_settled_not_pending(replicas: Replicas) -> None:
    """kill -9 of the replica executing a destructive call: the survivor keeps serving, settles the
    proposal as outcome_unknown (it cannot know whether vSphere finished), and the chain verifies."""
    vm = "DC0_C0_RP0_VM0"
    replicas.sim.control("/delay", {"method_delay": {"Destroy_Task": 20000}})
    failed, proposal = anyio.run(_call, _replica(replicas, 0), replicas.token, None, "delete_vm",
                                 {"target": "vc1", "vm": vm, "force_power_off": True})
    assert not failed, proposal

    def confirm_on_a() -> None:
        with contextlib.suppress(Exception):  # replica A dies under this call
            anyio.run(_call, _replica(replicas, 0), replicas.token, None, "confirm_action",
                      {"token": proposal["token"]})

    confirming = threading.Thread(target=confirm_on_a, daemon=True)
    confirming.start()
    with closing(PostgresStore(replicas.pg_url)) as store:
        def state() -> str:
            found = store.get_proposal(proposal["proposal_id"])
            assert found is not None
            return found.state

        wait_until(lambda: state() == "executing"
                   and replicas.sim.control("/inflight")["calls"].get("Destroy_Task"),
                   timeout=60, interval=0.1, what="the destroy running on replica A")
        replicas.processes[0].kill()  # kill -9
        replicas.processes[0].wait(30)
        failed, listing = anyio.run(_call, _replica(replicas, 1), replicas.token, None, "list_vms",
                                    {"target": "vc1"})
        assert not failed, listing  # the survivor keeps serving
        wait_until(lambda: state() != "executing", timeout=60, interval=0.2,
                   what="the survivor settling the dead replica's proposal")
        settled = store.get_proposal(proposal["proposal_id"])
    assert settled is not None and (settled.state, settled.outcome) == ("outcome_unknown", "outcome_unknown")
    confirming.join(60)
    verified = _gateway_cli(replicas, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    shown = _gateway_cli(replicas, "audit", "log", "--json", "--last", "0")
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    mine = [r["phase"] for r in rows if r.get("proposal_id") == proposal["proposal_id"]]
    assert "executed" not in mine and mine.count("outcome_unknown") == 1, mine


def test_a_revoked_token_is_refused_by_both_replicas_on_the_next_request(replicas: Replicas) -> None:
    async def statuses() -> list[int]:
        codes = []
        for index in (0, 1):
            async with _http(_replica(replicas, index), replicas.token, None) as http:
                codes.append((await http.get("/metrics")).status_code)
        return codes

    assert anyio.run(statuses) == [200, 200]
    revoked = _gateway_cli(replicas, "token", "revoke", "agent")
    assert revoked.returncode == 0, revoked.stderr
    assert anyio.run(statuses) == [401, 401]


@pytest.mark.postgres
def test_losing_the_database_fails_closed_and_recovers_without_a_restart(make_simulator: MakeSimulator,
                                                                        tmp_path: Path) -> None:
    server = start_postgres()  # its own server: this test stops it
    sim = make_simulator()
    try:
        url = server.create_database()
        with closing(PostgresStore(url)) as store:
            token, _ = create_token(store, "agent", "admin", expires_in=None, now=time.time(),
                                    hasher=FAST_HASH)
        env = write_targets(tmp_path / "targets.yaml", {"vc1": sim})
        home = tmp_path / "home"
        home.mkdir(mode=0o700)
        env.update({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "GATEWAY_DATABASE_URL": url,
                    "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"), "GATEWAY_HOME": str(home)})
        port, log = free_port(), tmp_path / "serve.log"
        process = _serve(env, port, log)
        base = f"http://localhost:{port}"
        try:
            wait_for_port(port, process, log)

            async def ready() -> tuple[int, Any]:
                async with httpx2.AsyncClient(base_url=base, timeout=60) as http:
                    answer = await http.get("/readyz")
                    return answer.status_code, answer.json()

            async def list_vms() -> tuple[bool, Any]:
                return await _call(base, token, None, "list_vms", {"target": "vc1"})

            assert anyio.run(ready)[0] == 200
            assert not anyio.run(list_vms)[0]
            server.stop("fast")
            status, body = anyio.run(ready)
            # an anonymous probe reads the status alone; no token can be checked with the store down
            assert status == 503 and body == {"status": "not ready"}, body
            status, refused = _refusal(base, token)
            # the edge refuses every token check while the token store cannot be read (fail closed),
            # saying which part is missing (not "overloaded": retrying harder does not help)
            assert status == 503 and refused["error"]["code"] == "state_unavailable", refused
            assert "database" in refused["error"]["message"], refused
            assert server.password not in json.dumps(refused) + log.read_text(errors="replace")
            server.start()
            wait_until(lambda: anyio.run(ready)[0] == 200, timeout=60, interval=0.2,
                       what="/readyz after PostgreSQL came back")
            failed, answer = anyio.run(list_vms)
            assert not failed, answer
        finally:
            stop(process)
    finally:
        discard(server)


@pytest.mark.postgres
def test_restarting_the_database_under_load_fails_closed_on_both_replicas_and_recovers(
        make_simulator: MakeSimulator, tmp_path: Path) -> None:
    """Four agents keep calling through two replicas while PostgreSQL restarts: every call started while
    it is down fails with a clear unavailable error, both replicas say state_unavailable, and every agent
    is served again afterwards by the same replica processes (no gateway restart); the chain verifies."""
    server = start_postgres()  # its own server: this test stops it
    sim = make_simulator()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        url = server.create_database()
        with closing(PostgresStore(url)) as store:
            token, _ = create_token(store, "agent", "admin", expires_in=None, now=time.time(),
                                    hasher=FAST_HASH)
        env = write_targets(tmp_path / "targets.yaml", {"vc1": sim})
        env.update({"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO), "GATEWAY_DATABASE_URL": url,
                    "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml")})
        ports = (free_port(), free_port())
        for name, port in zip("ab", ports, strict=True):
            home = tmp_path / f"home-{name}"
            home.mkdir(mode=0o700)
            processes.append(_serve({**env, "GATEWAY_HOME": str(home)}, port, tmp_path / f"{name}.log"))
        for process, port, name in zip(processes, ports, "ab", strict=True):
            wait_for_port(port, process, tmp_path / f"{name}.log")
        bases = [f"http://localhost:{port}" for port in ports]
        phase = ["up"]
        calls: list[tuple[int, str, bool, str]] = []  # (agent, phase, failed, error text)
        done = threading.Event()

        async def agent(index: int) -> None:
            turn = index
            while not done.is_set():
                sent = phase[0]
                try:
                    failed, answer = await _call(bases[turn % 2], token, None, "list_vms", {"target": "vc1"})
                    text = json.dumps(answer) if failed else ""
                except Exception as exc:  # the transport refused: the HTTP answer is in the text
                    failed, text = True, repr(exc)
                # a call counts for the outage only if it was sent and answered while the database was down
                calls.append((index, sent if phase[0] == sent else "between", failed, text))
                turn += 1

        async def agents() -> None:
            async with anyio.create_task_group() as group:
                for i in range(4):
                    group.start_soon(agent, i)

        def served(after: str) -> set[int]:
            return {i for i, sent, failed, _ in list(calls) if sent == after and not failed}

        runner = threading.Thread(target=anyio.run, args=(agents,))
        runner.start()
        try:
            wait_until(lambda: served("up") == {0, 1, 2, 3}, timeout=60, interval=0.1,
                       what="every agent served before the restart")
            server.stop("fast")
            phase[0] = "down"
            wait_until(lambda: sum(1 for _, sent, _, _ in list(calls) if sent == "down") >= 8, timeout=60,
                       interval=0.1, what="calls made while PostgreSQL is down")
            for base in bases:
                status, refused = _refusal(base, token)
                assert status == 503 and refused["error"]["code"] == "state_unavailable", refused
            phase[0] = "restarting"
            server.start()
            phase[0] = "back"
            wait_until(lambda: served("back") == {0, 1, 2, 3}, timeout=90, interval=0.2,
                       what="every agent served again after PostgreSQL came back")
        finally:
            done.set()
            runner.join(120)
        down = [(failed, text) for _, sent, failed, text in calls if sent == "down"]
        assert all(failed for failed, _ in down), "a call was served while the database was down"
        # a tool error names the unavailable part; an HTTP refusal reaches the SDK client only as
        # "Server returned an error response" (its body, state_unavailable, is checked above by hand)
        unclear = [text for _, text in down
                   if "unavailable" not in text and "Server returned an error response" not in text]
        assert not unclear, unclear[:3]
        assert all(p.poll() is None for p in processes), "the replicas kept running (no restart)"
        assert server.password not in "".join(text for _, text in down)
        verified = subprocess.run([sys.executable, "-c", GATEWAY_MAIN, "audit", "verify"],
                                  env={**env, "GATEWAY_HOME": str(tmp_path / "cli")}, cwd=REPO,
                                  capture_output=True, text=True, timeout=120, check=False)
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        for process in processes:
            stop(process)
        discard(server)


def _refusal(base: str, token: str) -> tuple[int, Any]:
    """What an MCP request gets while the database is down: (HTTP status, JSON body)."""
    async def attempt() -> tuple[int, Any]:
        async with _http(base, token, None) as http:
            answer = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                     headers={"Accept": "application/json, text/event-stream"})
            return answer.status_code, answer.json()

    return anyio.run(attempt)


def test_kubernetes_replicas_recipe_is_what_the_gateway_accepts(tmp_path: Path) -> None:
    """deploy/kubernetes/gateway-replicas.yaml parsed (no cluster here): two replicas, the database
    URL from the Secret without a password, no volume claim, probes, and configuration the gateway's
    own parsers load."""
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(
        (REPO / "deploy" / "kubernetes" / "gateway-replicas.yaml").read_text()) if doc}
    assert "PersistentVolumeClaim" not in docs
    deployment = docs["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": docs["Secret"]["metadata"]["name"]}}]
    secret = docs["Secret"]["stringData"]
    env = {e["name"]: e["value"] for e in container["env"]}
    settings = Settings.from_env({**secret, **env, "GATEWAY_HOME": str(tmp_path)})
    assert settings.database_url is not None
    assert display_url(settings.database_url) in settings.database_url, "no password inside the URL"
    assert "PGPASSWORD" in secret, "the password comes from the environment"
    assert settings.request_state_secret is not None, "one request-state secret for every replica"
    args = build_parser().parse_args(container["args"])
    assert args.command == "serve" and args.database_url is None  # never on the command line
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"]["path"] == path
    config = docs["ConfigMap"]["data"]
    assert parse_targets(yaml.safe_load(config["targets.yaml"]), "configmap targets.yaml", secret)
    load_roles(config["roles.yaml"].encode(), "configmap roles.yaml")
