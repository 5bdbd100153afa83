"""No token holder can starve the server: the real gateway behind the real HTTPS server, attacked as a
holder of a reader token (or of no token at all) would.

- one token opening 1,000 MCP sessions evicts its own oldest idle ones and locks out nobody;
- caller-chosen names never become metric label values (the scrape parses with prometheus-client);
- a burst of wrong secrets runs a bounded number of argon2 verifications; a valid token is served;
- bad tokens throttle only what they name, never a valid token behind the same address;
- refused tokens are audited in aggregate; headers that crawl in are cut at a deadline;
- a token in any query parameter is refused; a request without a token is told how to get one.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import pytest
from argon2 import PasswordHasher
from prometheus_client.parser import text_string_to_metric_families
from support.httpserver import Served, mcp_client, serve
from support.simulator import Simulator, wait_until, write_targets

from gateway.auth.tokens import TokenAuthenticator, create_token
from gateway.server.runtime import Gateway
from gateway.settings import Settings

pytestmark = pytest.mark.anyio
ACCEPT = {"Accept": "application/json, text/event-stream"}


def real_gateway(sim: Simulator, tmp: Path) -> Gateway:
    env = write_targets(tmp / "targets.yaml", {"vc1": sim})
    home = tmp / "home"
    home.mkdir(mode=0o700)
    return Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp / "targets.yaml")))


@pytest.fixture(scope="module")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("starve")
    running = serve(tmp, real_gateway(sim_vc1, tmp),
                    edge={"max_sessions": 200, "max_sessions_per_token": 16, "header_timeout_seconds": 3.0,
                          "refusal_audit_seconds": 0.5})
    yield running
    running.stop()
    anyio.run(running.gateway.close)


def audit_rows(served: Served) -> list[dict[str, Any]]:
    return [json.loads(line) for line in served.gateway.settings.audit_log.read_text().splitlines()]


def from_address(served: Served, address: str, **options: Any) -> httpx2.AsyncClient:
    """A client whose connections come from another loopback address (its own throttling source)."""
    transport = httpx2.AsyncHTTPTransport(verify=served.tls(), local_address=address, **options)
    return httpx2.AsyncClient(base_url=served.base, transport=transport, timeout=60)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "flood", "version": "1"}}}


async def initialize(http: httpx2.AsyncClient, *, notify: bool = True) -> str:
    response = await http.post("/mcp", json=INITIALIZE, headers=ACCEPT)
    assert response.status_code == 200, response.text
    session: str = response.headers["mcp-session-id"]
    if notify:
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        answer = await http.post("/mcp", json=note, headers=session_headers(session))
        assert answer.status_code == 202
    return session


def session_headers(session: str) -> dict[str, str]:
    return {**ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}


LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


# ---------------------------------------------------------------------------- sessions


async def test_one_token_opening_1000_sessions_locks_out_nobody(served: Served) -> None:
    opened: list[str] = []
    async with served.http(served.tokens["bob"]) as reader:
        first = await initialize(reader)

        async def flood(count: int) -> None:
            for _ in range(count):
                opened.append(await initialize(reader, notify=False))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(flood, 125)
        newest = await initialize(reader)
        assert len(opened) == 1000
        own_new = await reader.post("/mcp", json=LISTING, headers=session_headers(newest))
        own_old = await reader.post("/mcp", json=LISTING, headers=session_headers(first))
    assert own_new.status_code == 200 and "list_vms" in own_new.text
    assert own_old.status_code == 404, "the reader's oldest idle session is the one evicted"
    async with mcp_client(served, served.tokens["alice"], "legacy") as other:
        result = await other.call_tool("list_vms", {"target": "vc1"})
    assert not result.is_error, result.content


async def test_at_the_total_limit_the_biggest_holder_gives_way(sim_vc1: Simulator, tmp_path: Path) -> None:
    gateway = real_gateway(sim_vc1, tmp_path)
    running = serve(tmp_path, gateway, edge={"max_sessions": 4, "max_sessions_per_token": 3})
    try:
        async with running.http(running.tokens["bob"]) as bob, \
                running.http(running.tokens["carol"]) as carol, \
                running.http(running.tokens["alice"]) as alice:
            bobs = [await initialize(bob) for _ in range(3)]
            carols = [await initialize(carol)]
            alices = [await initialize(alice)]  # the total is full: bob (3 of 4) gives his oldest
            answers: dict[str, list[int]] = {}
            for name, client, sessions in (("bob", bob, bobs), ("carol", carol, carols),
                                           ("alice", alice, alices)):
                replies = [await client.post("/mcp", json=LISTING, headers=session_headers(session))
                           for session in sessions]
                answers[name] = [r.status_code for r in replies]
    finally:
        running.stop()
        await gateway.close()
    assert answers == {"bob": [404, 200, 200], "carol": [200], "alice": [200]}


# ---------------------------------------------------------------------------- metrics


async def scrape(client: httpx2.AsyncClient, accept: str | None = None) -> httpx2.Response:
    response = await client.get("/metrics", headers={"Accept": accept} if accept else None)
    assert response.status_code == 200, response.text
    return response


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items())))
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_bogus_target_names_never_become_metric_labels(served: Served) -> None:
    async with served.http(served.tokens["bob"]) as reader, \
            mcp_client(served, served.tokens["bob"], "2026-07-28") as client:
        await client.call_tool("list_vms", {"target": "vc1"})  # every series the bogus calls could touch
        await client.call_tool("list_vms", {"target": "nowhere"})
        await client.call_tool("list_vms", {"target": "y" * 1100})  # a refused argument: its caller series
        before = (await scrape(reader)).text
        for i in range(60):
            result = await client.call_tool("list_vms", {"target": f"{i:04d}" + "x" * 1020})
            assert result.is_error
        after = (await scrape(reader)).text
    assert series(after) == series(before)
    assert "x" * 64 not in after
    assert abs(len(after) - len(before)) < 512, "only the numbers may change"
    calls = {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(after)
             for s in f.samples if s.name == "gateway_tool_calls_total"}
    unknown = (("outcome", "error"), ("target", "unknown"), ("tool", "list_vms"))
    assert calls[unknown] >= 61


async def test_metrics_scrape_parses_with_the_prometheus_parser(served: Served) -> None:
    async with served.http(served.tokens["bob"]) as reader:
        plain = await scrape(reader)
        open_metrics = await scrape(reader, "application/openmetrics-text; version=1.0.0")
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(plain.text)}
    for name, kind in (("gateway_tool_calls", "counter"), ("gateway_tool_call_duration_seconds", "histogram"),
                       ("gateway_auth_failures", "counter"), ("gateway_http_refusals", "counter"),
                       ("gateway_target_queue_depth", "gauge"), ("gateway_target_slots", "gauge"),
                       ("gateway_target_sessions_in_use", "gauge"), ("gateway_target_logins", "counter"),
                       ("gateway_target_circuit_open", "gauge"), ("process_resident_memory_bytes", "gauge"),
                       ("python_info", "gauge")):
        assert name in families, name
        assert families[name].type == kind, name
    slots = [s for s in families["gateway_target_slots"].samples if s.labels == {"target": "vc1"}]
    assert slots and slots[0].value >= 1
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.endswith("# EOF\n")


# ---------------------------------------------------------------------------- argon2 under a burst


class ConcurrencyCountingHasher(PasswordHasher):
    """Real argon2id that records how many verifications ran at the same time (the most at once)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.verifications = 0

    def verify(self, hash: Any, password: Any) -> Literal[True]:
        with self._lock:
            self.running += 1
            self.verifications += 1
            self.most = max(self.most, self.running)
        try:
            return super().verify(hash, password)
        finally:
            with self._lock:
                self.running -= 1


