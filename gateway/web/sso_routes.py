"""The approval page's single sign-on routes (``gateway.identity.sso``), mounted at /ui with ``web_sign_in``.

An SSO session keeps the role mapped at sign-in for its lifetime; signing in again picks up new groups.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.auth.principal import parse_key
from gateway.auth.tokens import Principal
from gateway.errors import ConfigError
from gateway.identity.service import IdentityRefusal, IdentityService
from gateway.identity.sso import DEFAULT_TTL, SignOn
from gateway.vocabulary import Kind
from gateway.web.session import SessionStore, WebSession, cookie_name, set_cookie_header

log = logging.getLogger(__name__)

#: the token id field of an SSO session starts with this (a gateway token id never holds a colon)
SSO_SESSION: Final = "idp:"
BINDING_COOKIE: Final = "gw_sso"

Audit = Callable[..., Awaitable[None]]


def sign_on_for(identity: IdentityService | None, environ: dict[str, str] | Any) -> SignOn | None:
    """The page's OpenID Connect client, None without ``web_sign_in``; ConfigError without its secret."""
    web = identity.config.web_sign_in if identity is not None else None
    if identity is None or web is None:
        return None
    secret = environ.get(web.client_secret_env)
    if not secret:
        raise ConfigError(
            f"identity.yaml's web_sign_in needs the client secret in {web.client_secret_env}; "
            "set it in the gateway's environment"
        )
    return SignOn(identity, web, secret)


def sso_principal(session: WebSession, surface: str) -> Principal | None:
    """The person of an SSO session, None for a token's session."""
    if not session.token_id.startswith(SSO_SESSION):
        return None
    key = parse_key(session.caller_key)
    if key is None or key.space != "person":  # a session kept before keys were: nobody (sign in again)
        return None
    return Principal(
        session.name, session.token_id[len(SSO_SESSION) :], None, surface=surface, kind=Kind.PERSON, key=key
    )


class SsoRoutes:
    def __init__(
        self,
        sign_on: SignOn,
        sessions: SessionStore,
        *,
        secure: Callable[[Request], bool],
        cookie_path: Callable[[Request], str],
        audit: Audit,
        role_known: Callable[[Principal], Awaitable[bool]],
    ) -> None:
        self.sign_on, self.sessions, self.secure, self.cookie_path = sign_on, sessions, secure, cookie_path
        self.audit, self.role_known = audit, role_known

    def routes(self) -> list[Route]:
        return [
            Route("/sso/start", self.start, methods=["GET"]),
            Route("/sso/callback", self.callback, methods=["GET"]),
        ]

    def _binding_name(self, request: Request) -> str:
        return f"__Host-{BINDING_COOKIE}" if self.secure(request) else BINDING_COOKIE

    def _redirect_uri(self, request: Request) -> str:
        root = str(request.scope.get("root_path") or "")
        return f"{request.url.scheme}://{request.headers.get('host', '')}{root}/sso/callback"

    async def start(self, request: Request) -> Response:
        try:
            url, binding = await self.sign_on.begin(self._redirect_uri(request))
        except IdentityRefusal as exc:
            return JSONResponse(
                {"error": {"code": "identity_provider_unavailable", "message": str(exc)}},
                status_code=exc.status,
            )
        response = RedirectResponse(url, status_code=302)
        secure = self.secure(request)
        attributes = [
            f"{self._binding_name(request)}={binding}",
            f"Max-Age={int(DEFAULT_TTL)}",
            "HttpOnly",
            "SameSite=Lax",
            f"Path={'/' if secure else self.cookie_path(request)}",
        ]
        if secure:
            attributes.append("Secure")
        response.headers.append("set-cookie", "; ".join(attributes))
        return response

    async def callback(self, request: Request) -> Response:
        binding = request.cookies.get(self._binding_name(request))
        params = request.query_params
        try:
            if params.get("error"):
                raise IdentityRefusal(
                    401,
                    "sso_failed",
                    f"the identity provider did not sign you in ({params.get('error', '')[:80]}); try again",
                )
            identity = await self.sign_on.finish(binding, params.get("state"), params.get("code"))
            person = identity.principal
            if not await self.role_known(person):
                raise IdentityRefusal(
                    403,
                    "unmapped",
                    f"your group maps to the role '{person.role}', which is "
                    "not defined on this gateway; ask an administrator to fix roles.yaml",
                )
        except IdentityRefusal as exc:
            await self.audit(
                "web_sign_in_refused",
                Principal("-", "-", surface="web", kind=Kind.PERSON),
                error_code="forbidden" if exc.status == 403 else "unauthorized",
                reason_code=exc.reason,
            )
            code = {401: "unauthorized", 403: "forbidden"}.get(exc.status, "identity_provider_unavailable")
            return JSONResponse(
                {"error": {"code": code, "message": str(exc), "reason_code": exc.reason}},
                status_code=exc.status,
            )
        holder = Principal(
            person.name, person.role, f"{SSO_SESSION}{person.role}", surface="web", kind=Kind.PERSON,
            key=person.key,
        )

        def new_session() -> WebSession:
            self.sessions.end(request.cookies.get(cookie_name(self.secure(request))))
            return self.sessions.create(holder)

        session = await anyio.to_thread.run_sync(new_session)
        await self.audit("web_sign_in", person, via="sso", **identity.audit_fields())
        response = RedirectResponse(f"{request.scope.get('root_path') or ''}/", status_code=302)
        response.headers.append(
            "set-cookie",
            set_cookie_header(
                session.id,
                secure=self.secure(request),
                max_age=self.sessions.lifetime,
                path=self.cookie_path(request),
            ),
        )
        response.headers.append(
            "set-cookie",
            f"{self._binding_name(request)}=; Max-Age=0; HttpOnly; "
            f"SameSite=Lax; Path={'/' if self.secure(request) else self.cookie_path(request)}"
            + ("; Secure" if self.secure(request) else ""),
        )
        return response
