"""Verification of identity provider tokens can only refuse: a token whose algorithm does not fit its key's
type (the issuer's JWKS keys carry no ``alg``, as Entra ID's do not) is a 401 ``invalid_token`` with a
``token_refused`` row on every entry point, never a 500; and random headers, keys and claims, thousands
in-process and hundreds over the real HTTPS server, only ever meet refusals."""

from __future__ import annotations

import base64
import json
import ssl
import string
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jwt import PyJWK
from support.httpserver import audit_rows
from support.jwks_issuer import GROUPS, IssuerServed, JwksIssuer, _public_jwk, issuer_gateway
from support.simulator import Simulator, wait_until

from gateway.identity.config import IdentityConfig, IssuerConfig
from gateway.identity.keys import UnknownKey
from gateway.identity.service import IdentityRefusal, IdentityService
from gateway.identity.verify import ALGORITHMS, TokenRefused, key_fits, verify_jwt

MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json",
               "mcp-protocol-version": "2025-11-25"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "test", "version": "1"}}}


# ---------------------------------------------------------------------------- the key must fit: a table

_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_P256 = ec.generate_private_key(ec.SECP256R1())
_P384 = ec.generate_private_key(ec.SECP384R1())
_P521 = ec.generate_private_key(ec.SECP521R1())
_ED25519 = ed25519.Ed25519PrivateKey.generate()
_ED448 = ed448.Ed448PrivateKey.generate()
PRIVATE = {"rsa": _RSA, "p256": _P256, "p384": _P384, "p521": _P521, "ed25519": _ED25519, "ed448": _ED448}
#: for each algorithm, the keys that may verify it
FITS = {"RS256": {"rsa"}, "RS384": {"rsa"}, "RS512": {"rsa"}, "PS256": {"rsa"}, "PS384": {"rsa"},
        "PS512": {"rsa"}, "ES256": {"p256"}, "ES384": {"p384"}, "ES512": {"p521"},
        "EdDSA": {"ed25519", "ed448"}}


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_each_algorithm_fits_only_its_key_family(alg: str) -> None:
    for name, private in PRIVATE.items():
        assert key_fits(alg, private.public_key()) is (name in FITS[alg]), (alg, name)
    assert not key_fits(alg, None) and not key_fits(alg, b"a secret")


# ---------------------------------------------------------------------------- the real server

@pytest.fixture(scope="module")
def served(sim_vc1: Simulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IssuerServed]:
    with issuer_gateway(tmp_path_factory.mktemp("jwks"), sim_vc1) as running:
        yield running


def client(served: IssuerServed) -> httpx2.Client:
    tls = ssl.create_default_context(cafile=str(served.cert.cert))
    return httpx2.Client(base_url=served.base, verify=tls, timeout=30)


def ask(http: httpx2.Client, served: IssuerServed, path: str, token: str) -> httpx2.Response:
    """``token`` presented where ``path`` takes one (the sign-in reads it from its JSON body)."""
    if path == "/ui/api/sign-in":
        return http.post(path, json={"token": token},
                         headers={"origin": served.base, "sec-fetch-site": "same-origin"})
    bearer = {"Authorization": f"Bearer {token}"}
    if path == "/mcp":
        return http.post(path, json=INITIALIZE, headers={**MCP_HEADERS, **bearer})
    return http.get(path, headers=bearer)


def refused_rows(served: IssuerServed, reason: str) -> int:
    return sum(r.get("count", 0) for r in audit_rows(served.gateway)
               if r.get("phase") == "token_refused" and r.get("reason") == reason)


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1", "ed-1"])
def test_a_token_signed_by_each_key_type_is_accepted(served: IssuerServed, kid: str) -> None:
    """The check refuses only what does not fit: each key of the alg-less JWKS verifies its own tokens."""
    issuer = served.issuer
    with client(served) as http:
        answer = ask(http, served, "/metrics", issuer.sign(issuer.claims(), kid=kid))
    assert answer.status_code == 200, answer.text


#: (the algorithm the header says, the kid it names, the key that really signs)
CRAFTED = {
    "es256_header_on_rsa_key": ("ES256", "rsa-1", "ec-1"),
    "rs256_header_on_ec_key": ("RS256", "ec-1", "rsa-1"),
    "eddsa_header_on_rsa_key": ("EdDSA", "rsa-1", "ed-1"),
    "es384_header_on_p256_key": ("ES384", "ec-1", None),
    "ps256_header_on_ed25519_key": ("PS256", "ed-1", "rsa-1"),
}


