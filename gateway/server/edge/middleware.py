"""The hardened edge: ASGI middleware every HTTP request passes before anything else sees it.

Outermost first (composed in ``gateway.server.edge.app.build_app``)::

    CorrelationId     trace id from traceparent / X-Request-ID / X-Correlation-ID, else a new one;
                      echoed as X-Correlation-ID, visible to the pipeline through correlation_id_var,
                      and written to the access log (path only: a query string is never logged;
                      successful probes log at DEBUG)
    Drain             503 for every new request (probes excepted) once the server stops taking work
    HostAllowList     421 unless Host is a public name (DNS rebinding); the probes answer any Host
    OriginAllowList   403 when an Origin header is present and is not the server's own origin
    RequestSize       431 past the header size limit; 413 past the body size limit (declared or
                      counted while streaming); 408 when the body does not arrive within the deadline
    QueryToken        400 for a token anywhere in the query string: a URL ends up in logs and histories
    BearerAuth        401 (WWW-Authenticate: Bearer, and how to get a token) without a valid token, 429
                      while throttled (see ``gateway.auth.tokens``), 503 while argon2 is saturated or
                      more than ``max_unverified_requests`` tokens this process has not proven yet are
                      being checked (their own budget: a token already proven skips it); a valid token
                      becomes the SDK's AuthenticatedUser, so get_access_token() works in handlers and
                      each MCP session stays bound to the token that opened it. Refused tokens are
                      counted per (source, reason) and audited in aggregate (``RefusalAudit``).
                      With identity.yaml, a bearer token that is not a ``gwt_`` one is an identity
                      provider's JWT (``gateway.server.edge.oauth``): 401s then carry
                      ``resource_metadata`` and ``scope``; 403 for an unmapped identity or a missing
                      scope (``error="insufficient_scope"``), 503 naming a provider with no usable keys
    ConcurrencyLimit  503 beyond the limit of authenticated requests in progress (long-lived event
                      streams excepted): a flood of bad tokens is refused above and never takes a slot

uvicorn also bounds headers still arriving (``h11_max_incomplete_event_size`` = ``max_header_bytes``),
and ``gateway.server.edge.app`` gives it a protocol that closes a connection whose request headers are not
complete within ``header_timeout_seconds`` (slowloris).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol
from urllib.parse import unquote_plus, urlsplit

import anyio
import anyio.to_thread
from mcp.server.auth.middleware.auth_context import auth_context_var, get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import PrivateAttr
from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import tracing
from gateway.auth.principal import parse_key
from gateway.auth.tokens import TOKEN_PREFIX, Principal, Verdict
from gateway.errors import GatewayError, InvalidArgument, StateUnavailable
from gateway.identity.service import IdentityRefusal
from gateway.server.edge.oauth import OAuthGate, claims_of, refusal_code
from gateway.vocabulary import Kind

log = logging.getLogger(__name__)
access_log = logging.getLogger("gateway.access")

#: the current request's correlation id; the pipeline reads it for audit rows and error messages
correlation_id_var: ContextVar[str | None] = ContextVar("gateway_correlation_id", default=None)

REALM: Final = "vsphere-mcp-gateway"
_SAFE_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_TRACEPARENT: Final = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
_QUERY_TOKEN_KEYS: Final = frozenset({"access_token", "token"})
#: what a client without a token is told (401 body and challenge, OAuth discovery paths)
TOKEN_HINT: Final = ("this gateway needs a bearer token made with `gateway token create NAME --role ROLE` "
                     "by its operator; send it as 'Authorization: Bearer <token>' (MCP Inspector: --header "
                     "'Authorization: Bearer <token>'); it offers no OAuth sign-in")
#: what a client without a token is told when identity.yaml names identity providers
IDP_HINT: Final = ("sign in with your organisation's identity provider: an MCP client follows the "
                   "WWW-Authenticate header's resource_metadata to this gateway's protected resource "
                   "metadata "
                   "and its authorization servers; a gateway token (`gateway token create`) works as well")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "::1")


class Counter(Protocol):
    """What the edge records refusals into (``gateway.server.base.metrics.Metrics``)."""

    def refusal(self, reason: str) -> None: ...

    def auth_failure(self, reason: str) -> None: ...


class Authenticator(Protocol):
    """The token side the edge needs (``gateway.auth.tokens.TokenAuthenticator``)."""

    async def verify_async(self, token: str, client: str = "") -> Principal | None: ...

    async def authenticate(self, token: str, client: str = "") -> Verdict: ...

    def proven(self, token: str) -> bool: ...


# ---------------------------------------------------------------------------- names and config


def split_authority(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (IPv6 in brackets) -> (lower-case host without brackets or final dot, port)."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/?#@ \t"):
        return None
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif value.count(":") > 1:
        return None  # an IPv6 address must be bracketed
    else:
        host, sep, port = value.partition(":")
        port_text = port if sep else None
    if port_text is not None and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        return None
    host = host.rstrip(".")
    return (host, int(port_text) if port_text is not None else None) if host else None


@dataclass(frozen=True)
class HostPattern:
    """A name clients use to reach this server; ``port`` None accepts any port."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        parsed = split_authority(text)
        if parsed is None:
            raise InvalidArgument("public_name", f"{text!r} is not a host name with an optional :port")
        return cls(*parsed)

    def matches(self, host: str, port: int | None, scheme: str) -> bool:
        if host != self.host:
            return False
        if self.port is None or port == self.port:
            return True
        return port is None and self.port == _DEFAULT_PORTS.get(scheme)

    def bracketed(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    def authority(self) -> str:
        return self.bracketed() if self.port is None else f"{self.bracketed()}:{self.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class EdgeConfig:
    """Everything the edge enforces; built once by ``gateway serve`` (``for_https`` / ``for_http``)."""

    hosts: tuple[HostPattern, ...]
    origin_schemes: frozenset[str] = frozenset({"https"})
    surface: str = "https"
    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 16 << 10
    receive_timeout_seconds: float = 30.0
    max_concurrent_requests: int = 64
    #: requests whose token this process has not proven yet, checked at once; beyond, 503 at once
    max_unverified_requests: int = 64
    #: an MCP session with no request in flight for this long is closed (its id then answers 404)
    session_idle_seconds: float = 30 * 60
    #: paths served without a token (exact match)
    open_paths: frozenset[str] = frozenset({"/healthz", "/readyz"})
    #: probes answer any Host: load balancers and kubelets address the pod or node, not the public name
    any_host_paths: frozenset[str] = frozenset({"/healthz", "/readyz"})
    #: path prefixes that authenticate themselves (the approval page's cookie login)
    self_authenticating_prefixes: tuple[str, ...] = ()
    #: paths whose GET is a long-lived event stream (not counted against the concurrency limit)
    stream_paths: frozenset[str] = frozenset({"/mcp"})
    #: MCP sessions (2025-11-25 revision) open at once, in total and per token; a token at its limit
    #: loses its own session idle the longest, and at the total limit the biggest holder loses one
    max_sessions: int = 1000
    max_sessions_per_token: int = 32
    #: a connection whose request headers are not complete this long after they began is closed
    header_timeout_seconds: float = 10.0
    #: refused tokens are audited once per (source, reason) per this many seconds, with a count
    refusal_audit_seconds: float = 60.0

    @classmethod
    def for_https(cls, public_names: Iterable[str], **options: Any) -> EdgeConfig:
        hosts = tuple(HostPattern.parse(n) for n in public_names)
        if not hosts:
            raise InvalidArgument("public_name", "https needs at least one --public-name clients connect to")
        return cls(hosts=hosts, **options)

    @classmethod
    def for_http(cls, public_names: Iterable[str] = (), **options: Any) -> EdgeConfig:
        """Loopback HTTP, usually behind a TLS-terminating proxy that forwards the public names."""
        loopback = tuple(HostPattern(n) for n in LOOPBACK_NAMES)
        hosts = loopback + tuple(HostPattern.parse(n) for n in public_names)
        return cls(hosts=hosts, origin_schemes=frozenset({"http", "https"}), surface="http", **options)

    def host_allowed(self, header: str | None, scheme: str) -> bool:
        parsed = split_authority(header or "")
        return parsed is not None and any(p.matches(*parsed, scheme) for p in self.hosts)

    def origin_allowed(self, origin: str) -> bool:
        parts = urlsplit(origin.strip())
        if parts.scheme not in self.origin_schemes or parts.path or parts.query or parts.username:
            return False
        parsed = split_authority(parts.netloc)
        return parsed is not None and any(p.matches(*parsed, parts.scheme) for p in self.hosts)

    def needs_token(self, path: str) -> bool:
        return path not in self.open_paths and not any(
            path == p or path.startswith(p + "/") for p in self.self_authenticating_prefixes)

    def self_check_host(self) -> str:
        """A Host header this edge accepts (the startup self-check sends it)."""
        return self.hosts[0].authority()

    def transport_security(self) -> TransportSecuritySettings:
        """The same allow-list for the SDK's own check on /mcp (defence in depth, never wider)."""
        hosts: list[str] = []
        origins: list[str] = []
        for p in self.hosts:
            spellings = [p.bracketed(), f"{p.bracketed()}:*"] if p.port is None else [p.authority()]
            hosts += spellings
            if p.port is not None and p.port in _DEFAULT_PORTS.values():
                hosts.append(p.bracketed())
            for scheme in sorted(self.origin_schemes):
                origins += [f"{scheme}://{s}" for s in spellings]
                if p.port == _DEFAULT_PORTS[scheme]:
                    origins.append(f"{scheme}://{p.bracketed()}")
        return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=origins)


