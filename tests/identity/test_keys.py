"""One identity provider's metadata and signing keys (``gateway.identity.keys``): which JWKS members are kept
(``parse_jwks``), discovery and caching by ``IssuerKeys`` against a real provider on loopback HTTP (a
thread serving JSON documents), cached keys outliving an outage until their age runs out, and an
unknown ``kid`` refetched at most once per interval. Time is a plain clock value the tests move."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from gateway.identity.config import IssuerConfig
from gateway.identity.keys import IssuerKeys, IssuerUnavailable, UnknownKey, parse_jwks

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
ED_KEY = ed25519.Ed25519PrivateKey.generate()


def _jwk(private: Any, kid: str, **extra: Any) -> dict[str, Any]:
    if isinstance(private, rsa.RSAPrivateKey):
        doc = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    elif isinstance(private, ec.EllipticCurvePrivateKey):
        doc = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    else:
        doc = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
    return {**doc, "kid": kid, **extra}


class _Provider:
    """An identity provider on loopback: serves ``documents`` (path -> JSON)."""

    def __init__(self) -> None:
        self.documents: dict[str, Any] = {}
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                doc = provider.documents.get(self.path)
                body = json.dumps(doc).encode() if doc is not None else b"{}"
                self.send_response(200 if doc is not None else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.issuer = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()
        self.serve([_jwk(RSA_KEY, "rsa-1")])

    def serve(self, keys: list[dict[str, Any]], **metadata: Any) -> None:
        self.documents = {
            "/.well-known/openid-configuration": {"issuer": self.issuer, "jwks_uri": f"{self.issuer}/jwks",
                                                  **metadata},
            "/jwks": {"keys": keys},
        }

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def provider() -> Iterator[_Provider]:
    served = _Provider()
    try:
        yield served
    finally:
        served.stop()


def _keys(provider: _Provider, clock: _Clock, **options: Any) -> IssuerKeys:
    config = IssuerConfig(issuer=provider.issuer, audience="https://gw/mcp", principal_claim="sub",
                          roles_claim="groups", roles=(("ops", "admin"),), keys_max_age_seconds=600.0)
    return IssuerKeys(config, clock=clock, fetch_seconds=2.0, **options)


# -- parse_jwks ----------------------------------------------------------------------------------------------

def test_parse_jwks_keeps_asymmetric_signing_keys_by_kid() -> None:
    keys = parse_jwks({"keys": [_jwk(RSA_KEY, "r"), _jwk(EC_KEY, "e"), _jwk(ED_KEY, "o", use="sig")]})
    assert sorted(keys) == ["e", "o", "r"]


def test_parse_jwks_keeps_a_key_without_kid_under_the_empty_name() -> None:
    entry = _jwk(RSA_KEY, "x")
    del entry["kid"]
    assert list(parse_jwks({"keys": [entry]})) == [""]


@pytest.mark.parametrize("entry", [
    {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},          # a symmetric key
    {**_jwk(RSA_KEY, "enc"), "use": "enc"},                  # an encryption key
    {**_jwk(RSA_KEY, "priv"), "d": "AQAB"},                  # a private key
    {**_jwk(EC_KEY, "priv"), "d": "AQAB"},
    {"kty": "RSA", "kid": "broken", "n": 5, "e": "AQAB"},    # a malformed member
    {"kty": "EC", "kid": "broken", "crv": "P-999", "x": "a", "y": "b"},
    "not a mapping",
    {"kid": "no-kty"},
])
def test_parse_jwks_skips_what_must_never_verify(entry: Any) -> None:
    assert parse_jwks({"keys": [entry, _jwk(RSA_KEY, "good")]}).keys() == {"good"}


@pytest.mark.parametrize("document", [None, [], "keys", {}, {"keys": "x"}, {"keys": None}])
def test_parse_jwks_of_something_that_is_no_jwks_is_empty(document: Any) -> None:
    assert parse_jwks(document) == {}


# -- IssuerKeys ----------------------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_keys_are_discovered_through_the_metadata(provider: _Provider) -> None:
    keys = _keys(provider, _Clock())
    try:
        found = await keys.keyset()
        assert found.metadata["issuer"] == provider.issuer
        assert set(found.keys) == {"rsa-1"}
        assert (await keys.key("rsa-1")).key_type == "RSA"
        assert keys.fetches == 1
    finally:
        keys.close()


@pytest.mark.anyio
async def test_fresh_keys_are_served_from_the_cache(provider: _Provider) -> None:
    clock = _Clock()
    keys = _keys(provider, clock)
    try:
        await keys.keyset()
        clock.now += 299  # under half the max age
        await keys.key("rsa-1")
        assert keys.fetches == 1
        clock.now += 2  # past half the max age: refreshed
        await keys.keyset()
        assert keys.fetches == 2
    finally:
        keys.close()


@pytest.mark.anyio
async def test_cached_keys_outlive_an_outage_until_their_max_age(provider: _Provider) -> None:
    clock = _Clock()
    keys = _keys(provider, clock, refetch_seconds=30.0)
    try:
        await keys.keyset()
        provider.stop()
        clock.now += 400
        assert (await keys.keyset()).keys  # stale but usable: the provider is down
        assert keys.fetches == 2
        clock.now += 300  # past the max age
        with pytest.raises(IssuerUnavailable, match=f"identity provider {provider.issuer} cannot be reached"):
            await keys.keyset()
    finally:
        keys.close()


@pytest.mark.anyio
async def test_a_provider_never_reached_is_unavailable(provider: _Provider) -> None:
    provider.stop()
    keys = _keys(provider, _Clock())
    try:
        with pytest.raises(IssuerUnavailable) as caught:
            await keys.keyset()
        assert caught.value.issuer == provider.issuer
    finally:
        keys.close()


@pytest.mark.anyio
async def test_a_failed_fetch_is_not_retried_within_the_refetch_interval(provider: _Provider) -> None:
    provider.documents = {}
    clock = _Clock()
    keys = _keys(provider, clock, refetch_seconds=30.0)
    try:
        with pytest.raises(IssuerUnavailable):
            await keys.keyset()
        with pytest.raises(IssuerUnavailable):
            await keys.keyset()
        assert keys.fetches == 1
        clock.now += 31
        provider.serve([_jwk(RSA_KEY, "rsa-1")])
        assert (await keys.keyset()).keys
        assert keys.fetches == 2
    finally:
        keys.close()


@pytest.mark.anyio
async def test_an_unknown_kid_refetches_once_per_interval(provider: _Provider) -> None:
    clock = _Clock()
    keys = _keys(provider, clock, refetch_seconds=30.0)
    try:
        await keys.keyset()
        with pytest.raises(UnknownKey):
            await keys.key("rotated-1")
        with pytest.raises(UnknownKey):
            await keys.key("rotated-2")
        assert keys.fetches == 2  # the second unknown kid waits for the interval
        provider.serve([_jwk(RSA_KEY, "rsa-1"), _jwk(EC_KEY, "rotated-2")])
        clock.now += 31
        assert (await keys.key("rotated-2")).key_type == "EC"
        assert keys.fetches == 3
    finally:
        keys.close()


@pytest.mark.anyio
async def test_rfc8414_metadata_is_the_fallback(provider: _Provider) -> None:
    metadata = provider.documents.pop("/.well-known/openid-configuration")
    provider.documents["/.well-known/oauth-authorization-server"] = metadata
    keys = _keys(provider, _Clock())
    try:
        assert set((await keys.keyset()).keys) == {"rsa-1"}
    finally:
        keys.close()


@pytest.mark.parametrize(("metadata", "why"), [
    ({"issuer": "https://someone.else"}, "its metadata names the issuer 'https://someone.else'"),
    ({"jwks_uri": "ftp://127.0.0.1/jwks"}, "its metadata has no https jwks_uri"),
    ({"jwks_uri": "http://idp.example/jwks"}, "its metadata has no https jwks_uri"),
    ({"jwks_uri": 7}, "its metadata has no https jwks_uri"),
])
@pytest.mark.anyio
async def test_metadata_that_cannot_be_trusted_is_refused(provider: _Provider, metadata: dict[str, Any],
                                                          why: str) -> None:
    provider.serve([_jwk(RSA_KEY, "rsa-1")], **metadata)
    keys = _keys(provider, _Clock())
    try:
        with pytest.raises(IssuerUnavailable):
            await keys.keyset()
        assert keys.last_error == why
    finally:
        keys.close()


@pytest.mark.anyio
async def test_a_jwks_without_a_usable_key_is_refused(provider: _Provider) -> None:
    provider.serve([{"kty": "oct", "k": "c2VjcmV0"}])
    keys = _keys(provider, _Clock())
    try:
        with pytest.raises(IssuerUnavailable):
            await keys.keyset()
        assert keys.last_error == "its JWKS holds no usable signing key"
    finally:
        keys.close()
