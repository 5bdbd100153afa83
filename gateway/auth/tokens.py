"""Bearer tokens: format, hashing at rest, and the verifier every authenticated request goes through.

``gwt_<id>_<secret>``: the prefix is for secret scanners, the id finds the record without hashing.
Only an argon2id hash is stored; a verified token is cached under a keyed digest, and every request
re-reads the store's token generation, so a revocation applies from the next request. Throttling counts
failures per (client, token id), so others' mistakes behind one NAT never lock out a valid token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from gateway.auth.principal import CallerKey, Principal, caller_fields
from gateway.errors import InvalidArgument, StateUnavailable
from gateway.ids import ID_LENGTH, new_id
from gateway.store.base import StateStore, TokenRecord
from gateway.vocabulary import Kind

__all__ = [
    "CallerKey", "Principal", "TokenAuthenticator", "TokenRecord", "TokenVerifier", "Verdict",
    "caller_fields", "create_token", "new_token", "parse_expiry", "parse_token_id", "store_token",
]

log = logging.getLogger(__name__)

TOKEN_PREFIX: Final = "gwt_"
_TOKEN_RE: Final = re.compile(rf"gwt_([a-z0-9]{{{ID_LENGTH}}})_[A-Za-z0-9_-]{{43}}")
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_EXPIRY_RE: Final = re.compile(r"([1-9][0-9]{0,6})([smhdw])")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_CACHE_LIMIT: Final = 10_000
_CLIENT_LIMIT: Final = 10_000
#: argon2 checks that may run at once (each takes the hash's memory cost, 64 MiB by default)
MAX_VERIFICATIONS: Final = 2
#: requests that may wait for an argon2 check before more are refused as busy
MAX_WAITING: Final = 64
#: how long a request waits for the token store (a locked or stalled disk) before it is refused
STORE_SECONDS: Final = 5.0


def parse_token_id(token: str) -> str | None:
    """The id inside a well-formed token, or None for anything else."""
    match = _TOKEN_RE.fullmatch(token)
    return match.group(1) if match else None


def parse_expiry(text: str) -> float:
    """Seconds in a lifetime such as ``30d``, ``12h``, ``90m``, ``3600s`` or ``2w``."""
    match = _EXPIRY_RE.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument("expires_in", f"{text!r} is not a lifetime; write a positive whole number "
                              "followed by s, m, h, d or w, e.g. 30d")
    return float(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def create_token(
    store: StateStore, name: str, role: str, *, expires_in: float | None, now: float,
    hasher: PasswordHasher | None = None, kind: Kind = Kind.AGENT,
) -> tuple[str, TokenRecord]:
    """Create and store a token; return its plaintext (shown once, never stored) and its record.

    ``role`` is stored as given: whether it is defined is the caller's check (``RoleBook.get``).
    ``kind``: an agent's token (the default) or a person's (who may sign in to the page and approve).
    """
    if not _NAME_RE.fullmatch(name):
        raise InvalidArgument("name", f"{name!r} is not a token name; use 1-64 letters, digits, '.', '_', "
                              "'@' or '-', starting with a letter or digit")
    if not role:
        raise InvalidArgument("role", "a token needs a role (reader, admin, or one from roles.yaml)")
    if expires_in is not None and expires_in <= 0:
        raise InvalidArgument("expires_in", "must be positive, e.g. 30d")
    token = new_token()
    return token, store_token(store, name, role, token, expires_in=expires_in, now=now, hasher=hasher,
                              kind=kind)


def new_token() -> str:
    """A fresh token's plaintext (``gwt_<id>_<secret>``), not stored anywhere."""
    return f"{TOKEN_PREFIX}{new_id()}_{secrets.token_urlsafe(32)}"


def store_token(
    store: StateStore, name: str, role: str, token: str, *, expires_in: float | None, now: float,
    hasher: PasswordHasher | None = None, kind: Kind = Kind.AGENT,
) -> TokenRecord:
    """Store the hash of ``token`` (a plaintext of ``new_token``'s format) under ``name``; its record."""
    token_id = parse_token_id(token)
    if token_id is None:
        raise InvalidArgument("token", "not a gateway token (gwt_<12 characters>_<43 characters>)")
    rec = TokenRecord(token_id=token_id, name=name, role=role, hash=(hasher or PasswordHasher()).hash(token),
                      created_at=now, expires_at=None if expires_in is None else now + expires_in,
                      kind=Kind(kind))
    store.add_token(rec)
    return rec


@dataclass(frozen=True)
class _Candidate:
    """A token whose record is usable but whose secret has not been checked in this process yet."""

    record: TokenRecord
    key: bytes


@dataclass(frozen=True)
class Verdict:
    """What ``authenticate`` found: the principal, or why not (``reason``: malformed, unknown_token,
    invalid, revoked, expired, throttled, busy) and, when throttled or busy, the seconds to wait;
    ``token_id`` names the refused token when its id is a stored one (never its secret)."""

    principal: Principal | None
    reason: str = ""
    retry_after: float | None = None
    token_id: str | None = None


