"""Verified claims -> a caller: its name, kind, role and scopes. Pure, table-tested.

An access token at /mcp is always an agent: its client's own, or acting for the person whose subject
it carries (who never approves what that agent proposes). Names are only shown; keys come from the
issuer and ``sub`` or client id, never from ``principal_claim``, so no claim reaches the ``token`` or
``system`` namespaces. No mapped role is ``TokenRefused("unmapped")`` (403), never a default role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.auth.tokens import CallerKey, Principal
from gateway.guard.decision import ACTING_FOR
from gateway.identity.config import IssuerConfig
from gateway.identity.verify import TokenRefused, jti_digest
from gateway.vocabulary import Category, Kind

#: the scope each tool category needs, when the issuer enforces scopes
SCOPES: Final[Mapping[Category, str]] = {
    Category.READ: "vsphere:read", Category.WRITE: "vsphere:write",
    Category.DESTRUCTIVE: "vsphere:destructive",
}
_NAME: Final = re.compile(r"[^\x00-\x1f\x7f]{1,128}")


@dataclass(frozen=True)
class Identity:
    """Who a verified token names, and what the audit keeps of it (never the token)."""

    principal: Principal
    issuer: str
    subject: str | None
    client_id: str | None
    jti_sha256: str | None

    def audit_fields(self) -> dict[str, Any]:
        return {"caller_key": str(self.principal.key), "issuer": self.issuer, "subject": self.subject,
                "client_id": self.client_id,
                "jti_sha256": self.jti_sha256, "acting_for": self.principal.acting_for,
                "scopes": sorted(self.principal.scopes) if self.principal.scopes is not None else None}


def _text(claims: Mapping[str, Any], name: str) -> str | None:
    value = claims.get(name)
    return value if isinstance(value, str) and value else None


def _values(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def scopes_of(claims: Mapping[str, Any]) -> frozenset[str]:
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    return frozenset(scp.split()) if isinstance(scp, str) else frozenset(_values(scp))


def role_of(claims: Mapping[str, Any], config: IssuerConfig) -> str:
    carried = set(_values(claims.get(config.roles_claim)))
    for value, role in config.roles:
        if value in carried:
            return role
    shown = ", ".join(sorted(carried)[:10]) or "none"
    raise TokenRefused("unmapped", "this identity maps to no role on this gateway: its "
                       f"{config.roles_claim!r} "
                       f"claim carries {shown}, and identity.yaml maps only "
                       f"{', '.join(v for v, _ in config.roles)}; ask an administrator to map one of your "
                       "groups to a role")


def _name(value: str | None, what: str) -> str:
    if value is None or not _NAME.fullmatch(value) or ACTING_FOR in value:
        raise TokenRefused("missing_claim", f"the token has no usable {what}")
    return value


def identity_of(claims: Mapping[str, Any], config: IssuerConfig, *, surface: str,
                person: bool = False) -> Identity:
    """The caller ``claims`` name (see the module docstring); ``TokenRefused`` when none is usable."""
    subject = _text(claims, "sub")
    client = _text(claims, "client_id") or _text(claims, "azp") or _text(claims, "appid")
    role = role_of(claims, config)
    scopes = scopes_of(claims) if config.enforce_scopes else None
    issuer = config.issuer
    if person:
        if subject is None or is_application(claims, subject, client, config.application_claims):
            raise TokenRefused("agent_identity", "this identity is an application, not a person (its ID "
                               "token says idtyp app, or its subject is its client id); only people sign in "
                               "to the approval page: sign in with your own account")
        name = _name(_text(claims, config.principal_claim), f"{config.principal_claim!r} claim")
        principal = Principal(name=name, role=role, surface=surface, kind=Kind.PERSON,
                              key=CallerKey.person(issuer, subject))
    elif subject is None or is_application(claims, subject, client, config.application_claims):
        name = _name(client or subject, "client id (client_id, azp or appid)")
        principal = Principal(name=name, role=role, surface=surface, kind=Kind.AGENT, scopes=scopes,
                              key=CallerKey.client(issuer, client or name))
    else:
        person_name = _name(_text(claims, config.principal_claim), f"{config.principal_claim!r} claim")
        client_name = _name(client, "client id (client_id, azp or appid)")
        principal = Principal(name=f"{person_name}{ACTING_FOR}{client_name}", role=role, surface=surface,
                              kind=Kind.AGENT, acting_for=person_name, scopes=scopes,
                              key=CallerKey.client(issuer, client_name, for_subject=subject),
                              acting_for_key=CallerKey.person(issuer, subject))
    return Identity(principal=principal, issuer=config.issuer, subject=subject, client_id=client,
                    jti_sha256=jti_digest(claims))


def is_application(claims: Mapping[str, Any], subject: str, client: str | None,
                   marks: tuple[tuple[str, str], ...] = ()) -> bool:
    """Whether claims that carry ``subject`` are an application's own, not a person's: ``idtyp: app``
    (Entra ID's app-only tokens), or a subject equal to the client id (``client_id``, ``azp``, ``appid``,
    or the audience an ID token names: a client-credentials token, RFC 9068, or a client's own login), or
    a claim carrying a value the issuer's ``application_claims`` names (its own app marker)."""
    if claims.get("idtyp") == "app" or any(value in _values(claims.get(claim)) for claim, value in marks):
        return True
    ids = {client, _text(claims, "azp"), _text(claims, "client_id"), _text(claims, "appid"),
           *_values(claims.get("aud"))} - {None}
    return subject in ids


def required_scope(category: Category) -> str:
    return SCOPES[category]