def crafted(issuer: JwksIssuer, alg: str, kid: str, signer: str | None) -> str:
    """A token whose header says ``alg`` and ``kid``; signed by ``signer``'s key (or a made-up signature)."""
    if signer is not None:
        real_alg = {"rsa-1": "RS256", "ec-1": "ES256", "ed-1": "EdDSA"}[signer]
        token = issuer.sign(issuer.claims(), kid=signer, algorithm=real_alg)
        _header, body, signature = token.split(".")
    else:
        body = _b64(json.dumps(issuer.claims()).encode())
        signature = _b64(b"\x01" * 96)
    return f"{_b64(json.dumps({'alg': alg, 'kid': kid, 'typ': 'JWT'}).encode())}.{body}.{signature}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


PATHS = ("/mcp", "/metrics", "/audit/checkpoint", "/ui/api/sign-in")


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_an_algorithm_that_does_not_fit_its_key_is_401_with_a_row_everywhere(served: IssuerServed,
                                                                             case: str) -> None:
    """The issue's token (ES256 naming the RSA key) used to raise PyJWT's TypeError: 500 and no row."""
    token = crafted(served.issuer, *CRAFTED[case])
    before = refused_rows(served, "idp_algorithm")
    with client(served) as http:
        answers = {path: ask(http, served, path, token) for path in PATHS}
    for path, answer in answers.items():
        assert answer.status_code == 401, (path, answer.status_code, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "unauthorized", (path, error)
        assert "Traceback" not in answer.text
        if path != "/ui/api/sign-in":
            assert 'error="invalid_token"' in answer.headers["www-authenticate"], path
            assert "a token is refused unless its algorithm fits its key" in error["message"] or \
                "its key is for" in error["message"], (path, error)
    # /mcp, /metrics and /audit/checkpoint pass the edge; each refusal is counted in a token_refused row
    wait_until(lambda: refused_rows(served, "idp_algorithm") >= before + 3, timeout=20,
               what="the token_refused rows of the crafted token")
    # the page's sign-in refuses it itself, with a row of its own
    assert any(r.get("phase") == "web_sign_in_refused" and r.get("reason_code") == "idp_algorithm"
               for r in audit_rows(served.gateway)), "the sign-in's refusal left no row"


# ---------------------------------------------------------------------------- random tokens

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3),
                    max_leaves=6)
KIDS = ("rsa", "p256", "p384", "p521", "ed25519", "ed448", "declared_rs256_on_ec")
ISSUER = "https://login.example.com/tenant"
AUDIENCE = "https://gateway.example.com/mcp"


def _jwk(kid: str) -> PyJWK:
    if kid == "declared_rs256_on_ec":
        return PyJWK({**_public_jwk(_P256, kid), "alg": "ES256"})
    # PyJWT guesses no algorithm for an Ed448 JWK without alg (parse_jwks skips one): given here
    return PyJWK(_public_jwk(PRIVATE[kid], kid), "EdDSA" if kid == "ed448" else None)


PUBLIC = {kid: _jwk(kid) for kid in KIDS}


def _claims() -> st.SearchStrategy[dict[str, Any]]:
    now = 1_800_000_000
    return st.fixed_dictionaries({}, optional={
        "iss": st.just(ISSUER) | JSON, "aud": st.just(AUDIENCE) | st.just([AUDIENCE, 1]) | JSON,
        "exp": st.integers(min_value=-2**70, max_value=2**70) | st.just(now * 2) | JSON,
        "nbf": st.integers() | JSON, "iat": st.integers() | st.floats() | JSON, "sub": JSON,
        "client_id": JSON, "azp": JSON, "groups": st.lists(st.text(max_size=10)) | JSON,
        "scope": st.text(max_size=30) | JSON, "jti": JSON,
    })


def _headers() -> st.SearchStrategy[dict[str, Any]]:
    algs = st.sampled_from((*ALGORITHMS, "none", "HS256", "RSA-OAEP", "es256", "")) | JSON
    return st.fixed_dictionaries({"alg": algs}, optional={
        "kid": st.sampled_from(KIDS) | JSON, "typ": JSON, "crit": JSON, "b64": JSON, "jku": JSON,
        "x5c": JSON, "jwk": JSON,
    })


def _sign(header: dict[str, Any], claims: dict[str, Any], signer: str | None, garbage: bytes) -> str:
    """``header`` and ``claims`` (JSON, possibly strange) with ``signer``'s real signature where the
    header's algorithm lets it sign, else ``garbage`` as the signature."""
    import jwt

    alg, private = header.get("alg"), PRIVATE.get(signer or "")
    if private is not None and isinstance(alg, str) and alg in ALGORITHMS:
        try:
            extra = {k: v for k, v in header.items() if k not in ("alg", "typ")}
            return jwt.encode(claims, private, algorithm=alg, headers=extra)
        except Exception:  # this key cannot sign with this algorithm, or PyJWT refuses the header: unsigned
            pass
    head = _b64(json.dumps(header).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(garbage)}"