_Key = tuple[str, str | None]  # (client, token id); None: malformed tokens and unknown ids


class TokenAuthenticator:
    """Turns a bearer token into a ``Principal`` (see the module docstring). Thread-safe.

    ``verify`` runs argon2 inline on first sight of a token; on an event loop use ``authenticate``
    (or ``verify_async``), which does only that part in a worker thread. A throttled request gets no
    argon2 work; ``authenticate`` says so with the seconds to wait (answer 429 with Retry-After).
    """

    def __init__(
        self, store: StateStore, *, clock: Callable[[], float] = time.time,
        hasher: PasswordHasher | None = None, max_failures: int = 10, failure_window: float = 60.0,
        touch_interval: float = 60.0, max_verifications: int = MAX_VERIFICATIONS,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self._store = store
        self._clock = clock
        self._hasher = hasher or PasswordHasher()
        self._max_failures = max_failures
        self._window = failure_window
        self._touch_interval = touch_interval
        self._key = secrets.token_bytes(32)
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._records: dict[str, TokenRecord] = {}
        self._verified: dict[bytes, str] = {}
        self._failures: dict[_Key, deque[float]] = {}
        #: when quiet failure entries were last forgotten (once a window, and at the limit)
        self._swept = self._clock()
        self._touched: dict[str, float] = {}
        self._max_verifications = max_verifications
        self._max_waiting = max_waiting
        self._hashing = threading.BoundedSemaphore(max_verifications)
        # argon2 of ``authenticate`` runs on these threads only: each allocates the hash's memory cost,
        # and glibc keeps what a thread freed in that thread's arena, so any thread of a large shared
        # pool would end up holding 64 MiB (RSS grew to about 1 GB under a burst when it did)
        self._hashers = concurrent.futures.ThreadPoolExecutor(max_verifications, thread_name_prefix="argon2")
        self._readers = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="token-store")
        self._waiting = 0
        self._pending: dict[_Key, int] = {}

    def verify(self, token: str, client: str = "") -> Principal | None:
        """The caller behind ``token``, or None (malformed, unknown, wrong secret, revoked, expired,
        throttled). Raises ``StateUnavailable`` if the store cannot be read: the request must fail closed."""
        found = self._lookup(token, client)
        if isinstance(found, _Candidate):
            return self._prove(found, token, client).principal
        return found.principal

    async def verify_async(self, token: str, client: str = "") -> Principal | None:
        """``verify`` for an event loop: the argon2 check of a token not yet seen runs in a thread."""
        return (await self.authenticate(token, client)).principal

    async def authenticate(self, token: str, client: str = "") -> Verdict:
        """The principal behind ``token`` or why not, for an event loop: argon2 runs in a worker thread,
        at most ``max_verifications`` at once; raises ``StateUnavailable`` like ``verify``, also when the
        token store does not answer within ``STORE_SECONDS`` (its reads run off the loop as well)."""
        if parse_token_id(token) is None:
            return self._refuse((client, None), "malformed")
        try:
            reading = self._readers.submit(self._lookup, token, client)
            found = await asyncio.wait_for(asyncio.wrap_future(reading), STORE_SECONDS)
        except TimeoutError:
            raise StateUnavailable(f"the token store did not answer within {STORE_SECONDS:g}s; the request "
                                   "was refused (check the state database's disk and locks)") from None
        if not isinstance(found, _Candidate):
            return found
        key = (client, found.record.token_id)
        with self._lock:
            # checks of this client on this id already under way count as failures to come: a burst
            # on one id queues at most ``max_failures + 1`` checks, the rest are throttled at once
            pending = self._pending.get(key, 0)
            if len(self._failures.get(key, ())) + pending > self._max_failures:
                return Verdict(None, "throttled", self._window)
            if self._waiting >= self._max_waiting:
                return Verdict(None, "busy", 1.0)
            self._waiting += 1
            self._pending[key] = pending + 1
        try:
            return await asyncio.wrap_future(self._hashers.submit(self._prove_unless_throttled, found, token,
                                                                  client))
        finally:
            with self._lock:
                self._waiting -= 1
                left = self._pending.pop(key) - 1
                if left:
                    self._pending[key] = left

    def proven(self, token: str) -> bool:
        """Whether this process has verified ``token`` already (a lookup, no I/O, no argon2): the edge
        lets such a token past the budget of tokens being checked for the first time."""
        token_id = parse_token_id(token)
        if token_id is None:
            return False
        key = hashlib.blake2b(token.encode("utf-8"), key=self._key, digest_size=32).digest()
        with self._lock:
            return self._verified.get(key) == token_id

    def _prove_unless_throttled(self, candidate: _Candidate, token: str, client: str) -> Verdict:
        # failures of the same burst may have landed while this check waited for a thread
        wait = self._throttle_wait((client, candidate.record.token_id))
        if wait is not None:
            return Verdict(None, "throttled", wait)
        return self._prove(candidate, token, client)

    def throttled(self, client: str) -> float | None:
        """Seconds until ``client`` may send a malformed or unknown token again, or None if it may now
        (a token whose id exists is judged by ``authenticate``, per client and id)."""
        return self._throttle_wait((client, None))

    def _throttle_wait(self, key: _Key) -> float | None:
        now = self._clock()
        with self._lock:
            failures = self._failures.get(key)
            if failures is None:
                return None
            while failures and failures[0] <= now - self._window:
                failures.popleft()
            if not failures:  # a key whose failures all aged out is forgotten, not kept empty
                del self._failures[key]
                return None
            if len(failures) <= self._max_failures:
                return None
            return max(failures[0] + self._window - now, 0.001)

    # -- the fast path -------------------------------------------------------------------------

    def _lookup(self, token: str, client: str) -> Verdict | _Candidate:
        token_id = parse_token_id(token)
        if token_id is None:
            return self._refuse((client, None), "malformed")
        self._sync()
        now = self._clock()
        key = hashlib.blake2b(token.encode("utf-8"), key=self._key, digest_size=32).digest()
        with self._lock:
            record = self._records.get(token_id)
            proven = self._verified.get(key) == token_id
        if record is None:
            return self._refuse((client, None), "unknown_token")
        if not record.usable(now):
            return self._refuse((client, token_id), "revoked" if record.revoked else "expired")
        if proven:
            self._touch(record, now)
            return Verdict(Principal(name=record.name, role=record.role, token_id=record.token_id,
                                     kind=record.kind, as_read=record, read_at=time.monotonic()))
        wait = self._throttle_wait((client, token_id))
        if wait is not None:
            return Verdict(None, "throttled", wait)
        return _Candidate(record, key)

    def _refuse(self, key: _Key, reason: str) -> Verdict:
        """Count a failure against ``key``; a key already over its limit answers ``throttled``."""
        wait = self._throttle_wait(key)
        if wait is not None:
            return Verdict(None, "throttled", wait)
        self._fail(key)
        return Verdict(None, reason, token_id=key[1])

    def _sync(self) -> None:
        """Reload the token records if any process changed a token since they were loaded.

        The generation is read before the records, so a change racing the reload bumps it again and
        the next request reloads once more: a change is never missed."""
        generation = self._store.token_generation()
        if generation == self._generation:
            return
        records = {r.token_id: r for r in self._store.list_tokens()}
        with self._lock:
            self._records = records
            self._generation = generation
            self._verified = {k: i for k, i in self._verified.items()
                              if i in records and not records[i].revoked}

    def _prove(self, candidate: _Candidate, token: str, client: str) -> Verdict:
        """The slow path: argon2 against the stored hash (at most ``max_verifications`` at once), then
        the fast path once more (so a change made while hashing still applies)."""
        with self._hashing:
            try:
                self._hasher.verify(candidate.record.hash, token)
            except (VerificationError, InvalidHashError):
                return self._refuse((client, candidate.record.token_id), "invalid")
        with self._lock:
            if len(self._verified) >= _CACHE_LIMIT:
                self._verified.clear()
            self._verified[candidate.key] = candidate.record.token_id
        found = self._lookup(token, client)
        return found if isinstance(found, Verdict) else Verdict(None, "invalid")

    def _fail(self, key: _Key) -> None:
        now = self._clock()
        with self._lock:
            # quiet keys go once a window as well as at the limit: the first failure a window after
            # a flood ended forgets the flood's entries
            if key not in self._failures and (len(self._failures) >= _CLIENT_LIMIT
                                              or now - self._swept >= self._window):
                self._forget_quiet_clients(now)
                self._swept = now
            failures = self._failures.setdefault(key, deque(maxlen=self._max_failures + 1))
            failures.append(now)

    def _forget_quiet_clients(self, now: float) -> None:
        quiet = [k for k, f in self._failures.items() if not f or f[-1] <= now - self._window]
        for c in quiet:
            del self._failures[c]
        while len(self._failures) >= _CLIENT_LIMIT:
            del self._failures[next(iter(self._failures))]

    def _touch(self, record: TokenRecord, now: float) -> None:
        """Record last use at most once per ``touch_interval`` per token; a failure only logs."""
        with self._lock:
            if now - self._touched.get(record.token_id, float("-inf")) < self._touch_interval:
                return
            self._touched[record.token_id] = now
        try:
            self._store.touch_token(record.token_id, now)
        except StateUnavailable:
            log.warning("could not record the last use of token %r; it stays authenticated", record.name)


#: the name the design notes use; the mcp SDK has an unrelated ``TokenVerifier`` protocol
TokenVerifier = TokenAuthenticator
