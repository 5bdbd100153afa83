"""The HTTP edge in-process: allow-lists, limits, query tokens, bearer auth, probes, self-check.

The application under test is the real one (``build_app``) with real tokens in a real SQLite store
and real metrics; only the call pipeline is a stand-in (``StandInGateway``), since nothing here
reaches a tool. Requests go through httpx2's ASGI transport, or raw ASGI messages where a test needs
to control how the body arrives. Last, refused tokens in the audit (``RefusalAudit``): a revoked or
expired token's refusal row names the token's id and why, aggregated per (address, reason), over the
real HTTPS server in front of the real gateway.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send
from support.httpserver import FAST_HASH, Served, audit_rows, build_gateway, serve
from support.simulator import Simulator, wait_until

from gateway.answer import Answer
from gateway.auth.tokens import Principal, TokenAuthenticator, Verdict, create_token, parse_token_id
from gateway.config import Target
from gateway.errors import ConfigError, InvalidArgument
from gateway.server.base.metrics import Metrics, gauge_family
from gateway.server.edge.app import build_app, self_check
from gateway.server.edge.middleware import (
    BearerAuthMiddleware,
    ConcurrencyLimitMiddleware,
    EdgeConfig,
    HostPattern,
    RequestSizeMiddleware,
    correlation_id_from,
    split_authority,
)
from gateway.store.sqlite import SqliteStore
from gateway.tools.spec import ToolSpec

pytestmark = pytest.mark.anyio


class _Role:
    def __init__(self, all_targets: bool) -> None:
        self.all_targets = all_targets
        self.tools = "*"


class StandInGateway:
    """The pipeline's surface with canned answers; tokens and metrics are the real ones."""

    def __init__(self, store: SqliteStore) -> None:
        self.metrics = Metrics(targets=["vc1"], tools=["list_vms"])
        self.authenticator = TokenAuthenticator(store)
        self.draining = False
        self.not_ready: list[str] = []
        self.target_stats = {"vc1": {"queued": 3, "running": 2, "slots": 2, "sessions": 2, "in_use": 2,
                                     "logins": 5, "relogins": 1}}

    @property
    def scheduler(self) -> StandInGateway:
        return self

    def stats(self) -> dict[str, dict[str, int]]:
        return self.target_stats

    @property
    def facts(self) -> StandInGateway:  # what the caller may see and use: this stand-in answers it
        return self

    @property
    def calls(self) -> StandInGateway:  # where tool calls are answered: this stand-in too
        return self

    @property
    def registry(self) -> dict[str, ToolSpec]:  # the tools by name (which may stream their answer)
        return {}

    def tools_of(self, role: Any) -> list[ToolSpec]:
        return []

    async def answer(self, principal: Principal, name: str, args: Mapping[str, Any] | None,
                     **_: Any) -> Answer:
        return Answer.of({})

    async def role_now(self, principal: Principal) -> _Role:
        return _Role(principal.role == "admin")

    def visible_targets(self, role: Any) -> list[Target]:
        return [Target("vc1", "vc1.example.com", "VC1")]

    def readiness(self) -> list[str]:
        return (["shutting down"] if self.draining else []) + self.not_ready

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "state.db") as s:
        yield s


@pytest.fixture
def token(store: SqliteStore) -> str:
    secret, _ = create_token(store, "alice", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    return secret


@pytest.fixture
def gateway(store: SqliteStore) -> StandInGateway:
    return StandInGateway(store)


Http = httpx2.AsyncClient
EDGE = EdgeConfig.for_https(["gw.example.com", "gw.example.com:8443"], max_body_bytes=1024)


@pytest.fixture
async def client(gateway: StandInGateway) -> AsyncIterator[httpx2.AsyncClient]:
    app = build_app(gateway, EDGE)
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="https://gw.example.com") as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(("text", "expected"), [
    ("gw.example.com", ("gw.example.com", None)),
    ("GW.Example.COM.:8443", ("gw.example.com", 8443)),
    ("[::1]:8443", ("::1", 8443)),
    ("[::1]", ("::1", None)),
    ("10.0.0.5:443", ("10.0.0.5", 443)),
    ("", None), ("host:0", None), ("host:99999", None), ("host:x", None), ("::1", None),
    ("evil.com/x", None), ("user@host", None), ("[::1", None), ("[::1]x", None),
])
def test_split_authority(text: str, expected: tuple[str, int | None] | None) -> None:
    assert split_authority(text) == expected


