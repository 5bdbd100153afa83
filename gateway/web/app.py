"""The approval page: static files and a small JSON API, mounted at /ui by ``gateway.server.edge.app``.

Everything goes through the same gateway as MCP callers (the same checks and audit rows, surface
``web``); the page creates nothing but approvals and denials. Every POST needs a JSON body (no
cross-site form), the origin check and, but sign-in, the CSRF token. Each request re-reads the token
record. Only people sign in: an agent's token is refused at sign-in.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Final

import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.answer import Answer
from gateway.audit.agents import WINDOWS, CallerSummary
from gateway.auth.tokens import TOKEN_PREFIX, CallerKey, Principal, caller_fields
from gateway.errors import (
    AuditUnavailable,
    Forbidden,
    GatewayError,
    InvalidArgument,
    NotFound,
    Unauthorized,
    VSphereError,
)
from gateway.guard.decision import Proposed, audit_view, may_read_audit_row, proposal_rights
from gateway.identity.service import IdentityRefusal
from gateway.identity.verify import MAX_TOKEN_CHARS as MAX_JWT_CHARS
from gateway.proposals import FINAL_STATES, Proposal
from gateway.role import BUILTIN_ROLES, Role
from gateway.server.edge.middleware import correlation_id_var
from gateway.server.runtime import Gateway
from gateway.vocabulary import Kind
from gateway.web.requests import (
    MAX_TOKEN_CHARS,
    proposal_id,
    query_choice,
    query_count,
    query_text,
    reason_from,
    token_from,
)
from gateway.web.session import (
    CSRF_HEADER,
    SessionStore,
    WebSession,
    clear_cookie_header,
    cookie_name,
    csrf_matches,
    origin_refusal,
    set_cookie_header,
)
from gateway.web.sso_routes import SsoRoutes, sign_on_for, sso_principal
from gateway.web.views import agents_body, proposal_card, proposed_by, verify_body

log = logging.getLogger(__name__)

SURFACE: Final = "web"
#: X-Content-Type-Options and Referrer-Policy come from the edge, which adds them to every response
SECURITY_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
     b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
ASSET_TYPES: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
#: inventory kinds the page browses -> the read tool answering them
INVENTORY_TOOLS: Final = {"vms": "list_vms", "hosts": "list_hosts", "clusters": "list_clusters",
                          "datastores": "list_datastores"}
OPEN_STATES: Final = ("pending", "approved", "executing")
RECENT_LIMIT: Final = 50
OPEN_LIMIT: Final = 200
AUDIT_DEFAULT_ROWS: Final = 100
AUDIT_MAX_ROWS: Final = 500
#: rows read per row shown when a role sees only some targets (the rest are filtered out)
AUDIT_SCAN_FACTOR: Final = 20
AUDIT_FILTERS: Final = ("phase", "target", "tool", "caller")
#: the Agents view's window when the page names none
AGENTS_WINDOW: Final = "24h"
#: how a person gets a token the page accepts
PERSON_TOKEN: Final = "`gateway token create NAME --role ROLE --kind person`"
#: HTTP status per error code; other vSphere errors are 502, anything else 400
_STATUS: Final = {
    "invalid_argument": 400, "unauthorized": 401, "forbidden": 403, "policy_denied": 403,
    "not_found": 404, "confirmation_invalid": 409, "approval_required": 409, "stale": 409,
    "reason_required": 400,
    "confirmation_expired": 410, "rate_limited": 429, "config_error": 500, "audit_unavailable": 503,
    "state_unavailable": 503,
}


@dataclass(frozen=True)
class Viewer:
    """The signed-in human of one request: the session, the token's current name and role."""

    session: WebSession
    principal: Principal
    role: Role


def _audit_right(viewer: Viewer) -> None:
    audit_view(viewer.role).raise_if_refused()


def _readable(viewer: Viewer) -> Callable[[Mapping[str, Any]], bool]:
    """Which audit rows ``viewer`` may read (``guard.decision.may_read_audit_row``): the one predicate
    of the Audit tab and the Agents view."""
    name, key = viewer.principal.name, str(viewer.principal.key)
    return lambda row: may_read_audit_row(viewer.role, name, row, viewer_key=key)


