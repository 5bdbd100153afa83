"""JWT checks for access tokens and ID tokens (PyJWT does the JOSE work). Pure apart from the key lookup.

Only asymmetric algorithms (never ``none`` or HMAC, so a public key never serves as a secret), and the
algorithm must fit the key's type, checked before PyJWT sees the key (a JWKS without ``alg`` would
otherwise hand an RSA key to the EC verifier). Verification can only refuse: whatever a crafted token
raises becomes ``TokenRefused("malformed")``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from jwt import PyJWK
from jwt.exceptions import (
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
#: the curve each ECDSA algorithm signs on (cryptography's names)
EC_CURVES: Final = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}


class TokenRefused(Exception):
    """Why a token is not accepted: ``reason`` is a stable code, the message says it for a person."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and len(token) <= MAX_TOKEN_CHARS


def _unreadable() -> TokenRefused:
    return TokenRefused("malformed", "the bearer token is not a readable JWT")


def unverified_issuer(token: str) -> str:
    """The ``iss`` a token claims (only to pick the issuer whose keys then verify it)."""
    if not looks_like_jwt(token):
        raise TokenRefused("malformed", "the bearer token is neither a gateway token nor a JWT")
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except Exception:  # whatever a crafted token makes PyJWT raise, it is refused
        raise _unreadable() from None
    if not isinstance(claims, dict):
        raise _unreadable()
    iss = claims.get("iss")
    if not isinstance(iss, str):
        raise TokenRefused("wrong_issuer", "the token names no issuer (iss)")
    return iss


def jti_digest(claims: Mapping[str, Any]) -> str | None:
    """What audit rows keep of a token's ``jti``: its sha256, never the value."""
    jti = claims.get("jti")
    return hashlib.sha256(str(jti).encode()).hexdigest() if jti is not None else None


def key_kind(key: object) -> str:
    """What a public key is, in the words a refusal uses: RSA, EC P-256/P-384/P-521 (as ``EC secp...``),
    Ed25519, Ed448, or ``unusable``."""
    if isinstance(key, RSAPublicKey):
        return "RSA"
    if isinstance(key, EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    if isinstance(key, Ed25519PublicKey):
        return "Ed25519"
    if isinstance(key, Ed448PublicKey):
        return "Ed448"
    return "unusable"


def key_fits(alg: str, key: object) -> bool:
    """Whether ``key`` (a cryptography public key) is of the family ``alg`` signs with. Pure."""
    kind = key_kind(key)
    if alg.startswith(("RS", "PS")):
        return kind == "RSA"
    if alg in EC_CURVES:
        return kind == f"EC {EC_CURVES[alg]}"
    if alg == "EdDSA":
        return kind in ("Ed25519", "Ed448")
    return False


def checked_key(alg: str, key: Any) -> Any:
    """The public key of JWK ``key`` if it may verify a token that says ``alg``; ``TokenRefused``
    (``algorithm``) when its declared ``alg`` or its type says otherwise."""
    data = getattr(key, "_jwk_data", None)
    declared = data.get("alg") if isinstance(data, dict) else None
    if declared is not None and declared != alg:
        raise TokenRefused("algorithm", f"the token says {alg} but its key is for {str(declared)[:20]}")
    public = getattr(key, "key", None)
    if not key_fits(alg, public):
        raise TokenRefused("algorithm", f"the token says {alg} but the key its kid names is "
                           f"{key_kind(public)}; a token is refused unless its algorithm fits its key")
    return public


def _alg_and_kid(token: str) -> tuple[str, str]:
    """The accepted algorithm and the ``kid`` a token's header names; ``TokenRefused`` otherwise."""
    try:
        header = jwt.get_unverified_header(token)
    except Exception:  # whatever a crafted header makes PyJWT raise, it is refused
        raise _unreadable() from None
    alg = header.get("alg") if isinstance(header, dict) else None
    if not isinstance(alg, str) or alg not in ALGORITHMS:
        raise TokenRefused("algorithm", f"tokens signed with {str(alg)[:20]!r} are refused; the gateway "
                           f"accepts {', '.join(ALGORITHMS)}")
    kid = header.get("kid", "")
    if not isinstance(kid, str):
        raise TokenRefused("malformed", "the token's kid is not a string")
    return alg, kid


async def verify_jwt(token: str, *, issuer: str, audience: str,
                     key_for: Callable[[str], Awaitable[PyJWK]]) -> dict[str, Any]:
    """The verified claims of ``token`` (see the module docstring); ``TokenRefused`` otherwise.
    ``key_for(kid)`` finds the signing key (its own errors pass through)."""
    alg, kid = _alg_and_kid(token)
    public = checked_key(alg, await key_for(kid))
    try:
        claims = jwt.decode(token, public, algorithms=[alg], audience=audience, issuer=issuer,
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
    except Exception as exc:  # verification only ever refuses (see the module docstring)
        raise TokenRefused("malformed", f"the token cannot be verified ({type(exc).__name__})") from None
    if not isinstance(claims, dict):
        raise _unreadable()
    return claims