@pytest.mark.parametrize(("header", "scheme", "allowed"), [
    ("gw.example.com", "https", True),
    ("gw.example.com:8443", "https", True),
    ("gw.example.com:9999", "https", True),       # a public name without a port accepts any port
    ("other.example.com", "https", False),
    ("gw.example.com.evil.com", "https", False),
    ("127.0.0.1:8443", "https", False),
    (None, "https", False),
])
def test_host_allow_list(header: str | None, scheme: str, allowed: bool) -> None:
    assert EdgeConfig.for_https(["gw.example.com"]).host_allowed(header, scheme) is allowed


def test_host_with_port_matches_that_port_or_the_default() -> None:
    pattern = HostPattern.parse("gw.example.com:443")
    assert pattern.matches("gw.example.com", None, "https")
    assert pattern.matches("gw.example.com", 443, "https")
    assert not pattern.matches("gw.example.com", 8443, "https")
    assert not HostPattern.parse("gw:8443").matches("gw", None, "https")


@pytest.mark.parametrize(("origin", "allowed"), [
    ("https://gw.example.com", True),
    ("https://gw.example.com:8443", True),
    ("http://gw.example.com", False),
    ("https://evil.example.com", False),
    ("null", False),
    ("https://gw.example.com/path", False),
    ("https://user@gw.example.com", False),
])
def test_origin_allow_list(origin: str, allowed: bool) -> None:
    assert EdgeConfig.for_https(["gw.example.com"]).origin_allowed(origin) is allowed


