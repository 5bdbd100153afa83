"""One identity provider's metadata and signing keys, discovered and cached.

Fetches run in a worker thread with a deadline, one at a time per issuer. Cached keys keep verifying
until ``max_age`` while the provider is unreachable, then ``IssuerUnavailable`` (503). An unknown ``kid``
refetches at most once per ``refetch_seconds``. Only asymmetric signing keys are kept.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpx2
from jwt import PyJWK
from jwt.exceptions import PyJWKError

from gateway.identity.config import IssuerConfig

log = logging.getLogger(__name__)

MAX_DOCUMENT_BYTES: Final = 1 << 20
ASYMMETRIC_KTY: Final = frozenset({"RSA", "EC", "OKP"})
_LOOPBACK: Final = ("127.0.0.1", "::1", "localhost")


class IssuerUnavailable(Exception):
    """No usable keys for an issuer (never fetched, or expired while the provider is unreachable)."""

    def __init__(self, issuer: str, why: str) -> None:
        super().__init__(f"the identity provider {issuer} cannot be reached and no valid cached keys "
                         f"remain ({why}); retry shortly, and if it persists check the provider")
        self.issuer = issuer


class UnknownKey(Exception):
    """The token's ``kid`` is not among the issuer's keys, even after a refetch."""


@dataclass(frozen=True)
class KeySet:
    metadata: Mapping[str, Any]
    keys: Mapping[str, PyJWK]
    fetched_at: float


def _allowed_url(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    parts = urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK)


def _metadata_urls(issuer: str) -> list[str]:
    parts = urlsplit(issuer)
    base, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
    return [f"{issuer.rstrip('/')}/.well-known/openid-configuration",
            f"{base}/.well-known/oauth-authorization-server{path}"]


def parse_jwks(document: Any) -> dict[str, PyJWK]:
    """The usable signing keys of a JWKS by ``kid`` (a key without one is kept under "")."""
    keys: dict[str, PyJWK] = {}
    entries = document.get("keys") if isinstance(document, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("kty") not in ASYMMETRIC_KTY or entry.get("use") == "enc":
            continue
        if any(name in entry for name in ("d", "p", "q")):
            continue  # a private key has no business in a JWKS; never use one
        try:
            keys[str(entry.get("kid", ""))] = PyJWK(entry)
        except PyJWKError as exc:
            log.info("skipped a key of the JWKS (%s)", exc)
        except Exception as exc:  # a malformed member (a number where a string belongs) skips that key only
            log.info("skipped a malformed key of the JWKS (%s)", type(exc).__name__)
    return keys


class Fetcher:
    """Blocking HTTPS GETs of small JSON documents, with the issuer's trust anchor."""

    def __init__(self, ca_file: str | None, timeout: float) -> None:
        context = ssl.create_default_context(cafile=ca_file)
        self._client = httpx2.Client(verify=context, timeout=timeout, follow_redirects=False)

    def json(self, url: str) -> Any:
        with self._client.stream("GET", url, headers={"accept": "application/json"}) as response:
            if response.status_code != 200:
                raise OSError(f"{url} answered {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise OSError(f"{url} sent more than {MAX_DOCUMENT_BYTES} bytes")
        try:
            return json.loads(bytes(body))
        except ValueError as exc:
            raise OSError(f"{url} did not send JSON") from exc

    def post_form(self, url: str, data: Mapping[str, str], auth: tuple[str, str]) -> Any:
        response = self._client.post(url, data=dict(data), auth=auth, headers={"accept": "application/json"})
        if len(response.content) > MAX_DOCUMENT_BYTES:
            raise OSError(f"{url} sent more than {MAX_DOCUMENT_BYTES} bytes")
        try:
            return response.status_code, response.json()
        except ValueError as exc:
            raise OSError(f"{url} answered {response.status_code} without JSON") from exc

    def close(self) -> None:
        self._client.close()


class IssuerKeys:
    """The cached metadata and keys of one issuer (see the module docstring)."""

    def __init__(self, config: IssuerConfig, *, fetch_seconds: float = 5.0, refetch_seconds: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.fetch_seconds, self.refetch_seconds = config, fetch_seconds, refetch_seconds
        self.clock = clock
        self.fetcher = Fetcher(config.ca_file, fetch_seconds)
        self._current: KeySet | None = None
        self._last_failure = float("-inf")
        self._last_kid_refetch = float("-inf")
        self.last_error = "never fetched"
        self._fetching: anyio.Lock | None = None
        self._thread_lock = threading.Lock()
        #: fetches made (tests and the bench read it)
        self.fetches = 0

    @property
    def issuer(self) -> str:
        return self.config.issuer

    def _lock(self) -> anyio.Lock:
        if self._fetching is None:
            self._fetching = anyio.Lock()
        return self._fetching

    def _load(self) -> KeySet:
        """Blocking: metadata, then its JWKS."""
        with self._thread_lock:
            self.fetches += 1
        metadata: Any = None
        problems = []
        for url in _metadata_urls(self.issuer):
            try:
                metadata = self.fetcher.json(url)
                break
            except (OSError, httpx2.HTTPError) as exc:
                problems.append(str(exc) or type(exc).__name__)
        if not isinstance(metadata, dict):
            raise OSError("; ".join(problems) or "no metadata")
        if metadata.get("issuer") != self.issuer:
            raise OSError(f"its metadata names the issuer {str(metadata.get('issuer'))[:200]!r}")
        jwks_uri = metadata.get("jwks_uri")
        if not _allowed_url(jwks_uri):
            raise OSError("its metadata has no https jwks_uri")
        keys = parse_jwks(self.fetcher.json(str(jwks_uri)))
        if not keys:
            raise OSError("its JWKS holds no usable signing key")
        return KeySet(metadata=metadata, keys=keys, fetched_at=self.clock())

    async def _refresh(self, seen: KeySet | None, *, for_kid: bool = False) -> KeySet | None:
        """Fetch once, unless another request just did, the last failure is too recent, or (for an
        unknown ``kid``) the last such refetch is."""
        async with self._lock():
            now = self.clock()
            if self._current is not seen:
                return self._current  # someone else refreshed while this request waited
            if now - self._last_failure < self.refetch_seconds:
                return self._current
            if for_kid:
                if now - self._last_kid_refetch < self.refetch_seconds:
                    return self._current
                self._last_kid_refetch = now
            try:
                with anyio.fail_after(self.fetch_seconds + 1):
                    fresh = await anyio.to_thread.run_sync(self._load, abandon_on_cancel=True)
            except (OSError, httpx2.HTTPError, TimeoutError, ValueError) as exc:
                self.last_error = str(exc)[:300] or type(exc).__name__
                self._last_failure = self.clock()
                log.warning("could not fetch the keys of %s: %s", self.issuer, self.last_error)
                return self._current
            self._current = fresh
            return fresh

    def _usable(self, found: KeySet | None) -> bool:
        return found is not None and self.clock() - found.fetched_at < self.config.keys_max_age_seconds

    async def keyset(self) -> KeySet:
        """Current metadata and keys, refreshed when stale; ``IssuerUnavailable`` when none are usable."""
        found = self._current
        if found is None or self.clock() - found.fetched_at >= self.config.keys_max_age_seconds / 2:
            found = await self._refresh(found)
        if found is None or not self._usable(found):
            raise IssuerUnavailable(self.issuer, self.last_error)
        return found

    async def key(self, kid: str) -> PyJWK:
        """The key named ``kid``; one refetch (rate-limited) when it is unknown."""
        found = await self.keyset()
        key = found.keys.get(kid)
        if key is None:
            refreshed = await self._refresh(found, for_kid=True)
            if refreshed is not None and self._usable(refreshed):
                key = refreshed.keys.get(kid)
        if key is None:
            raise UnknownKey(kid)
        return key

    def close(self) -> None:
        self.fetcher.close()