def sign_in_role(roles: Mapping[str, Role]) -> str | None:
    """The role the sign-in hint suggests: a custom role that may approve (the deployment's own name for
    it), else a built-in one that may; None when no role may approve."""
    approvers = [name for name, role in roles.items() if role.approve != "none"]
    custom = [name for name in approvers if name not in BUILTIN_ROLES]
    candidates = custom or approvers
    return candidates[0] if candidates else None


def error_status(exc: GatewayError) -> int:
    return _STATUS.get(exc.code) or (502 if isinstance(exc, VSphereError) else 400)


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every response of the page (errors and 404s included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _load_static() -> tuple[bytes, dict[str, bytes]]:
    folder = resources.files("gateway.web").joinpath("static")
    page = folder.joinpath("index.html").read_bytes()
    return page, {name: folder.joinpath(name).read_bytes() for name in ASSET_TYPES}


def _origin_predicate(allowed: Sequence[str] | Callable[[str], bool] | None) -> Callable[[str], bool] | None:
    if allowed is None or callable(allowed):
        return allowed
    accepted = frozenset(o.strip().rstrip("/").lower() for o in allowed)
    return lambda origin: origin.strip().rstrip("/").lower() in accepted


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


Handler = Callable[[Request, Viewer], Awaitable[Any]]
Endpoint = Callable[[Request], Awaitable[Response]]


class WebApi:
    """The page's endpoints over one ``Gateway`` (see the module docstring)."""

    def __init__(self, gateway: Gateway, sessions: SessionStore, *, secure_cookies: bool | None,
                 origin_allowed: Callable[[str], bool] | None) -> None:
        self.gateway, self.sessions = gateway, sessions
        self.secure_cookies, self.origin_allowed = secure_cookies, origin_allowed
        self.page_bytes, self.assets = _load_static()
        # single sign-on (identity.yaml's web_sign_in), None without it
        self.sign_on = sign_on_for(gateway.identity, gateway.settings.identity_env)
        # the Agents view's per-caller counts, caught up from the audit log on each view
        self.callers = CallerSummary()

    def routes(self) -> list[Route]:
        api = self._endpoint
        return [
            Route("/", self.page, methods=["GET"]),
            Route("/static/{name}", self.asset, methods=["GET"]),
            Route("/api/session", self.session_info, methods=["GET"]),
            Route("/api/sign-in", self.sign_in, methods=["POST"]),
            Route("/api/sign-out", self.sign_out, methods=["POST"]),
            Route("/api/proposals", api(self.proposals), methods=["GET"]),
            Route("/api/proposals/{pid}/approve", api(self.approve, change=True), methods=["POST"]),
            Route("/api/proposals/{pid}/deny", api(self.deny, change=True), methods=["POST"]),
            Route("/api/targets", api(self.targets), methods=["GET"]),
            Route("/api/inventory/{kind}", api(self.inventory), methods=["GET"]),
            Route("/api/audit", api(self.audit_tail), methods=["GET"]),
            Route("/api/audit/verify", api(self.audit_verify), methods=["GET"]),
            Route("/api/agents", api(self.agents), methods=["GET"]),
            *self._sso_routes(),
        ]

    def _sso_routes(self) -> list[Route]:
        if self.sign_on is None:
            return []
        return SsoRoutes(self.sign_on, self.sessions, secure=self._secure, cookie_path=self._cookie_path,
                         audit=self._audit_event,
                         role_known=self._role_known).routes()

    async def _role_known(self, principal: Principal) -> bool:
        return await self.gateway.facts.role_now(principal) is not None

    # ------------------------------------------------------------------ plumbing

    def _secure(self, request: Request) -> bool:
        return self.secure_cookies if self.secure_cookies is not None else request.url.scheme == "https"

    def _cookie_path(self, request: Request) -> str:
        return str(request.scope.get("root_path") or "") + "/"

    def _clear_cookie(self, request: Request) -> dict[str, str]:
        cookie = clear_cookie_header(secure=self._secure(request), path=self._cookie_path(request))
        return {"set-cookie": cookie}

    def _session_id(self, request: Request) -> str | None:
        return request.cookies.get(cookie_name(self._secure(request)))

    def _viewer(self, request: Request) -> Viewer:
        """The signed-in viewer, re-checked against the token store; ``Unauthorized`` otherwise."""
        sid = self._session_id(request)
        session = self.sessions.get(sid)
        if session is None:
            raise Unauthorized("you are not signed in, or your session ended; sign in with your token")
        person = sso_principal(session, SURFACE)
        if person is not None:  # signed in through the identity provider: the role mapped then
            sso_role = self.gateway.facts.role_of(person)
            if sso_role is None:
                self.sessions.end(sid)
                raise Unauthorized(f"your role '{person.role}' is no longer defined on this gateway; sign in "
                                   "again")
            return Viewer(session, person, sso_role)
        record = self.gateway.store.token_by_id(session.token_id)
        if (record is None or record.name != session.name or not record.usable(self.sessions.clock())
                or not session.keyed_to(CallerKey.token(record.token_id))):
            self.sessions.end(sid)
            raise Unauthorized("your token was revoked or has expired, so your session ended; sign in with a "
                               f"valid token ({PERSON_TOKEN})")
        if record.kind is not Kind.PERSON:
            self.sessions.end(sid)
            raise Unauthorized("your token is now an agent's, so your session ended: only people sign in to "
                               f"this page; sign in with a person's token ({PERSON_TOKEN})")
        principal = Principal(record.name, record.role, record.token_id, surface=SURFACE, kind=record.kind)
        role = self.gateway.facts.role_of(principal)
        if role is None:
            self.sessions.end(sid)
            raise Unauthorized(f"your token's role '{record.role}' is not defined on this gateway; ask an "
                               "administrator to fix roles.yaml or give your token another role")
        return Viewer(session, principal, role)

    def _check_origin(self, request: Request) -> None:
        reason = origin_refusal(origin=request.headers.get("origin"),
                                fetch_site=request.headers.get("sec-fetch-site"), scheme=request.url.scheme,
                                host=request.headers.get("host"), allowed=self.origin_allowed)
        if reason is not None:
            log.warning("refused a cross-site %s %s: %s", request.method, request.url.path, reason)
            raise Forbidden(reason, reason_code="cross_site")
        if not request.headers.get("content-type", "").lower().startswith("application/json"):
            raise Forbidden("changes are accepted only as JSON sent by this page", reason_code="content_type")

    def _check_csrf(self, request: Request, session: WebSession) -> None:
        if not csrf_matches(session, request.headers.get(CSRF_HEADER)):
            log.warning("refused a %s %s without a valid CSRF token", request.method, request.url.path)
            raise Forbidden("this request lacks the page's CSRF token; reload the page and try again",
                            reason_code="csrf")

    def _error(self, request: Request, exc: GatewayError) -> JSONResponse:
        status = error_status(exc)
        headers = self._clear_cookie(request) if status == 401 else None
        return _json({"error": exc.to_wire()}, status, headers)

    def _endpoint(self, handler: Handler, *, change: bool = False) -> Endpoint:
        """Wrap ``handler`` with authentication, the change checks (origin, JSON, CSRF) and error replies."""

        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            try:
                if change:
                    self._check_origin(request)
                viewer = await anyio.to_thread.run_sync(self._viewer, request)
                if change:
                    self._check_csrf(request, viewer.session)
                body = await handler(request, viewer)
                if isinstance(body, Answer):  # encoded once: these bytes are the ones the audit fingerprints
                    return Response(body.data, media_type="application/json")
                return _json(body)
            except GatewayError as exc:
                return self._error(request, exc)
            except Exception:
                log.exception("the approval page failed on %s %s", request.method, request.url.path)
                return _json({"error": {"code": "internal", "message": "the gateway failed on this request; "
                                        "see its log"}}, 500)

        return endpoint

    async def _audit_event(self, phase: str, principal: Principal, **fields: Any) -> None:
        """Sign-in and sign-out rows; an unwritable log is logged here (approvals refuse it themselves)."""
        row = {"phase": phase, **caller_fields(principal), "kind": principal.kind.value,
               "role": principal.role, "surface": SURFACE, "correlation_id": correlation_id_var.get(),
               **fields}
        try:
            await anyio.to_thread.run_sync(self.gateway.trail.write_row, row)  # forwarded too
        except AuditUnavailable:
            log.warning("could not audit %s of %r: the audit log is not writable", phase, principal.name)

    async def _signed_out(self) -> dict[str, Any]:
        """The signed-out answer, with a role that exists and may approve for the page's sign-in hint (the
        roles as the file says now: read off the loop)."""
        roles = await anyio.to_thread.run_sync(self.gateway.roles.roles)
        body: dict[str, Any] = {"signed_in": False, "sign_in_role": sign_in_role(roles)}
        if self.sign_on is not None:  # single sign-on configured: how people sign in here
            body.update({"sso": True, "token_sign_in": self.sign_on.token_sign_in})
        return body

    def _session_body(self, viewer: Viewer) -> dict[str, Any]:
        return {"signed_in": True, "name": viewer.principal.name, "kind": viewer.principal.kind.value,
                "role": viewer.role.name,
                "approve": viewer.role.approve, "audit": viewer.role.audit,
                "all_targets": viewer.role.all_targets, "csrf": viewer.session.csrf,
                "expires_in_seconds": int(self.sessions.remaining(viewer.session)),
                "idle_timeout_seconds": int(self.sessions.idle)}

    # ------------------------------------------------------------------ page and session

    async def page(self, _request: Request) -> Response:
        return Response(self.page_bytes, media_type="text/html; charset=utf-8")

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.assets:
            return _json({"error": {"code": "not_found", "message": "no such file"}}, 404)
        return Response(self.assets[name], media_type=ASSET_TYPES[name])

    async def session_info(self, request: Request) -> Response:
        try:
            viewer = await anyio.to_thread.run_sync(self._viewer, request)
        except Unauthorized:
            stale = self._session_id(request) is not None
            return _json(await self._signed_out(), headers=self._clear_cookie(request) if stale else None)
        except GatewayError as exc:
            return self._error(request, exc)
        return _json(self._session_body(viewer))

    async def sign_in(self, request: Request) -> Response:
        """Trade a bearer token for a session cookie; the token is read from the JSON body only."""
        client = request.client.host if request.client else ""
        try:
            self._check_origin(request)
            wait = self.gateway.authenticator.throttled(client)
            if wait is not None:
                message = "too many failed sign-ins from this address; wait a minute and try again"
                return _json({"error": {"code": "rate_limited", "message": message}}, 429,
                             {"retry-after": str(max(1, int(wait) + 1))})
            # an identity provider's JWT is longer than a gateway token (it is refused below, audited)
            token = await token_from(request, MAX_TOKEN_CHARS if self.gateway.identity is None
                                     else MAX_JWT_CHARS)
            await self._identity_token_refusal(token)
            principal = await self.gateway.authenticator.verify_async(token, client)
            if principal is None:
                raise Unauthorized("that token is not valid (unknown, revoked or expired); ask an "
                                   f"administrator for one: {PERSON_TOKEN}")
            if principal.kind is not Kind.PERSON:
                await self._audit_event("web_sign_in_refused", replace(principal, surface=SURFACE),
                                        error_code="forbidden", reason_code="agent_token")
                raise Forbidden("this is an agent's token, and only people sign in to the approval page (an "
                                "agent never approves, not even its own proposals); sign in with your own "
                                f"person's token: {PERSON_TOKEN}", reason_code="agent_token")
            role = await self.gateway.facts.role_now(principal)
            if role is None:
                raise Forbidden(f"your token's role '{principal.role}' is not defined on this gateway; ask "
                                "an administrator to fix roles.yaml or give your token another role")
            session = await anyio.to_thread.run_sync(self._new_session, request, principal)
        except GatewayError as exc:
            return self._error(request, exc)
        viewer_principal = replace(principal, surface=SURFACE)
        await self._audit_event("web_sign_in", viewer_principal)
        cookie = set_cookie_header(session.id, secure=self._secure(request), max_age=self.sessions.lifetime,
                                   path=self._cookie_path(request))
        body = self._session_body(Viewer(session, viewer_principal, role))
        return _json(body, headers={"set-cookie": cookie})

    async def _identity_token_refusal(self, token: str) -> None:
        """With single sign-on, pasting a token can be off; an identity provider's access token is an
        agent's (an MCP client's), never a way in: refused and audited like an agent's gateway token."""
        if self.sign_on is not None and not self.sign_on.token_sign_in:
            raise Forbidden("signing in with a pasted token is turned off here; use single sign-on",
                            reason_code="token_sign_in_off")
        identity = self.gateway.identity
        if identity is None or token.startswith(TOKEN_PREFIX):
            return
        try:
            found = await identity.authenticate(token, surface=SURFACE)
        except IdentityRefusal as exc:
            await self._audit_event("web_sign_in_refused", Principal(name="-", role="-", surface=SURFACE),
                                    error_code="unauthorized", reason_code=f"idp_{exc.reason}")
            raise Unauthorized(f"that token is not valid ({exc.reason}); people sign in with single sign-on "
                               f"or {PERSON_TOKEN}") from None
        await self._audit_event("web_sign_in_refused", found.principal, error_code="forbidden",
                                reason_code="agent_identity", **found.audit_fields())
        raise Forbidden("this is an identity provider's access token for an agent (an MCP client), and only "
                        "people sign in to the approval page; use single sign-on",
                        reason_code="agent_identity")

    def _new_session(self, request: Request, principal: Principal) -> WebSession:
        self.sessions.end(self._session_id(request))  # a fresh id on every sign-in: no session fixation
        return self.sessions.create(principal)

    async def sign_out(self, request: Request) -> Response:
        try:
            self._check_origin(request)
            viewer = await anyio.to_thread.run_sync(self._viewer, request)
            self._check_csrf(request, viewer.session)
        except Unauthorized:
            return _json(await self._signed_out(), headers=self._clear_cookie(request))
        except GatewayError as exc:
            return self._error(request, exc)
        try:
            await anyio.to_thread.run_sync(self.sessions.end, viewer.session.id)
        except GatewayError as exc:
            return self._error(request, exc)
        await self._audit_event("web_sign_out", viewer.principal)
        return _json(await self._signed_out(), headers=self._clear_cookie(request))

    # ------------------------------------------------------------------ proposals

    def _proposal(self, p: Proposal, viewer: Viewer, now: float) -> dict[str, Any]:
        """One card. Whether the viewer may deny or approve is the decision's own verdict
        (``ProposalActions.decision_rights``), asked only for pending proposals; clicks are decided again."""
        rights = self.gateway.actions.decision_rights(p, viewer.principal) if p.state == "pending" else None
        return proposal_card(p, now, mine=proposed_by(p, viewer.principal), rights=rights)

    def _proposals(self, viewer: Viewer) -> list[dict[str, Any]]:
        store, now = self.gateway.store, self.gateway.clock()
        found = [*store.list_proposals(OPEN_STATES, limit=OPEN_LIMIT),
                 *store.list_proposals(sorted(FINAL_STATES), limit=RECENT_LIMIT)]
        party = self.gateway.facts.party(viewer.principal)
        return [self._proposal(p, viewer, now) for p in found if proposal_rights(party, Proposed.of(p)).see]

    async def proposals(self, _request: Request, viewer: Viewer) -> dict[str, Any]:
        # store reads and one decision per pending card: in a worker thread, never on the event loop
        return {"proposals": await anyio.to_thread.run_sync(self._proposals, viewer)}

    async def _reason(self, request: Request, viewer: Viewer, pid: str, action: str) -> str:
        """The decision's reason from the body; a malformed one is refused, and audited."""
        try:
            return await reason_from(request)
        except InvalidArgument as exc:
            await self._audit_event("web_refused", viewer.principal, proposal_id=pid, via=action,
                                    error_code=exc.code, error=exc.message)
            raise

    async def approve(self, request: Request, viewer: Viewer) -> Answer:
        pid = proposal_id(request)
        reason = await self._reason(request, viewer, pid, "approve")
        result = await self.gateway.actions.approve(pid, viewer.principal, reason=reason,
                                                    correlation_id=correlation_id_var.get())
        return Answer.composed({"result": result})  # the approval's answer as sent, fingerprinted

    async def deny(self, request: Request, viewer: Viewer) -> dict[str, Any]:
        pid = proposal_id(request)
        reason = await self._reason(request, viewer, pid, "deny")
        result = await self.gateway.actions.deny(pid, viewer.principal, reason=reason,
                                                 correlation_id=correlation_id_var.get())
        return {"result": result}

    # ------------------------------------------------------------------ reads

    async def targets(self, _request: Request, viewer: Viewer) -> dict[str, Any]:
        listing = await self.gateway.calls.call(viewer.principal, "list_targets", {},
                                                correlation_id=correlation_id_var.get())
        rows = listing.get("targets", [])
        names = [row["name"] for row in rows]  # the rules file is read once, off the loop
        limits = await anyio.to_thread.run_sync(self.gateway.policy.targets_limits, names)
        for row, settings in zip(rows, limits, strict=True):
            row["require_web_approval"] = settings.require_web_approval
        return listing

    async def inventory(self, request: Request, viewer: Viewer) -> Answer:
        kind = request.path_params["kind"]
        tool = INVENTORY_TOOLS.get(kind)
        if tool is None:
            raise NotFound(f"no inventory kind '{kind}'; use one of {', '.join(INVENTORY_TOOLS)}")
        results = await self.gateway.calls.answer(viewer.principal, tool, {"target": "all"},
                                                  correlation_id=correlation_id_var.get())
        # the answer's text as it is, joined in a worker thread (a big inventory is megabytes)
        return await anyio.to_thread.run_sync(Answer.composed, {"kind": kind, "targets": results})

    async def audit_tail(self, request: Request, viewer: Viewer) -> dict[str, Any]:
        """The newest audit rows the viewer's role may read (``guard.decision.may_read_audit_row``): its own
        calls for ``audit: own``, the rows of its targets for ``audit: all``, nothing for ``none``."""
        _audit_right(viewer)
        filters = {name: query_text(request, name) for name in AUDIT_FILTERS}
        last = query_count(request, "last", AUDIT_DEFAULT_ROWS, AUDIT_MAX_ROWS)
        name, own = viewer.principal.name, viewer.role.audit == "own"
        shown = {k: v for k, v in filters.items() if v}
        if own and filters["caller"] not in (None, name):
            return {"rows": [], "filters": shown, "last": last}
        scan = last if own or viewer.role.all_targets else last * AUDIT_SCAN_FACTOR
        reader = self.gateway.backends.reader
        read = functools.partial(reader.rows, last=scan,
                                 phase=filters["phase"], target=filters["target"], tool=filters["tool"],
                                 caller=name if own else filters["caller"])
        readable = _readable(viewer)
        rows = [r for r in await anyio.to_thread.run_sync(read) if readable(r)]
        return {"rows": rows[-last:], "filters": shown, "last": last}

    async def agents(self, request: Request, viewer: Viewer) -> dict[str, Any]:
        """Per caller, what the audit rows the viewer may read say of the chosen window (``window``: 1h,
        24h or 7d): the Audit tab's visibility (``_readable``) over the summary of ``audit.agents``,
        caught up with the rows appended since the last view (every replica's, on PostgreSQL)."""
        _audit_right(viewer)
        window = query_choice(request, "window", tuple(WINDOWS), AGENTS_WINDOW)
        return await anyio.to_thread.run_sync(self._agents, viewer, window)

    def _agents(self, viewer: Viewer, window: str) -> dict[str, Any]:
        now = time.time()  # the audit's own clock: rows are stamped by the wall clock
        self.callers.catch_up(self.gateway.backends.reader, now)
        callers = self.callers.view(window, now, _readable(viewer))
        party = self.gateway.facts.party(viewer.principal)
        open_proposals = [p for p in self.gateway.store.list_proposals(OPEN_STATES, limit=OPEN_LIMIT)
                          if proposal_rights(party, Proposed.of(p)).see]
        return agents_body(callers, open_proposals, window=window, now=now)

    async def audit_verify(self, _request: Request, viewer: Viewer) -> dict[str, Any]:
        _audit_right(viewer)
        reader = self.gateway.backends.reader
        report = await anyio.to_thread.run_sync(reader.verify)
        return verify_body(report)


def build_web_app(
    gateway: Gateway, *, secure_cookies: bool | None = None,
    allowed_origins: Sequence[str] | Callable[[str], bool] | None = None,
    sessions: SessionStore | None = None,
) -> Starlette:
    """The approval page as an ASGI app to mount at /ui (``gateway.server.edge.app.build_app(web=...)``).

    ``secure_cookies``: True always marks the cookie ``Secure`` with the ``__Host-`` prefix, False
    never, None (default) when the request arrived over HTTPS (as uvicorn sees it, so behind a proxy
    only with trusted forwarded headers). ``allowed_origins``: besides being the request's own origin,
    the ``Origin`` of a change must be in this list (or pass this predicate) when given.
    """
    api = WebApi(gateway, sessions or SessionStore(store=gateway.store), secure_cookies=secure_cookies,
                 origin_allowed=_origin_predicate(allowed_origins))
    app = Starlette(routes=api.routes(), middleware=[Middleware(SecurityHeaders)])
    app.state.sessions = api.sessions
    return app