TOKENS = st.one_of(
    st.builds(_sign, _headers(), _claims(), st.sampled_from((None, *PRIVATE)), st.binary(max_size=140)),
    st.text(alphabet=string.ascii_letters + string.digits + "-_.=", max_size=80).filter(
        lambda t: not t.startswith("gwt_")),
    st.lists(st.text(alphabet=string.ascii_letters + string.digits + "-_=", max_size=40), min_size=3,
             max_size=3).map(".".join),
)
KEY_CHOICE = st.sampled_from((None, *KIDS))  # the key the lookup returns, whatever the kid (None: unknown)


def _lookup(choice: str | None) -> Any:
    async def key_for(_kid: str) -> PyJWK:
        if choice is None:
            raise UnknownKey(_kid)
        return PUBLIC[choice]

    return key_for


FAST = settings(max_examples=2500, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FAST
@given(token=TOKENS, choice=KEY_CHOICE)
def test_verify_jwt_only_returns_claims_or_refuses(token: str, choice: str | None) -> None:
    async def run() -> None:
        try:
            claims = await verify_jwt(token, issuer=ISSUER, audience=AUDIENCE, key_for=_lookup(choice))
        except (TokenRefused, UnknownKey):
            return
        assert isinstance(claims, dict) and claims["iss"] == ISSUER

    anyio.run(run)


class _StubKeys:
    """The issuer's key lookup without a network: the key ``choice`` names, whatever the kid."""

    def __init__(self, choice: str | None) -> None:
        self.choice = choice

    async def key(self, kid: str) -> PyJWK:
        return await _lookup(self.choice)(kid)

    def close(self) -> None:
        return None


_CONFIG = IdentityConfig(resource=AUDIENCE, issuers=(IssuerConfig(
    issuer=ISSUER, audience=AUDIENCE, principal_claim="sub", roles_claim="groups",
    roles=tuple(GROUPS.items())),))


_SERVICE = IdentityService(_CONFIG)
_SERVICE.keys[ISSUER].close()


@FAST
@given(token=TOKENS, choice=KEY_CHOICE)
def test_the_identity_service_only_accepts_or_refuses_with_401_or_403(token: str, choice: str | None) -> None:
    """``IdentityService.authenticate``: what every entry point (the edge, the page) calls."""
    service = _SERVICE
    service.keys[ISSUER] = _StubKeys(choice)  # type: ignore[assignment]

    async def run() -> None:
        try:
            await service.authenticate(token, surface="https")
        except IdentityRefusal as refusal:
            assert refusal.status in (401, 403), refusal
            assert refusal.status == 403 or (refusal.challenge or "").find('error="invalid_token"') >= 0

    anyio.run(run)


def _unmapped(claims: dict[str, Any]) -> dict[str, Any]:
    groups = claims.get("groups")
    if isinstance(groups, list):
        groups = [g for g in groups if not (isinstance(g, str) and g in GROUPS)]
    return {**claims, "groups": groups}


def _refusable_claims() -> st.SearchStrategy[dict[str, Any]]:
    """Claims that map to no role even when everything else is right (so nothing is ever let in)."""
    return _claims().map(_unmapped)


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_tokens_over_the_real_server_only_meet_401_or_403(served: IssuerServed, data: Any) -> None:
    issuer = served.issuer
    kid = data.draw(st.sampled_from(("rsa-1", "ec-1", "ed-1", "nope")) | JSON)
    header = {**data.draw(_headers()), "kid": kid}
    claims = {**data.draw(_refusable_claims()), "iss": data.draw(st.just(issuer.issuer) | JSON)}
    signer = data.draw(st.sampled_from((None, "rsa-1", "ec-1", "ed-1")))
    token = _served_token(issuer, header, claims, signer, data.draw(st.binary(max_size=100)))
    path = data.draw(st.sampled_from(PATHS[:3]))
    with client(served) as http:
        answer = ask(http, served, path, token)
    assert answer.status_code in (401, 403), (path, answer.status_code, answer.text)


def _served_token(issuer: JwksIssuer, header: dict[str, Any], claims: dict[str, Any], signer: str | None,
                  garbage: bytes) -> str:
    import jwt

    alg = header.get("alg")
    if signer is not None and isinstance(alg, str) and alg in ALGORITHMS:
        try:
            extra = {k: v for k, v in header.items() if k not in ("alg", "typ")}
            return jwt.encode(claims, issuer.keys[signer], algorithm=alg, headers=extra)
        except Exception:  # this key cannot sign with this algorithm: unsigned instead
            pass
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}.{_b64(garbage)}"


def test_no_traceback_reached_the_log(served: IssuerServed, caplog: pytest.LogCaptureFixture) -> None:
    """One more crafted token: the gateway logs at most a line naming the exception type."""
    token = crafted(served.issuer, *CRAFTED["es256_header_on_rsa_key"])
    with caplog.at_level("DEBUG"), client(served) as http:
        assert ask(http, served, "/metrics", token).status_code == 401
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


