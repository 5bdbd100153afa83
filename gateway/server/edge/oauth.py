"""The edge's side of identity-provider tokens, used only when identity.yaml exists.

``OAuthGate.check`` verifies a bearer token that is not a ``gwt_`` token and, for a POST to /mcp, finds
each ``tools/call``: a tool whose category needs a scope the token lacks is refused with 403 and an
``insufficient_scope`` challenge, so the client can step up. Scopes only narrow; the role decides after."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import anyio.to_thread
from starlette.types import Message, Receive, Scope

from gateway.auth.tokens import Principal
from gateway.identity.mapping import SCOPES
from gateway.identity.service import IdentityRefusal, IdentityService
from gateway.vocabulary import Category

#: bodies larger than this are parsed in a worker thread
INLINE_PARSE_BYTES: Final = 64 << 10


async def _body(receive: Receive) -> tuple[bytes, list[Message]]:
    messages: list[Message] = []
    body = bytearray()
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return bytes(body), messages


def tools_called(body: bytes) -> list[str]:
    """The tool names of the ``tools/call`` requests in a JSON-RPC body (one message or a list)."""
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    messages = doc if isinstance(doc, list) else [doc]
    names = []
    for m in messages:
        if isinstance(m, dict) and m.get("method") == "tools/call" and isinstance(m.get("params"), dict):
            name = m["params"].get("name")
            if isinstance(name, str):
                names.append(name)
    return names


class OAuthGate:
    def __init__(self, service: IdentityService, categories: Mapping[str, Category], *, surface: str) -> None:
        self.service, self.categories, self.surface = service, categories, surface

    def missing_challenge(self) -> str:
        return self.service.challenge()

    def invalid_challenge(self) -> str:
        return self.service.challenge(error="invalid_token")

    async def check(self, scope: Scope, receive: Receive, token: str) -> tuple[Principal, Receive]:
        """The caller, and a ``receive`` that replays the body; ``IdentityRefusal`` otherwise."""
        identity = await self.service.authenticate(token, surface=self.surface)
        principal = identity.principal
        if principal.scopes is None or scope["method"] != "POST":
            return principal, receive
        body, messages = await _body(receive)
        names = (await anyio.to_thread.run_sync(tools_called, body) if len(body) > INLINE_PARSE_BYTES
                 else tools_called(body))
        for name in names:
            category = self.categories.get(name)
            needed = SCOPES.get(category) if category is not None else None
            if needed is not None and needed not in principal.scopes:
                raise self.service.scope_refusal(needed, name)

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        return principal, replay


def refusal_code(refusal: IdentityRefusal) -> str:
    return {401: "unauthorized", 403: "forbidden"}.get(refusal.status, "identity_provider_unavailable")


def claims_of(principal: Principal) -> dict[str, Any]:
    """What the SDK's access token carries of an identity provider's caller (``edge.principal_of``)."""
    return {"gateway_idp": True, "gateway_kind": principal.kind.value,
            "gateway_acting_for": principal.acting_for, "gateway_key": str(principal.key),
            "gateway_acting_for_key": str(principal.acting_for_key) if principal.acting_for_key else None,
            "gateway_scopes": sorted(principal.scopes) if principal.scopes is not None else None}