# ---------------------------------------------------------------------------- helpers


def correlation_id_from(headers: Headers) -> str:
    """The caller's trace id when it is safe to echo and log, else a fresh one."""
    match = _TRACEPARENT.fullmatch(headers.get("traceparent", "").strip().lower())
    if match and match.group(1) != "0" * 32:
        return match.group(1)
    for name in ("x-request-id", "x-correlation-id"):
        value = headers.get(name, "").strip()
        if _SAFE_ID.fullmatch(value):
            return value
    return uuid.uuid4().hex


async def refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
    """Answer with the gateway's error body ``{"error": {"code", "message"}}``."""
    body = {"error": {"code": code, "message": message}}
    response = JSONResponse(body, status_code=status, headers=headers)
    await response(scope, receive, send)


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def _log_safe(value: str | None) -> str:
    return repr((value or "")[:200])


# ---------------------------------------------------------------------------- middleware


class CorrelationIdMiddleware:
    """Sets ``correlation_id_var``, echoes ``X-Correlation-ID``, adds security headers, logs access."""

    def __init__(self, app: ASGIApp, *, hsts: bool = False,
                 quiet_paths: frozenset[str] = frozenset()) -> None:
        self.app, self.quiet_paths = app, quiet_paths
        extra = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
        if hsts:
            extra.append((b"strict-transport-security", b"max-age=31536000"))
        self._extra = extra

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cid = correlation_id_from(Headers(scope=scope))
        status = 0
        started = time.monotonic()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # a new list: some apps send a shared module-level header list
                headers = [*message.get("headers", []), (b"x-correlation-id", cid.encode()), *self._extra]
                message = {**message, "headers": headers}
            await send(message)

        reset = correlation_id_var.set(cid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            correlation_id_var.reset(reset)
            user = scope.get("user")
            level = logging.DEBUG if scope["path"] in self.quiet_paths and status < 400 else logging.INFO
            access_log.log(level, "%s %s %s %d %.1fms cid=%s caller=%s", _client(scope), scope["method"],
                           scope["path"], status, (time.monotonic() - started) * 1000, cid,
                           user.display_name if isinstance(user, AuthenticatedUser) else "-")


class HostAllowListMiddleware:
    def __init__(self, app: ASGIApp, *, config: EdgeConfig, metrics: Counter) -> None:
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.config.any_host_paths:
            host = Headers(scope=scope).get("host")
            if not self.config.host_allowed(host, scope.get("scheme", "http")):
                log.warning("refused Host %s from %s (correlation id %s)", _log_safe(host), _client(scope),
                            correlation_id_var.get())
                self.metrics.refusal("host")
                await refuse(scope, receive, send, 421, "misdirected_request",
                             "this server does not answer to that Host name; connect with its public name")
                return
        await self.app(scope, receive, send)


class OriginAllowListMiddleware:
    def __init__(self, app: ASGIApp, *, config: EdgeConfig, metrics: Counter) -> None:
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.config.any_host_paths:
            origin = Headers(scope=scope).get("origin")
            if origin is not None and not self.config.origin_allowed(origin):
                log.warning("refused Origin %s from %s (correlation id %s)", _log_safe(origin),
                            _client(scope), correlation_id_var.get())
                self.metrics.refusal("origin")
                await refuse(scope, receive, send, 403, "forbidden_origin",
                             "requests from that web origin are not accepted")
                return
        await self.app(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class RequestSizeMiddleware:
    """Bounds what a request may send before the app runs: headers (431), body (413), time (408).

    uvicorn's h11 limit only catches headers that arrive incomplete; this counts what was parsed.
    The body is read whole here, counting what arrives (not only Content-Length) so chunked bodies
    are caught; the app then reads the buffered body, and later ``receive`` calls (waiting for a
    disconnect) go to the server as usual.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_header_bytes: int, timeout: float,
                 metrics: Counter) -> None:
        self.app, self.max_bytes, self.max_header_bytes = app, max_body_bytes, max_header_bytes
        self.timeout, self.metrics = timeout, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > self.max_header_bytes:
            self.metrics.refusal("headers_too_large")
            await refuse(scope, receive, send, 431, "headers_too_large",
                         f"request headers larger than {self.max_header_bytes} bytes")
            return
        declared = Headers(scope=scope).get("content-length", "")
        try:
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise _BodyTooLarge
            with anyio.fail_after(self.timeout):
                buffered = await self._read(receive)
        except _BodyTooLarge:
            self.metrics.refusal("body_too_large")
            await refuse(scope, receive, send, 413, "payload_too_large",
                         f"request body larger than {self.max_bytes} bytes")
            return
        except TimeoutError:
            self.metrics.refusal("receive_timeout")
            await refuse(scope, receive, send, 408, "request_timeout",
                         f"request body not received within {self.timeout:g}s")
            return

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> list[Message]:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return [{"type": "http.request", "body": bytes(body), "more_body": False}, message]
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                raise _BodyTooLarge
            if not message.get("more_body", False):
                return [{"type": "http.request", "body": bytes(body), "more_body": False}]


class ConcurrencyLimitMiddleware:
    """503 with Retry-After beyond ``limit`` requests in progress (health probes and GET streams excepted)."""

    def __init__(self, app: ASGIApp, *, limit: int, config: EdgeConfig, metrics: Counter) -> None:
        self.app, self.limit, self.config, self.metrics = app, limit, config, metrics
        self.in_progress = 0

    def _counted(self, scope: Scope) -> bool:
        path = scope["path"]
        streaming = scope["method"] == "GET" and path in self.config.stream_paths
        return not streaming and path not in self.config.any_host_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._counted(scope):
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.limit:
            self.metrics.refusal("overloaded")
            await refuse(scope, receive, send, 503, "overloaded",
                         "too many requests in progress; retry shortly", headers={"Retry-After": "1"})
            return
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1


class QueryTokenMiddleware:
    """Refuses a credential in the URL before anything could log or cache it: a ``token`` or
    ``access_token`` parameter, or a gateway token (``gwt_``) anywhere in the query string."""

    def __init__(self, app: ASGIApp, *, metrics: Counter) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("query_string") and _credential_in(scope["query_string"]):
            self.metrics.refusal("token_in_query")
            await refuse(scope, receive, send, 400, "token_in_query",
                         "never put a token in the URL (it ends up in logs and histories); send it as "
                         "'Authorization: Bearer <token>' and revoke the one you sent")
            return
        await self.app(scope, receive, send)


def _credential_in(query: bytes) -> bool:
    text = query.decode("latin-1")
    decoded = unquote_plus(unquote_plus(text)).lower()  # twice: a doubly encoded token is still one
    if TOKEN_PREFIX in decoded:
        return True
    keys = (part.partition("=")[0].strip() for part in decoded.replace(";", "&").split("&"))
    return any(key in _QUERY_TOKEN_KEYS for key in keys)


class DrainGate:
    """Open while the server takes new requests; ``close()`` when it stops (``GatewayServer``)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class DrainMiddleware:
    """503 for new requests once the gate is closed; requests already in progress go on."""

    def __init__(self, app: ASGIApp, *, gate: DrainGate, config: EdgeConfig, metrics: Counter) -> None:
        self.app, self.gate, self.config, self.metrics = app, gate, config, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.gate.closed and scope["path"] not in self.config.any_host_paths:
            self.metrics.refusal("draining")
            await refuse(scope, receive, send, 503, "draining",
                         "this gateway instance is shutting down and takes no new requests; retry (another "
                         "instance will answer)", headers={"Retry-After": "1", "Connection": "close"})
            return
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------------- authentication


class EdgeAccessToken(AccessToken):
    """The SDK's view of a caller that also holds the edge's own ``Principal`` of this request, so the
    call reads the caller as the edge found it (``Principal.as_read``: the token's record the edge read
    for this request) instead of rebuilding a poorer copy from the claims. The principal is private:
    never serialized, never compared."""

    _principal: Principal | None = PrivateAttr(default=None)

    def __init__(self, principal: Principal, **fields: Any) -> None:
        super().__init__(**fields)
        self._principal = principal

    @property
    def principal(self) -> Principal | None:
        return self._principal


def access_token_for(principal: Principal, *, idp: bool = False) -> AccessToken:
    """The SDK's view of a caller. ``subject`` is the token id, so a session opened with one token
    cannot be continued with another token of the same name (the SDK compares both); a caller from an
    identity provider (``idp``) is its key text (issuer and client id or ``sub``), so it keeps its
    session across its refreshed tokens and no other caller showing the same name continues it."""
    claims: dict[str, Any] = {"gateway_role": principal.role, "gateway_surface": principal.surface}
    if idp:
        claims.update(claims_of(principal))
        return EdgeAccessToken(principal, token=str(principal.key), client_id=principal.name,
                               scopes=sorted(principal.scopes or ()), subject=f"idp:{principal.key}",
                               claims=claims)
    return EdgeAccessToken(principal, token=principal.token_id or principal.name, client_id=principal.name,
                           scopes=[], subject=principal.token_id, claims=claims)


def principal_of(access: AccessToken) -> Principal | None:
    """The caller ``access`` stands for: the edge's own principal when it made ``access``, else (an
    access token from elsewhere) the one its claims describe."""
    if isinstance(access, EdgeAccessToken) and access.principal is not None:
        return access.principal
    claims = access.claims or {}
    role, surface = claims.get("gateway_role"), claims.get("gateway_surface")
    if not isinstance(role, str) or not isinstance(surface, str):
        return None
    if claims.get("gateway_idp") is True:
        scopes, acting_for = claims.get("gateway_scopes"), claims.get("gateway_acting_for")
        key = parse_key(claims.get("gateway_key"))
        if key is None or key.space not in ("person", "client"):  # an IdP's caller has its own key
            return None
        return Principal(name=access.client_id, role=role, surface=surface, kind=Kind(claims["gateway_kind"]),
                         acting_for=acting_for if isinstance(acting_for, str) else None,
                         scopes=frozenset(scopes) if isinstance(scopes, list) else None, key=key,
                         acting_for_key=parse_key(claims.get("gateway_acting_for_key")))
    return Principal(name=access.client_id, role=role, token_id=access.subject, surface=surface)


def current_principal() -> Principal | None:
    """The authenticated caller of the current HTTP request (None outside one)."""
    access = get_access_token()
    return principal_of(access) if access is not None else None


def _bearer(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class AuditWriter(Protocol):
    """Where refused tokens are recorded (``gateway.audit.file_sink.AuditSink``); ``write`` may block."""

    def write(self, event: Mapping[str, Any]) -> Any: ...


#: token ids a ``token_refused`` row names, at most (the count covers them all)
MAX_TOKEN_IDS: Final = 20


class RefusalAudit:
    """Refused authentications, counted per (source, reason) and audited in aggregate.

    ``record`` only counts (on the event loop, no I/O); ``flush`` writes one ``token_refused`` row per
    (source, reason) with its count and the ids of the stored tokens refused (``token_ids``: a revoked
    or expired token's id, at most ``MAX_TOKEN_IDS``), in a worker thread with a deadline, and ``run``
    flushes every ``interval`` seconds. At most ``max_sources`` keys are kept per interval; beyond that
    sources are counted under ``*``, so a flood from many addresses still makes a bounded number of
    rows. Rows that cannot be written are kept and retried with the next flush.
    """

    def __init__(self, sink: AuditWriter | None, *, interval: float, surface: str, max_sources: int = 256,
                 write_seconds: float = 10.0) -> None:
        self.sink, self.interval, self.surface = sink, interval, surface
        self.max_sources, self.write_seconds = max_sources, write_seconds
        self._counts: dict[tuple[str, str], int] = {}
        self._token_ids: dict[tuple[str, str], set[str]] = {}
        self._since = time.time()

    def record(self, source: str, reason: str, token_id: str | None = None) -> None:
        key = (source, reason)
        if key not in self._counts and len(self._counts) >= self.max_sources:
            key = ("*", reason)
        self._counts[key] = self._counts.get(key, 0) + 1
        ids = self._token_ids.setdefault(key, set())
        if token_id is not None and len(ids) < MAX_TOKEN_IDS:
            ids.add(token_id)

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            await self.flush()

    async def flush(self) -> None:
        if self.sink is None or not self._counts:
            return
        counts, self._counts = self._counts, {}
        token_ids, self._token_ids = self._token_ids, {}
        since, self._since = self._since, time.time()
        rows = [{"phase": "token_refused", "caller": "-", "surface": self.surface, "source": source,
                 "reason": reason, "count": count, "since": round(since, 3),
                 "token_ids": sorted(token_ids.get((source, reason), ())) or None}
                for (source, reason), count in sorted(counts.items())]
        written = 0

        def write_all() -> None:
            nonlocal written
            assert self.sink is not None
            for row in rows:
                self.sink.write(row)
                written += 1

        try:
            with anyio.fail_after(self.write_seconds):
                await anyio.to_thread.run_sync(write_all, abandon_on_cancel=True)
        except (GatewayError, OSError, TimeoutError) as exc:
            log.warning("refused tokens not audited yet (%s); retrying with the next flush",
                        type(exc).__name__)
            for key, count in sorted(counts.items())[written:]:
                self._counts[key] = self._counts.get(key, 0) + count
                self._token_ids.setdefault(key, set()).update(token_ids.get(key, ()))
            self._since = since


@dataclass
class BearerAuthMiddleware:
    app: ASGIApp
    authenticator: Authenticator
    config: EdgeConfig
    metrics: Counter
    refusals: RefusalAudit | None = None
    #: identity provider tokens (identity.yaml); None: gateway tokens only, as without the file
    oauth: OAuthGate | None = None
    _challenge: str = field(default=f'Bearer realm="{REALM}"', init=False)
    #: checks in progress of tokens not proven yet (on the event loop only: no lock needed)
    _unverified: int = field(default=0, init=False)
    #: RFC 6750 puts no error code on a request without credentials; the description says what to do
    _missing: str = field(default=f'Bearer realm="{REALM}", error_description="a bearer token from '
                          "'gateway token create' is required\"", init=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.config.needs_token(scope["path"]):
            await self.app(scope, receive, send)
            return
        client = _client(scope)
        token = _bearer(Headers(scope=scope))
        if token is None:
            self._refused(client, "missing")
            hint = TOKEN_HINT if self.oauth is None else IDP_HINT
            await refuse(scope, receive, send, 401, "unauthorized",
                         f"a bearer token is required: {hint}",
                         headers={"WWW-Authenticate": self._missing if self.oauth is None
                                  else self.oauth.missing_challenge()})
            return
        if self.oauth is not None and not token.startswith(TOKEN_PREFIX):
            await self._identity_call(scope, receive, send, client, token)
            return
        verdict = await self._admitted_check(token, client)
        if verdict.principal is None:
            await self._refuse_token(scope, receive, send, client, verdict)
            return
        await self._serve(scope, receive, send, access_token_for(replace(verdict.principal,
                                                                         surface=self.config.surface)))

    async def _identity_call(self, scope: Scope, receive: Receive, send: Send, client: str,
                             token: str) -> None:
        """A token from an identity provider (``gateway.server.edge.oauth``)."""
        assert self.oauth is not None
        try:
            principal, receive = await self.oauth.check(scope, receive, token)
        except IdentityRefusal as refusal:
            self._refused(client, f"idp_{refusal.reason}")
            headers = {"WWW-Authenticate": refusal.challenge} if refusal.challenge else {}
            if refusal.retry_after is not None:
                headers["Retry-After"] = str(max(1, math.ceil(refusal.retry_after)))
            await refuse(scope, receive, send, refusal.status, refusal_code(refusal), refusal.message,
                         headers=headers)
            return
        await self._serve(scope, receive, send, access_token_for(principal, idp=True))

    async def _serve(self, scope: Scope, receive: Receive, send: Send, access: AccessToken) -> None:
        user = AuthenticatedUser(access)
        scope["user"], scope["auth"] = user, AuthCredentials(access.scopes)
        reset = auth_context_var.set(user)
        try:
            await self.app(scope, receive, send)
        finally:
            auth_context_var.reset(reset)

    async def _admitted_check(self, token: str, client: str) -> Verdict:
        """A token this process has proven is checked at once; any other takes one of the
        ``max_unverified_requests`` places first, or is refused as busy (it never waits)."""
        if self.authenticator.proven(token):
            return await self._check(token, client)
        if self._unverified >= self.config.max_unverified_requests:
            return Verdict(None, "busy", 1.0)
        self._unverified += 1
        try:
            return await self._check(token, client)
        finally:
            self._unverified -= 1

    async def _check(self, token: str, client: str) -> Verdict:
        try:
            with tracing.span("gateway.authenticate"):
                return await self.authenticator.authenticate(token, client)
        except GatewayError:  # the token store cannot be read: fail closed
            log.exception("token check failed (correlation id %s)", correlation_id_var.get())
            return Verdict(None, "unavailable", 5.0)

    def _refused(self, client: str, reason: str, token_id: str | None = None) -> None:
        self.metrics.auth_failure(reason)
        if self.refusals is not None:
            self.refusals.record(client, reason, token_id)

    async def _refuse_token(self, scope: Scope, receive: Receive, send: Send, client: str,
                            verdict: Verdict) -> None:
        self._refused(client, verdict.reason, verdict.token_id)
        retry = {"Retry-After": str(max(1, math.ceil(verdict.retry_after or 1)))}
        if verdict.reason == "throttled":
            await refuse(scope, receive, send, 429, "rate_limited",
                         "too many failed authentications from this address with this token; wait before "
                         "retrying", headers=retry)
        elif verdict.reason == "busy":
            await refuse(scope, receive, send, 503, "overloaded",
                         "tokens cannot be checked right now; retry shortly", headers=retry)
        elif verdict.reason == "unavailable":
            await refuse(scope, receive, send, 503, StateUnavailable.code,
                         "the gateway's state store (its database) is unavailable, so the call was refused; "
                         "retry shortly, and if it persists check the database (/readyz says)", headers=retry)
        else:
            log.debug("refused a token (%s) from %s (correlation id %s)", verdict.reason, client,
                      correlation_id_var.get())
            challenge = (f'{self._challenge}, error="invalid_token"' if self.oauth is None
                         else self.oauth.invalid_challenge())
            await refuse(scope, receive, send, 401, "unauthorized",
                         "the bearer token is invalid, expired or revoked; ask the gateway's operator for a "
                         "new one (`gateway token create`)",
                         headers={"WWW-Authenticate": challenge})
