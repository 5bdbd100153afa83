"""Who may read the gateway's operational views: /metrics, /audit/* and the detail of /readyz.

A caller needs its role's right (``metrics_refusal``: a role defined on this gateway for /metrics and
the readiness detail; ``guard.decision.audit_view`` for /audit/*, checked by ``audit_proofs``) *and*,
when its token is scope-limited (an identity provider's JWT from an issuer with ``enforce_scopes``,
the default), the scope ``AUDIT_SCOPE``: a JWT without it, an empty ``scope`` included, is refused 403
``insufficient_scope`` with the step-up challenge. A gateway token, or a JWT from an issuer with
``enforce_scopes: false``, carries no scopes (``Principal.scopes`` is None), and the role alone decides,
as for tools. Every refusal is audited (a ``refused`` row through ``audit_refusal`` when the gateway has
it, else counted into the refused-token rows).

/readyz needs no token, so ``ProbeCaller`` reads an ``Authorization`` header itself: a valid token
with the right gets the detail; no token, a refused one (counted and audited like any refused token) or
one without the right gets the status alone.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol, runtime_checkable

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.auth.tokens import TOKEN_PREFIX, Principal, caller_fields
from gateway.errors import Forbidden, GatewayError
from gateway.identity.service import AUDIT_SCOPE, IdentityRefusal, IdentityService
from gateway.role import Role
from gateway.server.edge.middleware import Authenticator, RefusalAudit, correlation_id_var, current_principal

log = logging.getLogger(__name__)

#: first-time token checks /readyz runs at once; beyond that a token is ignored (status only)
MAX_PROBE_CHECKS: Final = 4


class ScopeRefused(Forbidden):
    """A scope-limited token lacks ``AUDIT_SCOPE``: 403 with a ``WWW-Authenticate`` step-up challenge."""

    code = "insufficient_scope"

    def __init__(self, message: str, challenge: str | None) -> None:
        super().__init__(message, scope=AUDIT_SCOPE)
        self.challenge = challenge


class Roles(Protocol):
    """A caller's role as the store says now (``gateway.server.base.facts.FactsNow``)."""

    async def role_now(self, principal: Principal) -> Role | None: ...


class OperatorGateway(Protocol):
    """What these checks use of the gateway (``gateway.server.runtime.Gateway``)."""

    @property
    def facts(self) -> Roles: ...


@runtime_checkable
class RefusalWriter(Protocol):
    """A gateway that writes its own ``refused`` rows (``gateway.server.runtime.Gateway``)."""

    def audit_refusal(self, row: dict[str, Any]) -> None: ...


class Counts(Protocol):
    def auth_failure(self, reason: str) -> None: ...


def lacks_audit_scope(principal: Principal) -> bool:
    """Whether a scope-limited token lacks ``AUDIT_SCOPE`` (None scopes: not scope-limited). Pure."""
    return principal.scopes is not None and AUDIT_SCOPE not in principal.scopes


def metrics_refusal(role: Role | None, principal: Principal) -> str | None:
    """Why ``principal`` may not read /metrics or the readiness detail, or None when it may. Pure."""
    if role is None:
        return (f"role '{principal.role}' is not defined on this gateway; ask an administrator to fix "
                "roles.yaml or give the token another role")
    if lacks_audit_scope(principal):
        return (f"reading the gateway's metrics and audit needs the scope {AUDIT_SCOPE}, which this token "
                "lacks; get a token with that scope (your role still decides what it allows)")
    return None


def scope_refused(identity: IdentityService | None, what: str) -> ScopeRefused:
    """The 403 for a token without ``AUDIT_SCOPE`` reading ``what``."""
    if identity is None:
        return ScopeRefused(f"{what} needs the scope {AUDIT_SCOPE}, which this token lacks", None)
    refusal = identity.scope_refusal(AUDIT_SCOPE, what, kind="path")
    return ScopeRefused(refusal.message, refusal.challenge)


async def audit_refused(gateway: object, refusals: RefusalAudit | None, principal: Principal, path: str,
                        client: str, error: GatewayError) -> None:
    """One ``refused`` row for a refused operational read (off the event loop), or, for a gateway without
    its own refusal rows, one count in the refused-token rows."""
    if isinstance(gateway, RefusalWriter):
        row = {"phase": "refused", "tool": "operator_read", "caller": principal.name,
               "role": principal.role, "surface": principal.surface,
               "correlation_id": correlation_id_var.get(), "path": path, "error_code": error.code,
               "reason": str(error), **caller_fields(principal)}
        await anyio.to_thread.run_sync(gateway.audit_refusal, row)
    elif refusals is not None:
        refusals.record(client, error.code)


async def metrics_denied(gateway: OperatorGateway, request: Request, identity: IdentityService | None,
                         refusals: RefusalAudit | None) -> JSONResponse | None:
    """The audited 401/403 for a caller who may not read /metrics, or None when it may."""
    principal = current_principal()
    if principal is None:  # the edge lets no request here without a token: fail closed anyway
        return JSONResponse({"error": {"code": "unauthorized", "message": "a bearer token is required"}},
                            status_code=401)
    why = metrics_refusal(await gateway.facts.role_now(principal), principal)
    if why is None:
        return None
    path = request.url.path
    error = scope_refused(identity, path) if lacks_audit_scope(principal) else Forbidden(why)
    await audit_refused(gateway, refusals, principal, path, request.client.host if request.client else "",
                        error)
    challenge = error.challenge if isinstance(error, ScopeRefused) else None
    return JSONResponse({"error": error.to_wire()}, status_code=403,
                        headers={"WWW-Authenticate": challenge} if challenge else None)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class ProbeCaller:
    """The optional caller of an open path (/readyz): who presented a valid token, or None."""

    def __init__(self, authenticator: Authenticator, identity: IdentityService | None,
                 refusals: RefusalAudit | None, metrics: Counts, *, surface: str) -> None:
        self.authenticator, self.identity, self.refusals = authenticator, identity, refusals
        self.metrics, self.surface = metrics, surface
        self._checking = 0

    def _refused(self, client: str, reason: str, token_id: str | None = None) -> None:
        self.metrics.auth_failure(reason)
        if self.refusals is not None:
            self.refusals.record(client, reason, token_id)

    async def __call__(self, request: Request) -> Principal | None:
        token = _bearer(request)
        if token is None:
            return None
        client = request.client.host if request.client else ""
        if not token.startswith(TOKEN_PREFIX) and self.identity is not None:
            if self._checking >= MAX_PROBE_CHECKS:
                return None
            self._checking += 1
            try:
                return (await self.identity.authenticate(token, surface=self.surface)).principal
            except IdentityRefusal as refusal:
                self._refused(client, f"idp_{refusal.reason}")
                return None
            finally:
                self._checking -= 1
        if not self.authenticator.proven(token) and self._checking >= MAX_PROBE_CHECKS:
            return None
        self._checking += 1
        try:
            verdict = await self.authenticator.authenticate(token, client)
        except GatewayError:  # the token store cannot be read: no detail (the status says not ready)
            return None
        finally:
            self._checking -= 1
        if verdict.principal is None:
            self._refused(client, verdict.reason, verdict.token_id)
            return None
        return verdict.principal


async def detail_allowed(gateway: OperatorGateway, principal: Principal | None) -> bool:
    """Whether the readiness detail is shown to ``principal`` (the /metrics right)."""
    if principal is None:
        return False
    try:
        role = await gateway.facts.role_now(principal)
    except Exception:  # a gateway that cannot say: no detail
        log.exception("the role of a readiness caller could not be read")
        return False
    return metrics_refusal(role, principal) is None
