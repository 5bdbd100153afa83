"""The OAuth 2.1 resource server: identity provider tokens -> principals, and what the edge tells clients.

A refusal carries its HTTP status, a stable reason and the ``WWW-Authenticate`` challenge. The token
itself is never logged, stored or passed on; the first sight of a ``jti`` is one ``identity_verified``
audit row (its sha256, not the token).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import anyio.to_thread

from gateway.identity.config import IdentityConfig, IssuerConfig, load_identity
from gateway.identity.keys import IssuerKeys, IssuerUnavailable, UnknownKey
from gateway.identity.mapping import SCOPES, Identity, identity_of
from gateway.identity.verify import TokenRefused, unverified_issuer, verify_jwt
from gateway.vocabulary import Category

log = logging.getLogger(__name__)

PRM_PATH: Final = "/.well-known/oauth-protected-resource"
#: the scope asked for on a plain 401: the least that lets a client list and read
FIRST_SCOPE: Final = SCOPES[Category.READ]
#: the scope a scope-limited token needs to read /metrics, the readiness detail and /audit/*
AUDIT_SCOPE: Final = "vsphere:audit"
_SEEN_LIMIT: Final = 10_000
#: the edge's refusal reasons for identity provider tokens (metrics labels; ``idp_`` + ``TokenRefused``
#: reason, or unmapped, insufficient_scope, issuer_unavailable)
IDP_REFUSALS: Final = frozenset(f"idp_{r}" for r in (
    "malformed", "algorithm", "wrong_issuer", "wrong_audience", "expired", "not_yet_valid", "missing_claim",
    "bad_signature", "invalid", "unknown_key", "unmapped", "agent_identity", "issuer_unavailable",
    "insufficient_scope"))


@dataclass
class IdentityRefusal(Exception):
    status: int
    reason: str
    message: str
    challenge: str | None = None
    retry_after: float | None = None

    def __str__(self) -> str:
        return self.message


def _quoted(value: str) -> str:
    """``value`` as RFC 6750 allows an ``error_description`` (printable ASCII without ``"`` or ``\\``):
    anything else, such as text a token made up, becomes ``?`` (a header must stay latin-1)."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in value)


class IdentityService:
    """Trusted issuers and their keys (see the module docstring)."""

    def __init__(self, config: IdentityConfig, *, audit: Callable[[Mapping[str, Any]], None] | None = None,
                 fetch_seconds: float = 5.0, refetch_seconds: float = 30.0) -> None:
        self.config = config
        self.audit = audit
        self.keys = {i.issuer: IssuerKeys(i, fetch_seconds=fetch_seconds, refetch_seconds=refetch_seconds)
                     for i in config.issuers}
        self._seen: OrderedDict[str, None] = OrderedDict()

    # -- what clients are told -----------------------------------------------------------------

    @property
    def metadata_url(self) -> str:
        """Where this resource's metadata is (RFC 9728 section 3.1: the well-known path, then the
        resource's own path)."""
        parts = urlsplit(self.config.resource)
        return f"{parts.scheme}://{parts.netloc}{PRM_PATH}{parts.path.rstrip('/')}"

    def metadata(self) -> dict[str, Any]:
        return {
            "resource": self.config.resource,
            "authorization_servers": [i.issuer for i in self.config.issuers],
            "scopes_supported": [*SCOPES.values(), AUDIT_SCOPE],
            "bearer_methods_supported": ["header"],
            "resource_name": "vSphere MCP Gateway",
        }

    def challenge(self, *, error: str | None = None, scope: str = FIRST_SCOPE,
                  description: str | None = None) -> str:
        parts = [f'resource_metadata="{self.metadata_url}"', f'scope="{scope}"']
        if error is not None:
            parts.insert(0, f'error="{error}"')
        if description:
            parts.append(f'error_description="{_quoted(description[:300])}"')
        return "Bearer " + ", ".join(parts)

    def scope_refusal(self, needed: str, tool: str, *, kind: str = "tool") -> IdentityRefusal:
        """The 403 for a token without ``needed``: calling the tool ``tool``, or (``kind="path"``)
        reading the path ``tool``."""
        what = f"the tool {tool!r}" if kind == "tool" else f"reading {tool}"
        message = (f"{what} needs the scope {needed}, which this token lacks; get a token with "
                   f"that scope (your role still decides what it allows)")
        return IdentityRefusal(403, "insufficient_scope", message,
                               self.challenge(error="insufficient_scope", scope=needed))

    # -- verification --------------------------------------------------------------------------

    def _refusal(self, exc: TokenRefused) -> IdentityRefusal:
        if exc.reason in ("unmapped", "agent_identity"):
            return IdentityRefusal(403, exc.reason, str(exc))
        return IdentityRefusal(401, exc.reason, str(exc),
                               self.challenge(error="invalid_token", description=str(exc)))

    async def verified(self, token: str, *, audience: str | None = None,
                       issuer: IssuerConfig | None = None) -> tuple[IssuerConfig, dict[str, Any]]:
        """The issuer and verified claims of ``token`` (``audience``: default the issuer's)."""
        try:
            if issuer is None:
                named = unverified_issuer(token)
                issuer = self.config.issuer(named)
                if issuer is None:
                    raise TokenRefused("wrong_issuer", f"tokens from {named[:200]!r} are not trusted here; "
                                       f"trusted issuers: {', '.join(i.issuer for i in self.config.issuers)}")
            keys = self.keys[issuer.issuer]

            async def key_for(kid: str) -> Any:
                return await keys.key(kid)

            claims = await verify_jwt(token, issuer=issuer.issuer, audience=audience or issuer.audience,
                                      key_for=key_for)
            return issuer, claims
        except TokenRefused as exc:
            raise self._refusal(exc) from None
        except UnknownKey:
            raise self._refusal(TokenRefused("unknown_key", "the token is signed with a key its issuer does "
                                             "not publish")) from None
        except IssuerUnavailable as exc:
            raise IdentityRefusal(503, "issuer_unavailable", str(exc), retry_after=5.0) from None
        except Exception as exc:  # verification only ever refuses: never a 500
            raise self._unexpected(exc, "verifying") from None

    def _unexpected(self, exc: Exception, doing: str) -> IdentityRefusal:
        """A 401 ``malformed`` for what a crafted token made fail unexpectedly (logged by type only:
        the token and its contents stay out of the log)."""
        log.warning("refused a token that failed while %s it (%s); report this if the token was genuine",
                    doing, type(exc).__name__)
        return self._refusal(TokenRefused("malformed", f"the token cannot be verified "
                                          f"({type(exc).__name__})"))

    async def authenticate(self, token: str, *, surface: str) -> Identity:
        """An MCP caller (always an agent, possibly acting for a person); ``IdentityRefusal`` otherwise."""
        issuer, claims = await self.verified(token)
        try:
            identity = identity_of(claims, issuer, surface=surface)
        except TokenRefused as exc:
            raise self._refusal(exc) from None
        except Exception as exc:  # claims no mapping expected: refused, never a 500
            raise self._unexpected(exc, "mapping") from None
        await self.record(identity)
        return identity

    def person(self, claims: Mapping[str, Any], issuer: IssuerConfig, *, surface: str) -> Identity:
        """The person an ID token names (the page's sign-in)."""
        try:
            return identity_of(claims, issuer, surface=surface, person=True)
        except TokenRefused as exc:
            raise self._refusal(exc) from None
        except Exception as exc:  # claims no mapping expected: refused, never a 500
            raise self._unexpected(exc, "mapping") from None

    async def record(self, identity: Identity) -> None:
        """One ``identity_verified`` row per token (by jti digest) this process sees."""
        key = identity.jti_sha256 or f"{identity.issuer} {identity.subject} {identity.client_id}"
        if key in self._seen or self.audit is None:
            return
        self._seen[key] = None
        while len(self._seen) > _SEEN_LIMIT:
            self._seen.popitem(last=False)
        p = identity.principal
        row = {"phase": "identity_verified", "caller": p.name, "kind": p.kind.value, "role": p.role,
               "surface": p.surface, **identity.audit_fields()}
        await anyio.to_thread.run_sync(self.audit, row)

    def close(self) -> None:
        for keys in self.keys.values():
            keys.close()


def open_identity(path: Path | None, audit: Callable[[Mapping[str, Any]], None]) -> IdentityService | None:
    """The service for identity.yaml at ``path``; None when there is no such file (gateway tokens only).
    A broken file is a ``ConfigProblems`` (the gateway does not start on it: fail closed)."""
    config = load_identity(path) if path is not None else None
    return None if config is None else IdentityService(config, audit=audit)
