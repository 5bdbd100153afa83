"""The HTTP application: the edge (see ``gateway.server.edge.middleware``), then the routes.

    /mcp       streamable HTTP (2025-11-25 sessions bound to their token, idle expiry 30 min; and the
               stateless 2026-07-28 revision), token required; in replica mode (a shared database)
               no session at all, so plain round-robin serves both revisions
    /healthz   GET/HEAD {"status": "ok"} for a load balancer: any Host, no token, nothing else revealed
    /readyz    200 when the gateway is ready, else 503: any Host, no token; without one (or with one
               lacking the /metrics right) the status alone, with one that has it the short reasons,
               the circuit breaker counts and what ``readiness_detail`` adds
    /metrics   Prometheus exposition (text, or OpenMetrics when asked), token required: a role defined
               here and, for a scope-limited JWT, the scope vsphere:audit
               (``gateway.server.edge.operator_access``)
    /.well-known/oauth-*   404 saying this server takes bearer tokens from `gateway token create`,
               no token (so a client's OAuth discovery ends with that message); with identity.yaml
               the two oauth-protected-resource paths serve RFC 9728 metadata instead
    /ui        the approval page, when given (it authenticates with its own cookie)
    /audit/checkpoint, /audit/proof/inclusion, /audit/proof/consistency
               the audit log's signed checkpoint and Merkle proofs, token required, for roles that may
               read the audit (``gateway.server.edge.audit_proofs``)

MCP sessions are bounded per token and in total (``BoundedSessionManager``); uvicorn runs with a
protocol that closes connections whose request headers crawl in (``header_deadline_protocol``).
The lifespan starts the gateway, the refused-token audit and the MCP session manager, and stops them
in reverse order. ``self_check`` proves before binding that /mcp refuses unauthenticated requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import replace
from types import FrameType
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread
import h11
import httpx2
import uvicorn
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from prometheus_client.core import Metric
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway import tracing
from gateway.audit.metrics import audit_families
from gateway.errors import ConfigError
from gateway.identity.service import PRM_PATH, IdentityService
from gateway.server.base.metrics import Metrics, target_families
from gateway.server.edge import middleware
from gateway.server.edge.audit_proofs import ProofGateway, audit_proof_routes
from gateway.server.edge.mcp import AnswerAsJson, InFlightCalls, McpGateway, build_mcp_server, may_stream
from gateway.server.edge.middleware import DrainGate, EdgeConfig, RefusalAudit
from gateway.server.edge.oauth import OAuthGate
from gateway.server.edge.operator_access import ProbeCaller, detail_allowed, metrics_denied
from gateway.tools.registry import tool_categories

log = logging.getLogger(__name__)

#: where OAuth clients look for an authorization server; answered 404 with how to get a token instead
OAUTH_DISCOVERY: Final = frozenset({
    "/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
    "/.well-known/oauth-authorization-server", "/.well-known/oauth-authorization-server/mcp",
    "/.well-known/openid-configuration",
})
SELF_CHECK_TIMEOUT: Final = 10.0
#: after the calls in progress finished, how long idle event streams get to close before they are cut
STREAM_CLOSE_SECONDS: Final = 5


class Scheduler(Protocol):
    def stats(self) -> Mapping[str, Mapping[str, int]]: ...


class AuditWriter(Protocol):
    def write(self, event: Mapping[str, Any]) -> Any: ...


class AppGateway(McpGateway, Protocol):
    """The part of ``gateway.server.runtime.Gateway`` the HTTP application uses."""

    metrics: Metrics

    @property
    def authenticator(self) -> middleware.Authenticator: ...

    @property
    def scheduler(self) -> Scheduler: ...

    draining: bool

    def readiness(self) -> list[str]: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def _edge_stack(gateway: AppGateway, config: EdgeConfig, gate: DrainGate,
                refusals: RefusalAudit) -> list[Middleware]:
    """The middleware, outermost first (see the ``edge`` module docstring for what each refuses)."""
    metrics = gateway.metrics
    identity: IdentityService | None = getattr(gateway, "identity", None)
    oauth = None if identity is None else OAuthGate(identity, tool_categories(), surface=config.surface)
    return [
        Middleware(middleware.CorrelationIdMiddleware, hsts=config.surface == "https",
                   quiet_paths=config.open_paths),
        Middleware(tracing.TraceContextMiddleware),  # one span per MCP request (traceparent its parent)
        Middleware(middleware.DrainMiddleware, gate=gate, config=config, metrics=metrics),
        Middleware(middleware.HostAllowListMiddleware, config=config, metrics=metrics),
        Middleware(middleware.OriginAllowListMiddleware, config=config, metrics=metrics),
        Middleware(middleware.RequestSizeMiddleware, max_body_bytes=config.max_body_bytes,
                   max_header_bytes=config.max_header_bytes, timeout=config.receive_timeout_seconds,
                   metrics=metrics),
        Middleware(middleware.QueryTokenMiddleware, metrics=metrics),
        # authentication before admission: bad tokens are refused within their own budget and never
        # take one of the slots of authenticated requests
        Middleware(middleware.BearerAuthMiddleware, authenticator=gateway.authenticator, config=config,
                   metrics=metrics, refusals=refusals, oauth=oauth),
        Middleware(middleware.ConcurrencyLimitMiddleware, limit=config.max_concurrent_requests, config=config,
                   metrics=metrics),
    ]


def _target_stats(gateway: AppGateway) -> Mapping[str, Mapping[str, int]]:
    try:
        return gateway.scheduler.stats()
    except Exception:
        log.exception("scheduler statistics unavailable")
        return {}


#: how long /readyz waits for the store and audit checks before it answers "not ready"
READINESS_DEADLINE_SECONDS: Final = 3.0


Readiness = tuple[list[str], Mapping[str, Any]]


def _readiness(gateway: AppGateway) -> Readiness:
    """Blocking: the reasons not to take traffic, and what the gateway adds to the detail
    (``readiness_detail()``, optional: a mapping of JSON values, e.g. the policy file's state under
    ``rules``; it never overrides ``status``, ``reasons`` or ``circuit_breakers``)."""
    reasons = gateway.readiness()
    extra = getattr(gateway, "readiness_detail", None)
    return reasons, (extra() if callable(extra) else {})


def _readiness_detail(gateway: AppGateway, status: str, reasons: list[str],
                      extra: Mapping[str, Any]) -> dict[str, Any]:
    """What a caller with the /metrics right reads on /readyz."""
    stats = _target_stats(gateway)
    open_count = sum(1 for row in stats.values() if row.get("circuit_open"))
    body: dict[str, Any] = {"status": status, **({"reasons": reasons} if reasons else {}),
                            "circuit_breakers": {"targets": len(stats), "open": open_count}}
    for key, value in extra.items():
        body.setdefault(str(key), value)
    return body


def _probe_routes(gateway: AppGateway, caller: ProbeCaller, identity: IdentityService | None,
                  refusals: RefusalAudit) -> list[BaseRoute]:
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    running: list[concurrent.futures.Future[Readiness]] = []  # the check in flight, if any

    def begin_check() -> concurrent.futures.Future[Readiness]:
        """One check at a time, on its own daemon thread: a stuck one is joined by later probes, not
        duplicated, and never holds a pool thread or the interpreter's exit."""
        if running and not running[0].done():
            return running[0]
        future: concurrent.futures.Future[Readiness] = concurrent.futures.Future()

        def check() -> None:
            try:
                future.set_result(_readiness(gateway))
            except BaseException as exc:  # handed to the probe, which logs it
                future.set_exception(exc)

        threading.Thread(target=check, name="readiness", daemon=True).start()
        running[:] = [future]
        return future

    async def readyz(request: Request) -> Response:
        extra: Mapping[str, Any] = {}
        try:
            # off the event loop with a deadline: a stuck store or a slow audit disk makes this probe
            # answer "not ready", never stalls /healthz or the calls of others
            waiting = asyncio.shield(asyncio.wrap_future(begin_check()))
            reasons, extra = await asyncio.wait_for(waiting, READINESS_DEADLINE_SECONDS)
        except TimeoutError:
            log.error("the readiness check did not answer within %gs", READINESS_DEADLINE_SECONDS)
            reasons = [f"readiness check did not answer within {READINESS_DEADLINE_SECONDS:g}s"]
        except Exception:
            log.exception("readiness check failed")
            reasons = ["readiness check failed"]
        status, code = ("not ready", 503) if reasons else ("ready", 200)
        if not await detail_allowed(gateway, await caller(request)):
            return JSONResponse({"status": status}, status_code=code)  # a stranger learns nothing else
        return JSONResponse(_readiness_detail(gateway, status, reasons, extra), status_code=code)

    async def metrics(request: Request) -> Response:
        refused = await metrics_denied(gateway, request, identity, refusals)
        if refused is not None:
            return refused
        body, content_type = await anyio.to_thread.run_sync(gateway.metrics.exposition,
                                                            request.headers.get("accept"))
        return Response(body, media_type=content_type)

    return [
        Route("/healthz", healthz, methods=["GET", "HEAD"]),
        Route("/readyz", readyz, methods=["GET", "HEAD"]),
        Route("/metrics", metrics, methods=["GET"]),
        *_discovery_routes(gateway),
    ]


