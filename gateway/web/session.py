"""Sign-in sessions of the approval page: an opaque cookie, a CSRF token, and the same-origin check.

The browser holds only a random session id (``HttpOnly``, ``SameSite=Strict``, ``__Host-`` on HTTPS),
never the token; the store keeps only its sha256, so sessions survive restarts and replicas. A session
remembers the token's id, not its secret, so revocations apply from the next request. The sign-in POST
has no session yet: the origin check is its only guard against cross-site posts.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from gateway.auth.tokens import CallerKey, Principal
from gateway.guard.callers import same
from gateway.store.base import StateStore, WebSessionRecord

#: cookie names: the ``__Host-`` prefix is only valid (and only accepted by browsers) with ``Secure``
SECURE_COOKIE: Final = "__Host-gw_session"
PLAIN_COOKIE: Final = "gw_session"
CSRF_HEADER: Final = "x-csrf-token"
DEFAULT_LIFETIME: Final = 8 * 3600.0
DEFAULT_IDLE: Final = 30 * 60.0
MAX_SESSIONS: Final = 10_000
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


@dataclass
class WebSession:
    """One signed-in browser. ``id`` travels in the cookie, ``csrf`` in a header; neither is logged."""

    id: str = field(repr=False)
    token_id: str
    name: str
    csrf: str = field(repr=False)
    created_at: float
    expires_at: float
    last_seen: float
    #: the signed-in caller's ``CallerKey`` text (for an SSO person, its issuer and ``sub``); None: a
    #: session stored before keys were kept, which signs nobody in
    caller_key: str | None = None

    def keyed_to(self, key: CallerKey) -> bool:
        """Whether this session was opened by the caller keyed ``key`` (``guard.callers.same``: a session
        kept without a key is nobody's)."""
        return same(self.caller_key, key)


class SessionStore:
    """Live sessions by id (see the module docstring for lifetimes). Thread-safe."""

    def __init__(self, *, lifetime: float = DEFAULT_LIFETIME, idle: float = DEFAULT_IDLE,
                 max_sessions: int = MAX_SESSIONS, clock: Callable[[], float] = time.time,
                 store: StateStore | None = None) -> None:
        if lifetime <= 0 or idle <= 0 or max_sessions <= 0:
            raise ValueError("session lifetime, idle timeout and capacity must be positive")
        self.lifetime, self.idle, self.max_sessions, self.clock = lifetime, idle, max_sessions, clock
        self.store = store
        self._lock = threading.Lock()
        self._sessions: dict[str, WebSession] = {}

    def create(self, principal: Principal) -> WebSession:
        """A fresh session (new id and CSRF token) for a verified ``principal`` with a token id."""
        if principal.token_id is None:
            raise ValueError("a web session needs the token id of a verified principal")
        now = self.clock()
        session = WebSession(id=secrets.token_urlsafe(32), token_id=principal.token_id, name=principal.name,
                             csrf=secrets.token_urlsafe(32), created_at=now, expires_at=now + self.lifetime,
                             last_seen=now, caller_key=str(principal.key))
        if self.store is not None:
            self.store.add_web_session(_record(session), idle=self.idle, max_sessions=self.max_sessions)
            return session
        with self._lock:
            self._drop_stale(now)
            while len(self._sessions) >= self.max_sessions:
                del self._sessions[next(iter(self._sessions))]  # dicts keep insertion order: the oldest
            self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> WebSession | None:
        """The live session with this id (and mark it used now), or None."""
        if not session_id:
            return None
        now = self.clock()
        if self.store is not None:
            found = self.store.touch_web_session(session_key(session_id), now, self.idle)
            return None if found is None else _session(session_id, found)
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if not self._alive(session, now):
                del self._sessions[session_id]
                return None
            session.last_seen = now
            return session

    def end(self, session_id: str | None) -> WebSession | None:
        """End the session (sign-out, revoked token); return it if it existed."""
        if not session_id:
            return None
        if self.store is not None:
            found = self.store.end_web_session(session_key(session_id))
            return None if found is None else _session(session_id, found)
        with self._lock:
            return self._sessions.pop(session_id, None)

    def remaining(self, session: WebSession) -> float:
        """Seconds until ``session`` ends if it stays busy (its absolute lifetime)."""
        return max(0.0, session.expires_at - self.clock())

    def __len__(self) -> int:
        if self.store is not None:
            return self.store.count_web_sessions()
        with self._lock:
            return len(self._sessions)

    def _alive(self, session: WebSession, now: float) -> bool:
        return now < session.expires_at and now - session.last_seen < self.idle

    def _drop_stale(self, now: float) -> None:
        for sid in [sid for sid, s in self._sessions.items() if not self._alive(s, now)]:
            del self._sessions[sid]


def session_key(session_id: str) -> str:
    """What the state store keeps of a session id: its sha256 (hex)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def _record(session: WebSession) -> WebSessionRecord:
    return WebSessionRecord(key=session_key(session.id), token_id=session.token_id, name=session.name,
                            csrf=session.csrf, created_at=session.created_at, expires_at=session.expires_at,
                            last_seen=session.last_seen, caller_key=session.caller_key)


def _session(session_id: str, rec: WebSessionRecord) -> WebSession:
    return WebSession(id=session_id, token_id=rec.token_id, name=rec.name, csrf=rec.csrf,
                      created_at=rec.created_at, expires_at=rec.expires_at, last_seen=rec.last_seen,
                      caller_key=rec.caller_key)


# ---------------------------------------------------------------------------- cookies


def cookie_name(secure: bool) -> str:
    return SECURE_COOKIE if secure else PLAIN_COOKIE


def set_cookie_header(session_id: str, *, secure: bool, max_age: float, path: str) -> str:
    """The ``Set-Cookie`` value for a session. Secure cookies use ``__Host-`` and so ``Path=/``."""
    attributes = [f"{cookie_name(secure)}={session_id}", f"Max-Age={max(0, int(max_age))}",
                  "HttpOnly", "SameSite=Strict", f"Path={'/' if secure else path}"]
    if secure:
        attributes.append("Secure")
    return "; ".join(attributes)


def clear_cookie_header(*, secure: bool, path: str) -> str:
    return set_cookie_header("", secure=secure, max_age=0, path=path)


def csrf_matches(session: WebSession, presented: str | None) -> bool:
    """Constant-time comparison of the presented CSRF token with the session's."""
    return presented is not None and hmac.compare_digest(presented.encode(), session.csrf.encode())


# ---------------------------------------------------------------------------- origin


def _origin_key(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    parts = urlsplit(f"{scheme}://{netloc}")
    try:
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.username or parts.password:
        return None
    return scheme, parts.hostname.rstrip("."), port or _DEFAULT_PORTS.get(scheme, 0)


def _parse_origin(origin: str) -> tuple[str, str, int] | None:
    parts = urlsplit(origin.strip().lower())
    if parts.scheme not in _DEFAULT_PORTS or parts.path or parts.query or parts.fragment:
        return None
    return _origin_key(parts.scheme, parts.netloc)


def origin_refusal(
    *, origin: str | None, fetch_site: str | None, scheme: str, host: str | None,
    allowed: Callable[[str], bool] | None = None,
) -> str | None:
    """Why a state-changing request must be refused as possibly cross-site, or None if it may proceed.

    ``scheme`` and ``host`` are the request's own (its URL scheme and ``Host`` header): the ``Origin``
    must name exactly that origin (default ports folded), and pass ``allowed`` when given.
    ``Sec-Fetch-Site``, sent by current browsers, must then be ``same-origin``. Pure.
    """
    if fetch_site is not None and fetch_site.strip().lower() != "same-origin":
        return f"a {fetch_site.strip() or 'blank'} request (Sec-Fetch-Site) cannot change anything here"
    if not origin:
        return "the request carries no Origin header; changes are accepted only from this page"
    own = _origin_key(scheme.lower(), (host or "").lower())
    theirs = _parse_origin(origin)
    if own is not None and theirs is not None and theirs[1] == own[1] and theirs[0] != own[0]:
        return (f"the page was loaded over {theirs[0]} but this request reached the gateway over {own[0]}; "
                "behind a TLS-terminating proxy, start the gateway with --forwarded-allow-ips naming it")
    if own is None or theirs is None or theirs != own:
        return "the request comes from another web origin; changes are accepted only from this page"
    if allowed is not None and not allowed(origin.strip()):
        return "the request's origin is not one this gateway serves"
    return None
