"""A ``CallerKey`` back from its stored text (web sessions keep the signed-in person's key as text), and
what audit rows carry of a caller (``caller_fields``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from gateway.auth.principal import SPACES, CallerKey, Principal

__all__ = ["caller_fields", "parse_key"]


def parse_key(text: str | None) -> CallerKey | None:
    """The ``CallerKey`` whose ``str()`` is ``text``; None for None or a text no key has."""
    if not text:
        return None
    parts = [unquote(p) for p in text.split(":")]
    if len(parts) not in (3, 4) or parts[0] not in SPACES:
        return None
    space, issuer, value = parts[0], parts[1] or None, parts[2]
    try:
        key = CallerKey(space, value, issuer, parts[3] if len(parts) == 4 else None)
    except ValueError:
        return None
    return key if str(key) == text else None


def caller_fields(principal: Principal) -> dict[str, Any]:
    """Who a row is about: the display name beside the stable key (``caller_key``), and the issuer and
    subject when an identity provider's key has them (two callers showing one name stay two)."""
    key = principal.key
    fields: dict[str, Any] = {"caller": principal.name, "caller_key": str(key)}
    if key.issuer is not None:
        fields["issuer"] = key.issuer
        subject = key.value if key.space == "person" else key.subject
        if subject is not None:
            fields["subject"] = subject
    return fields
