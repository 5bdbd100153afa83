"""JWT checks for access tokens and ID tokens (PyJWT does the JOSE work). Pure apart from the key lookup.

A token is refused (``TokenRefused`` with a stable ``reason``) unless: its header names an algorithm of
``ALGORITHMS`` (asymmetric only: never ``none``, never an HMAC, so a public key can never serve as an
HMAC secret) that fits the key its ``kid`` names; its signature verifies with that key; ``iss`` is the
configured issuer exactly; ``aud`` contains the expected audience (the gateway's resource identifier
for access tokens, RFC 8707; the page's client id for ID tokens); ``exp`` is in the future and
``nbf``/``iat`` not in the future, each with ``SKEW_SECONDS`` of leeway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import jwt
from jwt import PyJWK
from jwt.exceptions import (
    DecodeError,
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAudienceError,
    InvalidIssuedAtError,
    InvalidIssuerError,
    InvalidSignatureError,
    InvalidTokenError,
    MissingRequiredClaimError,
)

ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
SKEW_SECONDS: Final = 30
MAX_TOKEN_CHARS: Final = 16 * 1024


class TokenRefused(Exception):
    """Why a token is not accepted: ``reason`` is a stable code, the message says it for a person."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and len(token) <= MAX_TOKEN_CHARS


def unverified_issuer(token: str) -> str:
    """The ``iss`` a token claims (only to pick the issuer whose keys then verify it)."""
    if not looks_like_jwt(token):
        raise TokenRefused("malformed", "the bearer token is neither a gateway token nor a JWT")
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except InvalidTokenError:
        raise TokenRefused("malformed", "the bearer token is not a readable JWT") from None
    iss = claims.get("iss")
    if not isinstance(iss, str):
        raise TokenRefused("wrong_issuer", "the token names no issuer (iss)")
    return iss


def jti_digest(claims: Mapping[str, Any]) -> str | None:
    """What audit rows keep of a token's ``jti``: its sha256, never the value."""
    jti = claims.get("jti")
    return hashlib.sha256(str(jti).encode()).hexdigest() if jti is not None else None


async def verify_jwt(token: str, *, issuer: str, audience: str,
                     key_for: Callable[[str], Awaitable[PyJWK]]) -> dict[str, Any]:
    """The verified claims of ``token`` (see the module docstring); ``TokenRefused`` otherwise.
    ``key_for(kid)`` finds the signing key (its own errors pass through)."""
    try:
        header = jwt.get_unverified_header(token)
    except DecodeError:
        raise TokenRefused("malformed", "the bearer token is not a readable JWT") from None
    alg = header.get("alg")
    if alg not in ALGORITHMS:
        raise TokenRefused("algorithm", f"tokens signed with {str(alg)[:20]!r} are refused; the gateway "
                           f"accepts {', '.join(ALGORITHMS)}")
    key = await key_for(str(header.get("kid", "")))
    declared = getattr(key, "_jwk_data", {}).get("alg")
    if declared is not None and declared != alg:
        raise TokenRefused("algorithm", f"the token says {alg} but its key is for {declared}")
    try:
        return jwt.decode(token, key.key, algorithms=[alg], audience=audience, issuer=issuer,
                          leeway=SKEW_SECONDS, options={"require": ["exp", "iss", "aud"]})
    except ExpiredSignatureError:
        raise TokenRefused("expired", "the token has expired; get a new one from the identity "
                           "provider") from None
    except (ImmatureSignatureError, InvalidIssuedAtError):
        raise TokenRefused("not_yet_valid", "the token is not valid yet (nbf or iat in the future; check "
                           "the clocks)") from None
    except InvalidAudienceError:
        raise TokenRefused("wrong_audience", f"the token is not meant for this gateway (its aud must be "
                           f"{audience})") from None
    except InvalidIssuerError:
        raise TokenRefused("wrong_issuer", f"the token's issuer is not {issuer}") from None
    except MissingRequiredClaimError as exc:
        raise TokenRefused("missing_claim", f"the token lacks the {exc.claim!r} claim") from None
    except InvalidSignatureError:
        raise TokenRefused("bad_signature", "the token's signature does not verify") from None
    except InvalidTokenError as exc:
        raise TokenRefused("invalid", f"the token is not valid ({type(exc).__name__})") from None