async def test_a_burst_of_300_wrong_secrets_runs_bounded_argon2(
    sim_vc1: Simulator, tmp_path: Path,
) -> None:
    gateway = real_gateway(sim_vc1, tmp_path)
    hasher = ConcurrencyCountingHasher()
    gateway.authenticator = TokenAuthenticator(gateway.store, hasher=hasher, max_verifications=4)
    # costs of a production hash (64 MiB would be too much for 300 at once on a test machine)
    slow = PasswordHasher(time_cost=3, memory_cost=16 * 1024, parallelism=1)
    victim, _ = create_token(gateway.store, "victim", "reader", expires_in=None, now=time.time(),
                                  hasher=slow)
    valid, _ = create_token(gateway.store, "valid", "reader", expires_in=None, now=time.time(), hasher=slow)
    running = serve(tmp_path, gateway)
    wrong = victim[:-8] + ("A" * 8 if not victim.endswith("A" * 8) else "B" * 8)
    statuses: list[int] = []
    try:
        limits = httpx2.Limits(max_connections=300, max_keepalive_connections=0)
        async with from_address(running, "127.0.0.5", limits=limits) as attacker, \
                from_address(running, "127.0.0.6") as honest:
            async def attack() -> None:
                statuses.append((await attacker.get("/metrics", headers=bearer(wrong))).status_code)

            async with anyio.create_task_group() as tg:
                for _ in range(300):
                    tg.start_soon(attack)
                await anyio.to_thread.run_sync(
                    lambda: wait_until(lambda: hasher.running > 0, timeout=60, what="the burst hashing"))
                served_meanwhile = await honest.get("/metrics", headers=bearer(valid))
    finally:
        running.stop()
        await gateway.close()
    assert served_meanwhile.status_code == 200
    assert set(statuses) <= {401, 429, 503}, statuses  # 503: beyond the edge's requests-in-progress limit
    assert len(statuses) == 300
    assert hasher.most <= 4, f"{hasher.most} argon2 verifications ran at once"
    assert 429 in statuses
    assert hasher.verifications <= 20, f"{hasher.verifications} verifications for one guessed token id"


