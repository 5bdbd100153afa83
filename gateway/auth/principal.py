"""Who is calling: ``Principal`` (what is shown and what is decided) and ``CallerKey``, its stable key.

Every per-caller decision compares ``Principal.key``, never ``name`` (names repeat and change). Keys
live in four namespaces no claim can cross: ``token`` (by token id), ``person`` (issuer, ``sub``),
``client`` (issuer, client id, and the person's ``sub`` when acting for one) and ``system``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import quote, unquote

from gateway.store.base import TokenRecord
from gateway.vocabulary import Kind

__all__ = ["SPACES", "CallerKey", "Principal", "caller_fields", "parse_key"]

Space = Literal["token", "person", "client", "system"]
SPACES: Final[tuple[Space, ...]] = ("token", "person", "client", "system")


@dataclass(frozen=True, slots=True)
class CallerKey:
    """The stable identity of a caller; ``str()`` is its one text form (stored, audited, compared)."""

    space: Space
    value: str
    issuer: str | None = None
    #: for a ``client`` acting for a person: that person's ``sub``
    subject: str | None = None

    def __post_init__(self) -> None:
        if self.space not in SPACES:
            raise ValueError(f"unknown caller key space {self.space!r}")
        if not self.value:
            raise ValueError("a caller key needs a value")
        if (self.issuer is None) != (self.space in ("token", "system")):
            raise ValueError(f"a {self.space} key {'needs' if self.issuer is None else 'takes no'} issuer")

    @classmethod
    def token(cls, token_id: str) -> CallerKey:
        return cls("token", token_id)

    @classmethod
    def person(cls, issuer: str, subject: str) -> CallerKey:
        return cls("person", subject, issuer)

    @classmethod
    def client(cls, issuer: str, client_id: str, *, for_subject: str | None = None) -> CallerKey:
        return cls("client", client_id, issuer, for_subject)

    @classmethod
    def system(cls, name: str) -> CallerKey:
        return cls("system", name)

    def __str__(self) -> str:
        parts = [self.space, self.issuer or "", self.value]
        if self.subject is not None:
            parts.append(self.subject)
        return ":".join(quote(part, safe="") for part in parts)


@dataclass(frozen=True)
class Principal:
    """Who is calling: ``name`` to show (the caller in audit rows and messages), ``key`` to decide with,
    its role, surface, and whether a person or an agent (``kind``; for a token, the store's record at
    each request is what decisions use, see ``FactsNow.party``).

    ``key`` defaults from the token id when there is one, else to the ``system`` namespace (the gateway's
    own callers); a principal from an identity provider always carries its ``person``/``client`` key.
    ``acting_for``/``acting_for_key``: the person whose subject an agent's token carries (that person never
    approves what the agent proposes); ``scopes`` narrow what the role allows (None: not scope-limited).
    ``as_read``: the token's record as the edge read it for this request (``read_at``, monotonic), so the
    call's first look at its caller needs no second read of the store (``FactsNow.party_known``)."""

    name: str
    role: str
    token_id: str | None = None
    surface: str = "https"
    kind: Kind = Kind.AGENT
    acting_for: str | None = None
    scopes: frozenset[str] | None = None
    key: CallerKey = field(default=None)  # type: ignore[assignment]  # filled by __post_init__
    acting_for_key: CallerKey | None = None
    as_read: TokenRecord | None = field(default=None, compare=False, repr=False)
    read_at: float = field(default=0.0, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.key is None:
            key = CallerKey.token(self.token_id) if self.token_id else CallerKey.system(self.name)
            object.__setattr__(self, "key", key)

    @property
    def person_key(self) -> CallerKey | None:
        """The person behind this caller: itself when a person, the person it acts for, or None."""
        return self.key if self.kind is Kind.PERSON else self.acting_for_key


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