def test_http_transport_accepts_loopback_names_and_proxied_public_names() -> None:
    config = EdgeConfig.for_http(["gw.example.com"])
    assert config.surface == "http"
    assert all(config.host_allowed(h, "http") for h in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080"))
    assert config.host_allowed("gw.example.com", "https")
    assert config.origin_allowed("http://localhost:8080") and config.origin_allowed("https://gw.example.com")
    assert not config.host_allowed("192.168.1.1:8080", "http")


def test_https_needs_a_public_name_and_a_valid_one() -> None:
    with pytest.raises(InvalidArgument):
        EdgeConfig.for_https([])
    with pytest.raises(InvalidArgument):
        EdgeConfig.for_https(["bad host"])


def test_sdk_transport_security_mirrors_the_allow_list() -> None:
    origins = ["https://gw.example.com", "https://gw.example.com:*", "https://[::1]:8443"]
    settings = EdgeConfig.for_https(["gw.example.com", "[::1]:8443"]).transport_security()
    assert settings.enable_dns_rebinding_protection
    assert settings.allowed_hosts == ["gw.example.com", "gw.example.com:*", "[::1]:8443"]
    assert settings.allowed_origins == origins


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(("headers", "expected"), [
    ({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}, TRACE),
    ({"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01", "x-request-id": "r-1"}, "r-1"),
    ({"x-request-id": "req.42:a_b-c", "x-correlation-id": "other"}, "req.42:a_b-c"),
    ({"x-request-id": "bad id\n", "x-correlation-id": "corr-7"}, "corr-7"),
    ({"x-correlation-id": "x" * 128}, "x" * 128),
])
def test_correlation_id_sources(headers: dict[str, str], expected: str) -> None:
    assert correlation_id_from(Headers(headers=headers)) == expected


@pytest.mark.parametrize("headers", [{}, {"x-request-id": "<script>"}, {"x-correlation-id": "x" * 129},
                                     {"traceparent": "garbage"}])
def test_unsafe_or_missing_correlation_id_is_replaced(headers: dict[str, str]) -> None:
    generated = correlation_id_from(Headers(headers=headers))
    assert len(generated) == 32 and generated.isalnum()
    assert generated != correlation_id_from(Headers(headers=headers))


def test_metric_labels_come_from_configured_names_and_buckets_stay_cumulative() -> None:
    metrics = Metrics(targets=["vc1", 'odd"vc\\'], tools=["list_vms"])
    metrics.observe_call("list_vms", "vc1", "ok", 0.07)
    metrics.observe_call("list_vms", "vc1", "ok", 3.0)
    metrics.observe_call("list_vms", 'odd"vc\\', "ok", 1.0)
    metrics.observe_call('made"up\n', "x" * 1024, "weird", 1.0)
    metrics.observe_call("list_vms", 'vc1,odd"vc\\', "denied", 0.0)
    metrics.observe_call("list_vms", "vc1,nowhere", "error", 0.0)
    metrics.auth_failure("invented")
    text = metrics.render()
    assert 'gateway_tool_calls_total{outcome="ok",target="vc1",tool="list_vms"} 2.0' in text
    assert 'gateway_tool_calls_total{outcome="ok",target="odd\\"vc\\\\",tool="list_vms"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="unknown",target="unknown",tool="unknown"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="denied",target="several",tool="list_vms"} 1.0' in text
    assert 'gateway_tool_calls_total{outcome="error",target="unknown",tool="list_vms"} 1.0' in text
    assert 'gateway_auth_failures_total{reason="unknown"} 1.0' in text
    buckets = {line.split('le="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines()
               if line.startswith("gateway_tool_call_duration_seconds_bucket{le=") and "list_vms" in line}
    bounds = ("0.05", "0.1", "2.5", "5.0", "+Inf")
    assert tuple(buckets[b] for b in bounds) == (2, 3, 4, 5, 5)
    assert "gateway_tool_call_duration_seconds_sum" in text and text.endswith("\n")


def test_metrics_of_two_gateways_never_collide_and_collectors_can_be_added() -> None:
    first, second = Metrics(tools=["a"]), Metrics(tools=["a"])
    first.observe_call("a", "-", "ok", 0.1)
    second.add_collector("extra", lambda: [gauge_family("gateway_extra", "An added gauge.", "kind",
                                                        {"x": 2.0})])
    second.add_collector("broken", lambda: 1 / 0)  # type: ignore[arg-type, return-value]
    assert 'tool="a"} 1.0' in first.render() and 'tool="a"} 1.0' not in second.render()
    assert 'gateway_extra{kind="x"} 2.0' in second.render() and "gateway_extra" not in first.render()
    assert "process_resident_memory_bytes" in first.render()


# ---------------------------------------------------------------------------- through the app


async def test_health_answers_any_host_without_a_token(client: Http) -> None:
    for host in ("gw.example.com", "10.1.2.3:8443", "anything.invalid"):
        response = await client.get("/healthz", headers={"Host": host})
        assert response.status_code == 200 and response.json() == {"status": "ok"}
        assert (await client.get("/readyz", headers={"Host": host})).status_code == 200
    head = await client.head("/healthz", headers={"Host": "elsewhere"})
    assert head.status_code == 200


async def test_wrong_host_is_misdirected(client: Http, token: str, gateway: StandInGateway) -> None:
    for path in ("/mcp", "/metrics", "/elsewhere"):
        response = await client.get(path, headers={"Host": "attacker.example.com", **bearer(token)})
        assert response.status_code == 421
        assert response.json()["error"]["code"] == "misdirected_request"
    assert 'gateway_http_refusals_total{reason="host"} 3' in gateway.metrics.render()


async def test_foreign_origin_is_forbidden(client: Http, token: str) -> None:
    foreign = {"Origin": "https://attacker.example.com", **bearer(token)}
    response = await client.get("/metrics", headers=foreign)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden_origin"
    same = await client.get("/metrics", headers={"Origin": "https://gw.example.com", **bearer(token)})
    assert same.status_code == 200


async def test_declared_oversized_body_is_refused(client: Http, token: str) -> None:
    response = await client.post("/mcp", content=b"x" * 2048, headers=bearer(token))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


async def test_token_in_query_string_is_refused_and_never_logged(
    client: Http, token: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    for query in (f"access_token={token}", f"Token={token}", f"x=1&token={token}"):
        response = await client.get(f"/healthz?{query}")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "token_in_query"
    server_side = [r for r in caplog.records if not r.name.startswith("httpx")]  # the client logs its URLs
    assert any(r.name == "gateway.access" for r in server_side), "the access log should show the refusals"
    assert all(token not in record.getMessage() for record in server_side)


async def test_missing_token_gets_a_bearer_challenge(client: Http, gateway: StandInGateway) -> None:
    for method in ("POST", "GET", "DELETE"):
        response = await client.request(method, "/mcp")
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == (
            'Bearer realm="vsphere-mcp-gateway", error_description="a bearer token from '
            "'gateway token create' is required\"")
        assert "gateway token create" in response.json()["error"]["message"]
    assert 'gateway_auth_failures_total{reason="missing"} 3.0' in gateway.metrics.render()


@pytest.mark.parametrize("value", ["Bearer gwt_aaaaaaaaaaaa_" + "x" * 43, "Bearer nonsense",
                                   "Basic dXNlcjpwYXNz", "Bearer"])
async def test_bad_credentials_are_unauthorized(client: Http, value: str) -> None:
    response = await client.get("/metrics", headers={"Authorization": value})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")


async def test_repeated_failures_throttle_made_up_tokens_never_a_valid_one(
    gateway: StandInGateway, token: str,
) -> None:
    app = build_app(gateway, EDGE)

    def from_address(address: str) -> httpx2.AsyncClient:
        transport = httpx2.ASGITransport(app=app, client=(address, 50000))
        return httpx2.AsyncClient(transport=transport, base_url="https://gw.example.com")

    async with from_address("192.0.2.10") as attacker, from_address("192.0.2.20") as other:
        statuses = [(await attacker.get("/metrics", headers=bearer("gwt_bad"))).status_code
                    for _ in range(12)]
        assert statuses[0] == 401 and statuses[-1] == 429
        throttled = await attacker.get("/metrics", headers=bearer("gwt_bad"))
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        assert (await attacker.get("/metrics", headers=bearer(token))).status_code == 200
        assert (await other.get("/metrics", headers=bearer(token))).status_code == 200
    assert 'gateway_auth_failures_total{reason="throttled"}' in gateway.metrics.render()


async def test_readiness_tells_a_stranger_only_its_status(
    client: Http, token: str, gateway: StandInGateway,
) -> None:
    breakers = {"targets": 1, "open": 0}
    assert (await client.get("/readyz")).json() == {"status": "ready"}
    detail = await client.get("/readyz", headers=bearer(token))
    assert detail.json() == {"status": "ready", "circuit_breakers": breakers}
    gateway.not_ready = ["audit log not writable"]
    gateway.target_stats["vc1"]["circuit_open"] = 1
    response = await client.get("/readyz")
    assert response.status_code == 503 and response.json() == {"status": "not ready"}
    response = await client.get("/readyz", headers=bearer(token))
    assert response.status_code == 503
    assert response.json() == {"status": "not ready", "reasons": ["audit log not writable"],
                               "circuit_breakers": {"targets": 1, "open": 1}}


async def test_metrics_need_a_token_and_show_every_family(
    client: Http, token: str, gateway: StandInGateway,
) -> None:
    assert (await client.get("/metrics")).status_code == 401
    gateway.metrics.observe_call("list_vms", "vc1", "ok", 0.2)
    response = await client.get("/metrics", headers=bearer(token))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    families = ("gateway_tool_calls_total", "gateway_tool_call_duration_seconds",
                "gateway_auth_failures_total", "gateway_target_queue_depth", "gateway_target_sessions_in_use")
    for family in families:
        assert f"# TYPE {family} " in text
    assert 'gateway_tool_calls_total{outcome="ok",target="vc1",tool="list_vms"} 1.0' in text
    assert 'gateway_tool_call_duration_seconds_bucket{le="0.25",tool="list_vms"} 1.0' in text
    assert 'gateway_target_queue_depth{target="vc1"} 3.0' in text
    assert "# TYPE gateway_target_logins_total counter" in text
    assert 'gateway_target_relogins_total{target="vc1"} 1.0' in text


async def test_correlation_id_is_echoed_on_every_answer(client: Http) -> None:
    ok = await client.get("/healthz", headers={"X-Request-ID": "lb-1234"})
    refused = await client.get("/mcp", headers={"X-Correlation-ID": "agent-77"})
    assert ok.headers["x-correlation-id"] == "lb-1234"
    assert refused.status_code == 401 and refused.headers["x-correlation-id"] == "agent-77"
    assert ok.headers["strict-transport-security"].startswith("max-age=")


async def test_self_check_passes_for_the_real_stack(gateway: StandInGateway) -> None:
    await self_check(build_app(gateway, EDGE), EDGE)


async def test_self_check_refuses_an_app_that_serves_mcp_without_a_token(gateway: StandInGateway) -> None:
    broken = EdgeConfig.for_https(["gw.example.com"], open_paths=frozenset({"/healthz", "/mcp"}))
    with pytest.raises(ConfigError, match="must be refused with 401"):
        await self_check(build_app(gateway, broken), broken)


# ---------------------------------------------------------------------------- raw ASGI: bodies and load


def http_scope(method: str = "POST", path: str = "/mcp", headers: dict[str, str] | None = None) -> Scope:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"type": "http", "method": method, "path": path, "headers": raw, "query_string": b"",
            "scheme": "https", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 443)}


class Recorder:
    """An ASGI app that reads the whole body, then answers 200 with its length."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


async def run_asgi(
    app: Any, scope: Scope, messages: Sequence[Message], *, then_wait: bool = False
) -> list[Message]:
    sent: list[Message] = []
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then_wait:
            await anyio.sleep_forever()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def chunks(total: int, size: int = 256) -> list[Message]:
    count = -(-total // size)
    return [{"type": "http.request", "body": b"y" * min(size, total - i * size), "more_body": i < count - 1}
            for i in range(count)]


async def test_chunked_body_is_counted_while_it_streams() -> None:
    inner = Recorder()
    limited = RequestSizeMiddleware(inner, max_body_bytes=1000, max_header_bytes=1000, timeout=5,
                                    metrics=Metrics())
    small = await run_asgi(limited, http_scope(), chunks(1000))
    assert small[0]["status"] == 200 and inner.bodies == [b"y" * 1000]
    large = await run_asgi(limited, http_scope(), chunks(1001))
    assert large[0]["status"] == 413 and len(inner.bodies) == 1


async def test_oversized_headers_are_refused() -> None:
    inner = Recorder()
    limited = RequestSizeMiddleware(inner, max_body_bytes=1000, max_header_bytes=100, timeout=5,
                                    metrics=Metrics())
    fits = await run_asgi(limited, http_scope(headers={"x-pad": "p" * 80}), chunks(10))
    too_big = await run_asgi(limited, http_scope(headers={"x-pad": "p" * 100}), chunks(10))
    assert fits[0]["status"] == 200 and too_big[0]["status"] == 431 and len(inner.bodies) == 1


async def test_body_that_does_not_arrive_in_time_is_refused() -> None:
    inner = Recorder()
    limited = RequestSizeMiddleware(inner, max_body_bytes=1000, max_header_bytes=1000, timeout=0.2,
                                    metrics=Metrics())
    partial = [{"type": "http.request", "body": b"{", "more_body": True}]
    sent = await run_asgi(limited, http_scope(), partial, then_wait=True)
    assert sent[0]["status"] == 408 and inner.bodies == []


async def test_requests_beyond_the_concurrency_limit_get_503() -> None:
    release = anyio.Event()
    entered = anyio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        entered.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    metrics = Metrics()
    limited = ConcurrencyLimitMiddleware(slow, limit=1, config=EDGE, metrics=metrics)
    results: list[list[Message]] = []
    async with anyio.create_task_group() as tg:
        async def first() -> None:
            results.append(await run_asgi(limited, http_scope(), []))

        tg.start_soon(first)
        await entered.wait()
        second = await run_asgi(limited, http_scope(), [])
        stream = anyio.Event()

        async def long_get(scope: Scope, receive: Receive, send: Send) -> None:
            stream.set()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        # a GET event stream on /mcp and the health probe are not counted
        await run_asgi(ConcurrencyLimitMiddleware(long_get, limit=0, config=EDGE, metrics=metrics),
                       http_scope("GET", "/mcp"), [])
        release.set()
    assert second[0]["status"] == 503 and dict(second[0]["headers"])[b"retry-after"] == b"1"
    assert results[0][0]["status"] == 200 and stream.is_set()
    assert 'gateway_http_refusals_total{reason="overloaded"} 1' in metrics.render()


class HeldAuthenticator:
    """The real ``TokenAuthenticator``, except that checks of ``held`` wait for ``release`` (a fake for
    timing only: a check that stays in progress while the test sends more)."""

    def __init__(self, real: TokenAuthenticator, held: str) -> None:
        self.real, self.held = real, held
        self.waiting, self.release = anyio.Event(), anyio.Event()

    def proven(self, token: str) -> bool:
        return self.real.proven(token)

    async def verify_async(self, token: str, client: str = "") -> Principal | None:
        return await self.real.verify_async(token, client)

    async def authenticate(self, token: str, client: str = "") -> Verdict:
        if token == self.held:
            self.waiting.set()
            await self.release.wait()
        return await self.real.authenticate(token, client)


async def test_tokens_not_yet_proven_have_their_own_budget_that_a_proven_token_skips(
    store: SqliteStore, token: str,
) -> None:
    made_up = ["gwt_" + c * 12 + "_" + "A" * 43 for c in "xyz"]
    held = HeldAuthenticator(TokenAuthenticator(store), made_up[0])
    metrics = Metrics()
    config = replace(EDGE, max_unverified_requests=1)
    auth = BearerAuthMiddleware(Recorder(), held, config, metrics)

    async def status(secret: str) -> int:
        sent = await run_asgi(auth, http_scope(headers=bearer(secret)), [])
        return int(sent[0]["status"])

    assert await status(token) == 200  # proven from now on
    answers: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        async def first() -> None:
            answers["held"] = await status(made_up[0])

        tg.start_soon(first)
        await held.waiting.wait()  # the one place for unproven tokens is taken
        answers["second made-up"] = await status(made_up[1])
        answers["proven"] = await status(token)
        held.release.set()
    answers["after"] = await status(made_up[2])
    assert answers == {"held": 401, "second made-up": 503, "proven": 200, "after": 401}
    assert 'gateway_auth_failures_total{reason="busy"} 1.0' in metrics.render()


# ---------------------------------------------------------------- refused tokens in the audit, over HTTPS


@pytest.fixture
def served(sim_vc1: Simulator, tmp_path: Path) -> Iterator[Served]:
    running = serve(tmp_path, build_gateway(tmp_path, sim_vc1), edge={"refusal_audit_seconds": 0.2})
    yield running
    running.stop()
    anyio.run(running.gateway.close)


def test_revoked_and_expired_tokens_are_audited_by_id_and_reason(served: Served) -> None:
    store = served.gateway.store
    revoked = served.tokens["bob"]
    store.update_token("bob", revoked=True)
    expired, expired_rec = create_token(store, "old-ci", "reader", expires_in=60, now=time.time() - 120,
                                        hasher=FAST_HASH)
    revoked_id = parse_token_id(revoked)

    async def knock() -> list[int]:
        statuses = []
        for token in (revoked, revoked, revoked, expired, expired):
            async with served.http(token) as http:
                statuses.append((await http.get("/metrics")).status_code)
        return statuses

    assert anyio.run(knock) == [401] * 5

    def refusals() -> list[dict[str, Any]]:
        return [r for r in audit_rows(served.gateway) if r["phase"] == "token_refused"]

    wait_until(lambda: sum(r["count"] for r in refusals()) >= 5, timeout=30, what="refusal rows")
    # one row per reason and minute: knocks on both sides of a minute's end make two rows of one reason
    counts: dict[str, int] = {}
    ids: dict[str, set[str]] = {}
    for row in refusals():
        counts[row["reason"]] = counts.get(row["reason"], 0) + row["count"]
        ids.setdefault(row["reason"], set()).update(row["token_ids"])
    assert counts == {"revoked": 3, "expired": 2}, refusals()
    assert ids == {"revoked": {revoked_id}, "expired": {expired_rec.token_id}}, refusals()
    text = json.dumps(refusals())
    assert all(t.split("_", 2)[2] not in text for t in (revoked, expired)), "never the secret"