# ---------------------------------------------------------------------------- throttling


async def test_bad_tokens_from_an_address_never_refuse_valid_tokens_behind_it(served: Served) -> None:
    unknown_id = "gwt_" + "z" * 12 + "_" + "A" * 43
    async with from_address(served, "127.0.0.7") as nat:
        refused = [(await nat.get("/metrics", headers=bearer(unknown_id))).status_code for _ in range(15)]
        refused += [(await nat.get("/metrics", headers=bearer("gwt_nonsense"))).status_code for _ in range(3)]
        assert refused[0] == 401 and refused[-1] == 429
        valid = await nat.get("/metrics", headers=bearer(served.tokens["alice"]))
        assert valid.status_code == 200, valid.text
        bob_id = served.tokens["bob"].split("_")[1]
        guessing = f"gwt_{bob_id}_" + "Q" * 43
        guesses = [(await nat.get("/metrics", headers=bearer(guessing))).status_code for _ in range(15)]
        assert guesses[0] == 401 and guesses[-1] == 429, "guessing one token's secret is throttled"
        assert (await nat.get("/metrics", headers=bearer(served.tokens["alice"]))).status_code == 200


#: the flood: connections at once, each sending made-up tokens until the probes are done
FLOOD_CONNECTIONS = 300
PROBES = 20


async def test_a_flood_of_made_up_tokens_never_costs_a_valid_token_its_answer(served: Served) -> None:
    made_up = bearer("gwt_" + "f" * 12 + "_" + "C" * 43)
    answered: list[int] = []
    probes: list[int] = []
    limits = httpx2.Limits(max_connections=FLOOD_CONNECTIONS, max_keepalive_connections=FLOOD_CONNECTIONS)
    async with served.http(served.tokens["bob"]) as reader, \
            from_address(served, "127.0.0.9", limits=limits) as flood:
        await initialize(reader)  # the reader's token is in use (proven) before the flood begins
        probing = anyio.Event()

        async def send_made_up() -> None:
            while not probing.is_set():
                try:
                    answer = await flood.post("/mcp", json=LISTING, headers={**ACCEPT, **made_up})
                except httpx2.TransportError:  # closed by the header deadline or keep-alive: reconnect
                    answered.append(0)
                    continue
                answered.append(answer.status_code)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for _ in range(FLOOD_CONNECTIONS):
                    tg.start_soon(send_made_up)
                while len(answered) < FLOOD_CONNECTIONS:  # every connection is open and sending
                    await anyio.sleep(0.05)
                for _ in range(PROBES):  # an MCP initialize: a new session each time
                    probe = await reader.post("/mcp", json=INITIALIZE, headers=ACCEPT)
                    probes.append(probe.status_code)
                probing.set()
    assert probes.count(200) == PROBES, f"the probe was served {probes.count(200)} of {PROBES}: {probes}"
    assert set(answered) - {0} <= {401, 429, 503}, set(answered)


