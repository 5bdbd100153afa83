"""The audit log's Merkle tree over HTTPS: the checkpoint and its proofs, for roles that read the audit.

    GET /audit/checkpoint                                 the newest signed checkpoint note (C2SP)
    GET /audit/proof/inclusion?seq=S[&tree_size=N]        row S's audit path, leaf to root
    GET /audit/proof/consistency?old_size=M[&new_size=N]  the tree of M rows inside the tree of N

Proofs reveal hashes, never a row's content, so ``audit: own`` may fetch them for any row. A
scope-limited token also needs ``vsphere:audit``; every refusal is a typed 403 and an audit row."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.audit.proofs import TreeReader, consistency_proof, inclusion_proof, latest_note
from gateway.auth.tokens import Principal, caller_fields
from gateway.errors import Forbidden, GatewayError, InvalidArgument, Unauthorized
from gateway.guard.decision import audit_view
from gateway.identity.service import IdentityService
from gateway.role import Role
from gateway.server.edge.middleware import correlation_id_var, current_principal
from gateway.server.edge.operator_access import Roles, ScopeRefused, lacks_audit_scope, scope_refused

log = logging.getLogger(__name__)

_STATUS = {"not_found": 404, "invalid_argument": 400, "forbidden": 403, "unauthorized": 401,
           "audit_unavailable": 503}


@runtime_checkable
class ProofGateway(Protocol):
    """What the endpoints use of the gateway (``gateway.server.runtime.Gateway``)."""

    @property
    def facts(self) -> Roles: ...

    def audit_reader(self) -> TreeReader: ...

    def audit_refusal(self, row: dict[str, Any]) -> None: ...


def _number(request: Request, name: str, *, required: bool) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if required:
            raise InvalidArgument(name, f"give ?{name}=<a whole number>")
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidArgument(name, f"{raw[:20]!r} is not a whole number")
    return int(raw)


def _error_response(exc: GatewayError) -> JSONResponse:
    if isinstance(exc, ScopeRefused):
        headers = {"WWW-Authenticate": exc.challenge} if exc.challenge else None
        return JSONResponse({"error": exc.to_wire()}, status_code=403, headers=headers)
    return JSONResponse({"error": exc.to_wire()}, status_code=_STATUS.get(exc.code, 400))


def _refusal(role: Role | None, principal: Principal, identity: IdentityService | None,
             path: str) -> GatewayError | None:
    """Why ``principal`` may not read ``path``: its role's right, then its token's scope; None if it may."""
    verdict = audit_view(role) if role is not None else None
    if verdict is None or not verdict.allowed:
        return Forbidden(verdict.reason if verdict is not None else f"role '{principal.role}' is not defined")
    if lacks_audit_scope(principal):
        return scope_refused(identity, path)
    return None


def audit_proof_routes(gateway: ProofGateway) -> list[BaseRoute]:
    identity: IdentityService | None = getattr(gateway, "identity", None)

    async def allowed(request: Request) -> None:
        principal = current_principal()
        if principal is None:
            raise Unauthorized("a bearer token is required")
        refusal = _refusal(await gateway.facts.role_now(principal), principal, identity, request.url.path)
        if refusal is not None:
            row = {"phase": "refused", "tool": "audit_proof", "caller": principal.name,
                   "role": principal.role, "surface": principal.surface,
                   "correlation_id": correlation_id_var.get(), "path": request.url.path,
                   "error_code": refusal.code, "reason": refusal.message, **caller_fields(principal)}
            await anyio.to_thread.run_sync(gateway.audit_refusal, row)  # a durable write: off the loop
            raise refusal

    def endpoint(produce: Callable[[Request, TreeReader], Any]) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                await allowed(request)
                body = await anyio.to_thread.run_sync(lambda: produce(request, gateway.audit_reader()))
            except GatewayError as exc:
                return _error_response(exc)
            except Exception:
                log.exception("the audit proof endpoint failed on %s", request.url.path)
                return JSONResponse({"error": {"code": "internal", "message": "the gateway failed on this "
                                               "request; see its log"}}, status_code=500)
            if isinstance(body, str):
                return Response(body, media_type="text/plain; charset=utf-8")
            return JSONResponse(body)

        return handle

    def checkpoint(_request: Request, reader: TreeReader) -> str:
        return latest_note(reader)

    def inclusion(request: Request, reader: TreeReader) -> dict[str, Any]:
        seq = _number(request, "seq", required=True)
        assert seq is not None
        return inclusion_proof(reader, seq, _number(request, "tree_size", required=False))

    def consistency(request: Request, reader: TreeReader) -> dict[str, Any]:
        old = _number(request, "old_size", required=True)
        assert old is not None
        return consistency_proof(reader, old, _number(request, "new_size", required=False))

    return [
        Route("/audit/checkpoint", endpoint(checkpoint), methods=["GET"]),
        Route("/audit/proof/inclusion", endpoint(inclusion), methods=["GET"]),
        Route("/audit/proof/consistency", endpoint(consistency), methods=["GET"]),
    ]

