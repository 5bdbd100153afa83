"""Single sign-on for the approval page: the OpenID Connect authorization code flow with PKCE.

A browser-bound ``state`` (no login CSRF), taken once (no replay) and compared in constant time; the
ID token is verified like an access token plus its ``nonce``, and no token is kept. Pending sign-ins
live in this process: behind several replicas, route /ui/sso/ to one (sticky sessions).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import anyio
import anyio.to_thread
import httpx2

from gateway.identity.config import WebSignIn
from gateway.identity.mapping import Identity
from gateway.identity.service import IdentityRefusal, IdentityService

DEFAULT_TTL: Final = 600.0
MAX_PENDING: Final = 1000


@dataclass(frozen=True)
class Pending:
    state: str
    nonce: str
    verifier: str
    redirect_uri: str
    created: float


def pkce_challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _refused(message: str, reason: str = "sso_failed", status: int = 401) -> IdentityRefusal:
    return IdentityRefusal(status, reason, message)


class SignOn:
    def __init__(
        self,
        service: IdentityService,
        web: WebSignIn,
        client_secret: str,
        *,
        ttl: float = DEFAULT_TTL,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.time,
    ) -> None:
        issuer = service.config.issuer(web.issuer)
        assert issuer is not None  # identity.yaml's parser checks it
        self.service, self.web, self.issuer = service, web, issuer
        self._secret = client_secret
        self.ttl, self.max_pending, self.clock = ttl, max_pending, clock
        self._pending: OrderedDict[str, Pending] = OrderedDict()

    @property
    def token_sign_in(self) -> bool:
        return self.web.token_sign_in

    async def _metadata(self) -> dict[str, Any]:
        try:
            return dict((await self.service.keys[self.issuer.issuer].keyset()).metadata)
        except Exception as exc:
            raise IdentityRefusal(503, "issuer_unavailable", str(exc), retry_after=5.0) from None

    async def begin(self, redirect_uri: str) -> tuple[str, str]:
        """(the provider's authorization URL, the browser binding for the cookie)."""
        endpoint = (await self._metadata()).get("authorization_endpoint")
        if not isinstance(endpoint, str):
            raise IdentityRefusal(
                503, "issuer_unavailable", f"{self.issuer.issuer} publishes no authorization_endpoint"
            )
        now = self.clock()
        pending = Pending(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            verifier=secrets.token_urlsafe(64),
            redirect_uri=redirect_uri,
            created=now,
        )
        binding = secrets.token_urlsafe(32)
        self._drop_stale(now)
        while len(self._pending) >= self.max_pending:
            self._pending.popitem(last=False)
        self._pending[binding] = pending
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.web.client_id,
                "redirect_uri": redirect_uri,
                "scope": self.web.scope,
                "state": pending.state,
                "nonce": pending.nonce,
                "code_challenge": pkce_challenge(pending.verifier),
                "code_challenge_method": "S256",
            }
        )
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}", binding

    def _drop_stale(self, now: float) -> None:
        for key in [k for k, p in self._pending.items() if now - p.created >= self.ttl]:
            del self._pending[key]

    async def finish(self, binding: str | None, state: str | None, code: str | None) -> Identity:
        """The person the provider signed in; ``IdentityRefusal`` for anything else."""
        pending = self._pending.pop(binding, None) if binding else None
        if pending is None or self.clock() - pending.created >= self.ttl:
            raise _refused("this sign-in was not started in this browser or took too long; start again")
        if not state or not hmac.compare_digest(state.encode(), pending.state.encode()):
            raise _refused("the sign-in's state does not match; start again")
        if not code:
            raise _refused("the identity provider sent no authorization code; start again")
        endpoint = (await self._metadata()).get("token_endpoint")
        if not isinstance(endpoint, str):
            raise IdentityRefusal(
                503, "issuer_unavailable", f"{self.issuer.issuer} publishes no token_endpoint"
            )
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": pending.redirect_uri,
            "code_verifier": pending.verifier,
        }
        fetcher = self.service.keys[self.issuer.issuer].fetcher
        try:
            with anyio.fail_after(self.service.keys[self.issuer.issuer].fetch_seconds + 1):
                status, answer = await anyio.to_thread.run_sync(
                    fetcher.post_form,
                    endpoint,
                    form,
                    (self.web.client_id, self._secret),
                    abandon_on_cancel=True,
                )
        except (OSError, httpx2.HTTPError, TimeoutError) as exc:
            raise IdentityRefusal(
                503,
                "issuer_unavailable",
                f"the identity provider {self.issuer.issuer} did "
                f"not answer the code exchange ({type(exc).__name__}); try again",
            ) from None
        id_token = answer.get("id_token") if isinstance(answer, dict) and status == 200 else None
        if not isinstance(id_token, str):
            error = answer.get("error") if isinstance(answer, dict) else None
            raise _refused(f"the identity provider refused the code exchange ({str(error)[:80]})")
        _issuer, claims = await self.service.verified(
            id_token, audience=self.web.client_id, issuer=self.issuer
        )
        audience = claims.get("aud")
        if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != self.web.client_id:
            raise _refused("the ID token names several audiences but was not issued to this page (azp)")
        nonce = claims.get("nonce")
        if not isinstance(nonce, str) or not hmac.compare_digest(nonce.encode(), pending.nonce.encode()):
            raise _refused("the ID token's nonce does not match this sign-in; start again")
        return self.service.person(claims, self.issuer, surface="web")