async def test_refused_tokens_are_audited_once_per_source_and_reason(served: Served) -> None:
    async with from_address(served, "127.0.0.8") as flood:
        for _ in range(40):
            await flood.get("/metrics", headers=bearer("gwt_" + "y" * 12 + "_" + "B" * 43))
        for _ in range(5):
            await flood.get("/metrics")

    def mine() -> list[dict[str, Any]]:
        return [r for r in audit_rows(served) if r.get("phase") == "token_refused"
                and r.get("source") == "127.0.0.8"]

    await anyio.to_thread.run_sync(lambda: wait_until(
        lambda: sum(r["count"] for r in mine()) >= 45, timeout=30, what="aggregated refusal rows"))
    rows = mine()
    by_reason: dict[str, int] = {}
    for row in rows:
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + row["count"]
    assert by_reason["missing"] == 5
    assert sum(by_reason.values()) == 45
    assert len(rows) <= 6, "a flood is aggregated, not written row by row"
    assert all("B" * 43 not in json.dumps(r) for r in rows)


# ---------------------------------------------------------------------------- slow headers, query, 401


def test_headers_sent_a_byte_a_second_are_cut_at_the_deadline(served: Served) -> None:
    header = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"s" * 40
    closed_after: int | None = None
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw, \
            served.tls().wrap_socket(raw, server_hostname="localhost") as tls:
        tls.settimeout(0.0)  # reads below never block: select decides when to look
        for sent in range(1, len(header) + 1):
            try:
                tls.sendall(header[sent - 1:sent])
            except OSError:
                closed_after = sent
                break
            readable, _, _ = select.select([tls], [], [], 1.0)  # paces the client at a byte a second
            if readable:
                try:
                    data = tls.recv(4096)
                except (ssl.SSLWantReadError, BlockingIOError):  # TLS records without application data
                    continue
                except OSError:
                    data = b""
                if not data:
                    closed_after = sent
                    break
    assert closed_after is not None, "the server kept a connection whose headers never completed"
    assert closed_after < len(header)


async def test_a_token_in_any_query_parameter_is_refused_and_never_logged(
    served: Served, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    token = served.tokens["alice"]
    async with served.http() as client:
        answers = [await client.get(f"/mcp?x={token}"), await client.get(f"/metrics?q=1&note=see+{token}"),
                   await client.post(f"/mcp?{token}", json={})]
    assert [a.status_code for a in answers] == [400, 400, 400]
    assert all(a.json()["error"]["code"] == "token_in_query" for a in answers)
    server_side = [r for r in caplog.records if not r.name.startswith("httpx")]
    assert all(token not in r.getMessage() and token[:20] not in r.getMessage() for r in server_side)


async def test_a_request_without_a_token_is_told_how_to_get_one(served: Served) -> None:
    async with served.http() as client:
        response = await client.post("/mcp", json={}, headers=ACCEPT)
        discovery = await client.get("/.well-known/oauth-protected-resource/mcp")
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="vsphere-mcp-gateway"')
    assert "gateway token create" in challenge and "error=" not in challenge
    assert "gateway token create" in response.json()["error"]["message"]
    assert discovery.status_code == 404 and "gateway token create" in discovery.json()["error"]["message"]
