"""The HTTP application: the edge (see ``gateway.server.edge``), then the routes.

    /mcp       streamable HTTP (2025-11-25 sessions bound to their token, idle expiry 30 min; and the
               stateless 2026-07-28 revision), token required
    /healthz   GET/HEAD {"status": "ok"} for a load balancer: any Host, no token, nothing else revealed
    /readyz    200 when the gateway is ready, else 503 with short reasons: any Host, no token (the
               reasons name no target, path or secret)
    /metrics   Prometheus text, token required
    /ui        the approval page, when given (it authenticates with its own cookie)

The lifespan starts the gateway, then the MCP session manager, and stops them in reverse order.
``self_check`` proves before binding that /mcp refuses unauthenticated requests.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from types import FrameType
from typing import Any, Final, Protocol

import anyio
import httpx2
import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

from gateway.errors import ConfigError
from gateway.server import edge
from gateway.server.edge import EdgeConfig
from gateway.server.mcp import AnswerAsJson, InFlightCalls, McpGateway, build_mcp_server
from gateway.server.metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)

#: a 2025-11-25 session with no request for this long is closed; the client then opens a new one
MAX_SESSIONS: Final = 1000
SELF_CHECK_TIMEOUT: Final = 10.0
#: after the calls in progress finished, how long idle event streams get to close before they are cut
STREAM_CLOSE_SECONDS: Final = 5


class Scheduler(Protocol):
    def stats(self) -> Mapping[str, Mapping[str, int]]: ...


class AppGateway(McpGateway, Protocol):
    """The part of ``gateway.server.pipeline.Gateway`` the HTTP application uses."""

    metrics: Metrics

    @property
    def authenticator(self) -> edge.Authenticator: ...

    @property
    def scheduler(self) -> Scheduler: ...

    draining: bool

    def readiness(self) -> list[str]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def _edge_stack(gateway: AppGateway, config: EdgeConfig) -> list[Middleware]:
    """The middleware, outermost first (see the ``edge`` module docstring for what each refuses)."""
    metrics = gateway.metrics
    verifier = edge.GatewayTokenVerifier(gateway.authenticator, surface=config.surface)
    return [
        Middleware(edge.CorrelationIdMiddleware, hsts=config.surface == "https",
                   quiet_paths=config.open_paths),
        Middleware(edge.HostAllowListMiddleware, config=config, metrics=metrics),
        Middleware(edge.OriginAllowListMiddleware, config=config, metrics=metrics),
        Middleware(edge.RequestSizeMiddleware, max_body_bytes=config.max_body_bytes,
                   max_header_bytes=config.max_header_bytes, timeout=config.receive_timeout_seconds,
                   metrics=metrics),
        Middleware(edge.ConcurrencyLimitMiddleware, limit=config.max_concurrent_requests, config=config,
                   metrics=metrics),
        Middleware(edge.QueryTokenMiddleware, metrics=metrics),
        Middleware(edge.BearerAuthMiddleware, verifier=verifier, authenticator=gateway.authenticator,
                   config=config, metrics=metrics),
    ]


def _probe_routes(gateway: AppGateway) -> list[BaseRoute]:
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        try:
            reasons = gateway.readiness()
        except Exception:
            log.exception("readiness check failed")
            reasons = ["readiness check failed"]
        if reasons:
            return JSONResponse({"status": "not ready", "reasons": reasons}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics(_request: Request) -> Response:
        try:
            stats: Mapping[str, Mapping[str, int]] = gateway.scheduler.stats()
        except Exception:
            log.exception("scheduler statistics unavailable for /metrics")
            stats = {}
        return PlainTextResponse(gateway.metrics.render(stats), media_type=CONTENT_TYPE)

    return [
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def build_app(
    gateway: AppGateway, config: EdgeConfig, *, version: str = "", web: ASGIApp | None = None,
) -> Starlette:
    """The whole HTTP application for ``gateway``; ``app.state.in_flight`` counts tool calls running."""
    if web is not None:
        config = replace(config, self_authenticating_prefixes=(*config.self_authenticating_prefixes, "/ui"))
    in_flight = InFlightCalls()
    server = build_mcp_server(gateway, edge.current_principal, version=version, in_flight=in_flight)
    manager = StreamableHTTPSessionManager(
        app=server, json_response=False, stateless=False, security_settings=config.transport_security(),
        session_idle_timeout=config.session_idle_seconds, max_sessions=MAX_SESSIONS,
        max_request_body_size=config.max_body_bytes,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            async with manager.run():
                yield
        finally:
            await gateway.close()

    # a call's answer travels as one JSON body unless something (progress) must stream first: clients
    # cap single server-sent events (the SDK at 1 MiB), and a large inventory answer exceeds that
    mcp_endpoint = AnswerAsJson(StreamableHTTPASGIApp(manager))
    routes: list[BaseRoute] = [Route("/mcp", mcp_endpoint), *_probe_routes(gateway)]
    if web is not None:
        routes.append(Mount("/ui", app=web))
    app = Starlette(routes=routes, middleware=_edge_stack(gateway, config), lifespan=lifespan)
    app.state.in_flight = in_flight
    return app


_PROBES: Final[tuple[tuple[str, dict[str, str], bytes], ...]] = (
    ("POST", {"content-type": "application/json", "accept": "application/json, text/event-stream"},
     b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'),
    ("GET", {"accept": "text/event-stream"}, b""),
    ("DELETE", {}, b""),
)


async def self_check(app: ASGIApp, config: EdgeConfig) -> None:
    """Send unauthenticated POST, GET and DELETE to /mcp in-process; raise ConfigError unless all get 401."""
    transport = httpx2.ASGITransport(app=app)
    scheme = "https" if config.surface == "https" else "http"
    answers: dict[str, Any] = {}
    base_url = f"{scheme}://{config.self_check_host()}"
    async with httpx2.AsyncClient(transport=transport, base_url=base_url) as client:
        for method, headers, body in _PROBES:
            try:
                with anyio.fail_after(SELF_CHECK_TIMEOUT):
                    response = await client.request(method, "/mcp", headers=headers, content=body)
                answers[method] = response.status_code
            except Exception as exc:  # whatever broke, the endpoint did not refuse cleanly
                answers[method] = type(exc).__name__
    wrong = {m: a for m, a in answers.items() if a != 401}
    if wrong:
        found = ", ".join(f"{m} -> {a}" for m, a in wrong.items())
        raise ConfigError(f"refusing to start: unauthenticated requests to /mcp must be refused with 401, "
                          f"but {found}; this build's authentication is broken, report it")
    log.info("self-check passed: /mcp refuses unauthenticated POST, GET and DELETE")


def uvicorn_config(
    app: ASGIApp, config: EdgeConfig, *, host: str, port: int, ssl_context: ssl.SSLContext | None,
    forwarded_allow_ips: str | None = None,
) -> uvicorn.Config:
    """How ``gateway serve`` runs ``app``: h11 (so the header size limit applies), our TLS context,
    no uvicorn access log (ours never logs query strings), proxy headers only from trusted proxies."""
    factory = None if ssl_context is None else (lambda _config, _default: ssl_context)
    return uvicorn.Config(
        app, host=host, port=port, http="h11", h11_max_incomplete_event_size=config.max_header_bytes,
        ssl_context_factory=factory, proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips, access_log=False, log_config=None, server_header=False,
        lifespan="on", timeout_graceful_shutdown=STREAM_CLOSE_SECONDS,
    )


class GatewayServer(uvicorn.Server):
    """uvicorn's server with an orderly stop.

    The first SIGTERM/SIGINT (or ``begin_stop()``) makes readiness fail at once, keeps serving for
    ``drain_seconds`` so a load balancer notices, then waits for the tool calls in progress (at most
    ``grace_seconds``) before uvicorn stops accepting and closes what is left. A second signal stops
    at once, as plain uvicorn does.
    """

    def __init__(self, config: uvicorn.Config, gateway: AppGateway, in_flight: InFlightCalls, *,
                 drain_seconds: float = 0.0, grace_seconds: float = 30.0) -> None:
        super().__init__(config)
        self.gateway, self.in_flight = gateway, in_flight
        self.drain_seconds, self.grace_seconds = drain_seconds, grace_seconds
        self.stop_requested: float | None = None

    def begin_stop(self) -> None:
        if self.stop_requested is None:
            self.stop_requested = time.monotonic()
            self.gateway.draining = True
            log.info("stopping: readiness fails from now; serving %gs more, then waiting for %d call(s) "
                     "in progress (at most %gs)", self.drain_seconds, self.in_flight.count,
                     self.grace_seconds)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stop_requested is None and not self.should_exit:
            self.begin_stop()
            return
        super().handle_exit(sig, frame)

    def ready_to_exit(self, now: float) -> bool:
        if self.stop_requested is None:
            return False
        elapsed = now - self.stop_requested
        if elapsed < self.drain_seconds:
            return False
        if self.in_flight.count and elapsed < self.drain_seconds + self.grace_seconds:
            return False
        if self.in_flight.count:
            log.warning("grace period over with %d call(s) still in progress; stopping anyway",
                        self.in_flight.count)
        return True

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit and self.ready_to_exit(time.monotonic()):
            self.should_exit = True
        return await super().on_tick(counter)