def _discovery_routes(gateway: AppGateway) -> list[BaseRoute]:
    async def no_oauth(_request: Request) -> Response:
        body = {"error": {"code": "not_found", "message": middleware.TOKEN_HINT}}
        return JSONResponse(body, status_code=404)

    identity: IdentityService | None = getattr(gateway, "identity", None)

    async def resource_metadata(_request: Request) -> Response:
        assert identity is not None
        return JSONResponse(identity.metadata(), headers={"cache-control": "max-age=300"})

    def discovery(path: str) -> Callable[[Request], Any]:
        """RFC 9728 metadata when identity.yaml names providers; this gateway is never itself an
        authorization server, so its own RFC 8414 / OpenID paths stay 404."""
        return resource_metadata if identity is not None and path.startswith(PRM_PATH) else no_oauth

    return [Route(path, discovery(path), methods=["GET"]) for path in sorted(OAUTH_DISCOVERY)]


def _owner(context: AuthorizationContext | None) -> tuple[str, str | None]:
    return ("", None) if context is None else (context["client_id"], context["subject"])


def _idle_since(transport: StreamableHTTPServerTransport) -> float | None:
    """When an idle session's countdown ends (smaller: idle longer), or None while it serves a request
    (the SDK parks its idle deadline at infinity then) or has none."""
    scope = transport.idle_scope
    if scope is None or transport.is_terminated or math.isinf(scope.deadline):
        return None
    return scope.deadline


class BoundedSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with a limit per token as well as in total.

    The limits concern 2025-11-25 sessions kept in this process's memory, so they apply in embedded
    mode only: in replica mode (``stateless``) no session is kept, each request is served on its own
    (progress still streams within it) and there is nothing to bound.

    Admitting a session for a token already at ``max_per_token`` closes that token's session idle
    the longest; at the total limit, the session idle the longest of the token holding the most
    sessions is closed. A session serving a request is never closed: when nothing can be closed
    the new session is refused with 503 (the SDK's answer), so one token can only ever crowd itself.

    A 2026-07-28 POST is served by the SDK's single-exchange entry in its JSON mode unless ``streams``
    says the request may need the event stream (``edge.mcp.may_stream``): an answer with nothing to
    stream before it is one JSON body either way, and the JSON mode runs it in the request's own task,
    with no task group, stream or watcher around it.
    """

    def __init__(self, *args: Any, max_per_token: int, metrics: Metrics,
                 streams: Callable[[bytes], bool] = lambda _body: True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_per_token = max_per_token
        self.metrics = metrics
        self.streams = streams

    async def _handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = next((v for k, v in scope["headers"] if k == b"mcp-protocol-version"), None)
        if scope["method"] != "POST" or version is None or self._task_group is None \
                or version.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS:
            await super()._handle_request(scope, receive, send)
            return
        body, ended = await _whole_body(receive)
        if not ended:  # the client went before its body did: nothing to answer
            return
        await handle_modern_request(self.app, self.security_settings, not self.streams(body),
                                    self._lifespan_state, scope, _replayed(body, receive), send)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        owner = _owner(requestor)
        held: dict[tuple[str, str | None], list[str]] = {}
        for session_id in self._server_instances:
            held.setdefault(_owner(self._session_owners.get(session_id)), []).append(session_id)
        mine = held.get(owner, [])
        if len(mine) >= self.max_per_token and not self._evict(mine):
            self.metrics.refusal("sessions")
            log.warning("refused a new MCP session for %s: its %d sessions are all busy", owner[0], len(mine))
            return None
        total = len(self._server_instances)
        if self.max_sessions is not None and total >= self.max_sessions:
            for _holder, sessions in sorted(held.items(), key=lambda item: -len(item[1])):
                if self._evict(sessions):
                    break
            else:
                self.metrics.refusal("sessions")
                log.warning("refused a new MCP session: all %d sessions are busy", total)
                return None
        return super()._admit_session(requestor)

    def _evict(self, sessions: Iterable[str]) -> bool:
        """Close the session of ``sessions`` idle the longest; False when every one is busy."""
        idle = [(since, sid) for sid in sessions
                if (since := _idle_since(self._server_instances[sid])) is not None]
        if not idle or self._task_group is None:
            return False
        _since, session_id = min(idle)
        transport = self._server_instances.pop(session_id)
        self._session_owners.pop(session_id, None)
        log.info("closed MCP session %s (idle the longest) to make room for a new one", session_id)
        self._task_group.start_soon(self._discard_session, session_id, transport)
        return True


async def _whole_body(receive: Receive) -> tuple[bytes, bool]:
    """The request's body (its size is bounded by the edge) and whether it arrived whole."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", False
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), True


def _replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` that first hands out ``body`` again, then what the connection says next."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def build_app(
    gateway: AppGateway, config: EdgeConfig, *, version: str = "", web: ASGIApp | None = None,
    audit: AuditWriter | None = None, stateless: bool = False,
) -> Starlette:
    """The whole HTTP application for ``gateway``; ``app.state.in_flight`` counts tool calls running,
    ``app.state.drain`` is the gate a stop closes, ``app.state.refusals`` the refused-token audit
    (rows go to ``audit``, by default ``gateway.audit`` when the gateway has one).

    ``stateless`` (replica mode, with a shared database): no MCP session is kept and no Mcp-Session-Id
    issued, so any replica serves any request of either revision; see ``BoundedSessionManager``."""
    if web is not None:
        config = replace(config, self_authenticating_prefixes=(*config.self_authenticating_prefixes, "/ui"))
    config = replace(config, open_paths=config.open_paths | OAUTH_DISCOVERY)
    in_flight = InFlightCalls()
    gate = DrainGate()
    # refused tokens are written through the trail (so they are forwarded to syslog like every row)
    sink = audit if audit is not None else getattr(gateway, "trail", None) or getattr(gateway, "audit", None)
    refusals = RefusalAudit(sink,
                            interval=config.refusal_audit_seconds, surface=config.surface)
    gateway.metrics.add_collector("targets", lambda: _target_metrics(gateway))
    gateway.metrics.add_collector("audit", lambda: audit_families(getattr(gateway, "audit", None)))
    server = build_mcp_server(gateway, middleware.current_principal, version=version, in_flight=in_flight)
    manager = BoundedSessionManager(
        app=server, json_response=False, stateless=stateless, security_settings=config.transport_security(),
        session_idle_timeout=config.session_idle_seconds, max_sessions=config.max_sessions,
        max_request_body_size=config.max_body_bytes, max_per_token=config.max_sessions_per_token,
        metrics=gateway.metrics, streams=lambda body: may_stream(gateway, body),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(refusals.run)
                try:
                    async with manager.run():
                        yield
                finally:
                    tasks.cancel_scope.cancel()
            await refusals.flush()
        finally:
            await gateway.close()

    # a call's answer travels as one JSON body unless something (progress) must stream first: clients
    # cap single server-sent events (the SDK at 1 MiB), and a large inventory answer exceeds that
    mcp_endpoint = AnswerAsJson(StreamableHTTPASGIApp(manager))
    identity: IdentityService | None = getattr(gateway, "identity", None)
    caller = ProbeCaller(gateway.authenticator, identity, refusals, gateway.metrics, surface=config.surface)
    probes = _probe_routes(gateway, caller, identity, refusals)
    routes: list[BaseRoute] = [Route("/mcp", mcp_endpoint), *probes]
    if isinstance(gateway, ProofGateway):  # the audit log's checkpoint and proofs (edge/audit_proofs.py)
        routes.extend(audit_proof_routes(gateway))
    if web is not None:
        routes.append(Mount("/ui", app=web))
    app = Starlette(routes=routes, middleware=_edge_stack(gateway, config, gate, refusals), lifespan=lifespan)
    app.state.in_flight = in_flight
    app.state.drain = gate
    app.state.refusals = refusals
    app.state.metrics = gateway.metrics
    return app


def _target_metrics(gateway: AppGateway) -> list[Metric]:
    return target_families(_target_stats(gateway))


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


def header_deadline_protocol(  # noqa: C901 - counts the methods of the class it builds, each short
    seconds: float, on_timeout: Callable[[], None] | None = None,
) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for request headers: a connection whose request line and
    headers are not complete ``seconds`` after they began (after the connection opened, or after the
    first byte of a next request on a kept-alive connection) is closed. uvicorn itself only bounds the
    wait *between* requests (keep-alive), so without this a client sending a byte now and then holds
    a connection forever (slowloris)."""

    class HeaderDeadlineProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # never uvicorn's access log: it writes the query string (where a token may be); it is off
            # only while "uvicorn.access" has no handler, which any root handler defeats
            self.access_log = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.info("closed a connection from %s: request headers incomplete after %gs",
                         self.client[0] if self.client else "?", seconds)
                if on_timeout is not None:
                    on_timeout()
                self.transport.close()

    return HeaderDeadlineProtocol


def uvicorn_config(
    app: ASGIApp, config: EdgeConfig, *, host: str, port: int, ssl_context: ssl.SSLContext | None,
    forwarded_allow_ips: str | None = None,
) -> uvicorn.Config:
    """How ``gateway serve`` runs ``app``: h11 (so the header size limit applies) with a header deadline,
    our TLS context, no uvicorn access log (ours never logs query strings), proxy headers only from
    trusted proxies, and uvloop's event loop where it is installed (uvicorn's ``auto``; faster than
    asyncio's own loop: bench/RESULTS.md)."""
    factory = None if ssl_context is None else (lambda _config, _default: ssl_context)
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    on_timeout = None if metrics is None else (lambda: metrics.refusal("header_timeout"))
    return uvicorn.Config(
        app, host=host, port=port, http=header_deadline_protocol(config.header_timeout_seconds, on_timeout),
        h11_max_incomplete_event_size=config.max_header_bytes,
        ssl_context_factory=factory, proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips, access_log=False, log_config=None, server_header=False,
        lifespan="on", timeout_graceful_shutdown=STREAM_CLOSE_SECONDS, loop="auto",
    )


class GatewayServer(uvicorn.Server):
    """uvicorn's server with an orderly stop.

    The first SIGTERM/SIGINT (or ``begin_stop()``) makes readiness fail at once, keeps serving for
    ``drain_seconds`` so a load balancer notices, then answers every new request 503 (closing the
    app's ``DrainGate``) while the tool calls in progress finish (at most ``grace_seconds``), before
    uvicorn stops accepting and closes what is left. A second signal stops at once, as plain uvicorn
    does.
    """

    def __init__(self, config: uvicorn.Config, gateway: AppGateway, in_flight: InFlightCalls, *,
                 drain_seconds: float = 0.0, grace_seconds: float = 30.0,
                 gate: DrainGate | None = None) -> None:
        super().__init__(config)
        self.gateway, self.in_flight = gateway, in_flight
        found = getattr(getattr(config.app, "state", None), "drain", None)
        self.gate = gate or (found if isinstance(found, DrainGate) else DrainGate())
        self.drain_seconds, self.grace_seconds = drain_seconds, grace_seconds
        self.stop_requested: float | None = None

    def begin_stop(self) -> None:
        if self.stop_requested is None:
            self.stop_requested = time.monotonic()
            self.gateway.draining = True
            if self.drain_seconds <= 0:
                self.gate.close()
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
        self.gate.close()
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
