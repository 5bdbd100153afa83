"""Bearer tokens against a real store, on both engines (SQLite file, PostgreSQL server): creation,
verification, caching, revocation and role changes made through another store or process, throttling."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, Literal

import anyio
import psycopg
import pytest
from argon2 import PasswordHasher
from support.postgres import open_store_at

from gateway.auth.tokens import Principal, TokenAuthenticator, create_token, parse_expiry, parse_token_id
from gateway.errors import InvalidArgument
from gateway.store import SqliteStore, StateStore


class CountingHasher(PasswordHasher):
    """Real argon2id with small parameters (fast tests) that counts verifications."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.verifications = 0

    def verify(self, hash: Any, password: Any) -> Literal[True]:
        self.verifications += 1
        return super().verify(hash, password)


class HeldHasher(CountingHasher):
    """``CountingHasher`` whose verifications wait until ``release`` is set (at most 10 s), so a test
    decides when the first checks finish instead of racing them."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def verify(self, hash: Any, password: Any) -> Literal[True]:
        self.release.wait(10)
        return super().verify(hash, password)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def location(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The SQLite file's path or a fresh PostgreSQL database's URL."""
    if engine == "sqlite":
        return str(tmp_path / "home" / "state.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(location: str) -> Iterator[StateStore]:
    with closing(open_store_at(location)) as s:
        yield s


@pytest.fixture
def hasher() -> CountingHasher:
    return CountingHasher()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def auth(store: StateStore, hasher: CountingHasher, clock: Clock) -> TokenAuthenticator:
    return TokenAuthenticator(store, clock=clock, hasher=hasher, max_failures=3, failure_window=60.0)


def make(store: StateStore, name: str = "ci", role: str = "reader", expires_in: float | None = None,
         now: float = 1_000_000.0) -> str:
    token, _ = create_token(store, name, role, expires_in=expires_in, now=now, hasher=PasswordHasher(
        time_cost=1, memory_cost=8, parallelism=1))
    return token


@pytest.mark.parametrize(("text", "seconds"), [
    ("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("3600s", 3600), ("2w", 14 * 86400), (" 1d ", 86400),
])
def test_parse_expiry(text: str, seconds: float) -> None:
    assert parse_expiry(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "1.5h", "10y", "1 d", "01d", "1D", "1e3s"])
def test_parse_expiry_rejects(text: str) -> None:
    with pytest.raises(InvalidArgument, match="30d"):
        parse_expiry(text)


def test_created_token_has_the_documented_format_and_only_a_hash_is_stored(store: StateStore,
                                                                           location: str) -> None:
    token, rec = create_token(store, "ci", "reader", expires_in=3600, now=1000.0)
    assert re.fullmatch(r"gwt_[a-z0-9]{12}_[A-Za-z0-9_-]{43}", token)  # 32 random bytes = 256 bits
    assert parse_token_id(token) == rec.token_id
    assert rec.hash.startswith("$argon2id$")
    assert (rec.name, rec.role, rec.created_at, rec.expires_at) == ("ci", "reader", 1000.0, 4600.0)
    assert not rec.revoked
    assert store.token_by_name("ci") == rec
    secret = token[17:]  # after "gwt_<id>_"
    if location.startswith("postgresql://"):
        with psycopg.connect(location) as conn:
            assert secret not in repr(conn.execute("SELECT * FROM tokens").fetchall())
    else:
        for file in Path(location).parent.iterdir():
            assert secret.encode() not in file.read_bytes(), file
    assert secret not in repr(rec) and rec.hash not in repr(rec)


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 65, "ü", "a/b"])
def test_create_refuses_bad_names(store: StateStore, name: str) -> None:
    with pytest.raises(InvalidArgument, match="name"):
        create_token(store, name, "reader", expires_in=None, now=0.0)


def test_create_refuses_a_nonpositive_lifetime(store: StateStore) -> None:
    with pytest.raises(InvalidArgument, match="expires_in"):
        create_token(store, "ci", "reader", expires_in=0, now=0.0)


def test_verify_returns_the_principal_and_caches(auth: TokenAuthenticator, store: StateStore,
                                                 hasher: CountingHasher) -> None:
    token = make(store)
    rec = store.token_by_name("ci")
    assert rec is not None
    for _ in range(5):
        assert auth.verify(token, "10.0.0.1") == Principal(name="ci", role="reader", token_id=rec.token_id)
    assert hasher.verifications == 1


def test_the_principal_carries_the_record_as_read_for_its_request(auth: TokenAuthenticator,
                                                                   store: StateStore) -> None:
    token = make(store)
    auth.verify(token, "10.0.0.1")  # proven once; the next verify is the cached path the edge takes
    before = time.monotonic()
    principal = auth.verify(token, "10.0.0.1")
    stored = store.token_by_name("ci")
    assert principal is not None and principal.as_read is not None and stored is not None
    read = principal.as_read
    assert (read.token_id, read.role, read.kind, read.revoked) == \
        (stored.token_id, "reader", stored.kind, False)
    assert before <= principal.read_at <= time.monotonic()


@pytest.mark.parametrize("bad", [
    "", "Bearer x", "gwt_", "gwt_abc_def", "gwt_ABCDEFGHIJKL_" + "a" * 43, "gwc_" + "a" * 32,
])
def test_malformed_tokens_are_refused_without_argon2(auth: TokenAuthenticator, store: StateStore,
                                                     hasher: CountingHasher, bad: str) -> None:
    make(store)
    assert auth.verify(bad) is None
    assert hasher.verifications == 0


def test_unknown_id_is_refused_without_argon2(auth: TokenAuthenticator, store: StateStore,
                                              hasher: CountingHasher) -> None:
    token = make(store)
    forged = "gwt_" + "z" * 12 + token[16:]
    assert parse_token_id(forged) == "z" * 12
    assert auth.verify(forged) is None
    assert hasher.verifications == 0


def test_wrong_secret_for_a_known_id_is_refused(auth: TokenAuthenticator, store: StateStore,
                                                hasher: CountingHasher) -> None:
    token = make(store)
    flipped = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert auth.verify(flipped) is None
    assert hasher.verifications == 1
    assert auth.verify(token) is not None


def test_revocation_in_another_store_applies_on_the_next_request(
        auth: TokenAuthenticator, store: StateStore, location: str, hasher: CountingHasher) -> None:
    token = make(store)
    assert auth.verify(token) is not None
    with closing(open_store_at(location)) as other:  # another process's view of the same file
        other.update_token("ci", revoked=True)
    assert auth.verify(token) is None
    assert hasher.verifications == 1


def test_revocation_by_another_process_applies_on_the_next_request(auth: TokenAuthenticator,
                                                                   store: StateStore, location: str) -> None:
    token = make(store)
    assert auth.verify(token) is not None
    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, os.environ["TESTS_DIR"])
        from support.postgres import open_store_at
        store = open_store_at(os.environ["STORE_AT"])  # a URL's password stays off the command line
        store.update_token("ci", revoked=True)
        store.close()
    """)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "STORE_AT": location, "TESTS_DIR": str(root / "tests")}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=env)
    assert auth.verify(token) is None


def test_role_change_applies_on_the_next_request_without_rehashing(auth: TokenAuthenticator,
                                                                   store: StateStore, location: str,
                                                                   hasher: CountingHasher) -> None:
    token = make(store)
    assert auth.verify(token) == Principal("ci", "reader", parse_token_id(token))
    with closing(open_store_at(location)) as other:
        other.update_token("ci", role="admin")
    assert auth.verify(token) == Principal("ci", "admin", parse_token_id(token))
    assert hasher.verifications == 1


def test_a_token_created_after_the_cache_filled_is_found(auth: TokenAuthenticator, store: StateStore,
                                                         location: str) -> None:
    first = make(store, "one")
    assert auth.verify(first) is not None
    with closing(open_store_at(location)) as other:
        second = make(other, "two")
    principal = auth.verify(second)
    assert principal is not None and principal.name == "two"


def test_expiry_is_checked_against_the_clock_on_every_request(auth: TokenAuthenticator, store: StateStore,
                                                              clock: Clock, hasher: CountingHasher) -> None:
    token = make(store, expires_in=60, now=clock.now)
    clock.now += 59
    assert auth.verify(token) is not None
    clock.now += 1
    assert auth.verify(token) is None
    assert hasher.verifications == 1


def test_an_expired_token_is_refused_without_argon2(auth: TokenAuthenticator, store: StateStore,
                                                    clock: Clock, hasher: CountingHasher) -> None:
    token = make(store, expires_in=60, now=clock.now - 120)
    assert auth.verify(token) is None
    assert hasher.verifications == 0


def test_made_up_tokens_throttle_made_up_tokens_from_that_client_only(
    auth: TokenAuthenticator, store: StateStore, clock: Clock, hasher: CountingHasher,
) -> None:
    token = make(store)
    unknown_id = "gwt_" + "z" * 12 + "_" + "A" * 43
    for _ in range(3):
        assert auth.verify("gwt_nonsense", "10.0.0.9") is None
    assert auth.throttled("10.0.0.9") is None  # 3 failures allowed, the 4th throttles
    clock.now += 10
    assert auth.verify(unknown_id, "10.0.0.9") is None
    assert auth.throttled("10.0.0.9") == pytest.approx(50.0)
    assert anyio.run(auth.authenticate, unknown_id, "10.0.0.9").reason == "throttled"
    # a token whose id exists is never refused for the made-up ones (a NAT, a proxy) ...
    assert auth.verify(token, "10.0.0.9") is not None
    # ... and other clients are unaffected
    assert auth.throttled("10.0.0.10") is None
    clock.now += 50
    assert auth.throttled("10.0.0.9") is None


def test_guessing_one_tokens_secret_throttles_that_client_on_that_token(
    auth: TokenAuthenticator, store: StateStore, clock: Clock, hasher: CountingHasher,
) -> None:
    token = make(store)
    other = make(store, "other")
    token_id = parse_token_id(token)
    guess = f"gwt_{token_id}_" + "Q" * 43
    verdicts = [anyio.run(auth.authenticate, guess, "10.0.0.9") for _ in range(5)]
    assert [v.reason for v in verdicts] == ["invalid"] * 4 + ["throttled"]
    assert verdicts[-1].retry_after == pytest.approx(60.0)
    assert hasher.verifications == 4, "a throttled guess costs no argon2"
    # the real token, never proven in this process, waits too from that client on that id ...
    assert auth.verify(token, "10.0.0.9") is None
    # ... but not from another client, nor another token from the same client
    assert auth.verify(token, "10.0.0.10") is not None
    assert auth.verify(other, "10.0.0.9") is not None
    assert auth.throttled("10.0.0.9") is None


def test_argon2_checks_run_at_most_max_verifications_at_once(store: StateStore) -> None:
    class Gate(PasswordHasher):
        """Real argon2id that records the most verifications running at once."""

        def __init__(self) -> None:
            super().__init__(time_cost=1, memory_cost=8, parallelism=1)
            self.lock = threading.Lock()
            self.running = self.most = 0

        def verify(self, hash: Any, password: Any) -> Literal[True]:
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                return super().verify(hash, password)
            finally:
                with self.lock:
                    self.running -= 1

    gate = Gate()
    auth = TokenAuthenticator(store, hasher=gate, max_verifications=2, max_waiting=40, max_failures=100)
    tokens = [make(store, f"t{i}") for i in range(30)]

    async def main() -> list[Principal | None]:
        found: list[Principal | None] = [None] * len(tokens)

        async def one(i: int) -> None:
            found[i] = await auth.verify_async(tokens[i], "10.0.0.1")

        async with anyio.create_task_group() as tg:
            for i in range(len(tokens)):
                tg.start_soon(one, i)
        return found

    found = anyio.run(main)
    assert all(p is not None for p in found)
    assert 1 <= gate.most <= 2


def test_beyond_the_waiting_room_requests_are_refused_as_busy(tmp_path: Path) -> None:
    # the authenticator's queueing, not the store: on SQLite only, whose reads are too quick to
    # reorder the six requests (a network round trip per read could let the first check finish first)
    store = SqliteStore(tmp_path / "state.db")
    hasher = HeldHasher()
    auth = TokenAuthenticator(store, hasher=hasher, max_verifications=1, max_waiting=2)
    tokens = [make(store, f"t{i}") for i in range(6)]

    async def main() -> list[str]:
        reasons: list[str] = [""] * len(tokens)

        async def one(i: int) -> None:
            verdict = await auth.authenticate(tokens[i], "10.0.0.1")
            reasons[i] = "ok" if verdict.principal else verdict.reason
            if reasons.count("busy") == 4:
                hasher.release.set()  # the refusals are in: let the admitted checks finish

        async with anyio.create_task_group() as tg:
            for i in range(len(tokens)):
                tg.start_soon(one, i)
        return reasons

    reasons = anyio.run(main)
    store.close()
    assert sorted(reasons) == ["busy"] * 4 + ["ok"] * 2


def test_last_used_is_recorded_at_most_once_per_interval(auth: TokenAuthenticator, store: StateStore,
                                                         clock: Clock) -> None:
    token = make(store)
    first = clock.now
    auth.verify(token)
    clock.now += 30
    auth.verify(token)
    rec = store.token_by_name("ci")
    assert rec is not None and rec.last_used == first
    clock.now += 31
    auth.verify(token)
    rec = store.token_by_name("ci")
    assert rec is not None and rec.last_used == clock.now


def test_verify_async_hashes_in_a_worker_thread(auth: TokenAuthenticator, store: StateStore,
                                                hasher: CountingHasher) -> None:
    token = make(store)

    async def main() -> tuple[Principal | None, Principal | None, Principal | None]:
        return (await auth.verify_async(token), await auth.verify_async(token),
                await auth.verify_async("gwt_bad"))

    first, second, bad = anyio.run(main)
    assert first is not None and first == second
    assert bad is None
    assert hasher.verifications == 1


def test_default_hasher_is_argon2id(store: StateStore) -> None:
    token, rec = create_token(store, "real", "admin", expires_in=None, now=0.0)
    assert rec.hash.startswith("$argon2id$")
    assert TokenAuthenticator(store).verify(token) == Principal("real", "admin", rec.token_id)


def test_a_revoked_or_expired_token_is_refused_naming_its_id_and_why(
    auth: TokenAuthenticator, store: StateStore, clock: Clock
) -> None:
    revoked = make(store, "ci")
    store.update_token("ci", revoked=True)
    expired = make(store, "old", expires_in=60, now=clock.now - 120)
    for token, reason in ((revoked, "revoked"), (expired, "expired")):
        verdict = anyio.run(auth.authenticate, token, "10.0.0.5")
        assert (verdict.principal, verdict.reason, verdict.token_id) == (None, reason, parse_token_id(token))


def test_a_flood_of_made_up_tokens_leaves_no_state_a_window_later(auth: TokenAuthenticator,
                                                                  clock: Clock) -> None:
    """Failure counts are kept per address for one window: once a flood from many addresses is a window
    old, the next refusal forgets all of it (the table's bound alone would keep it until 10,000 keys)."""
    for n in range(50):
        assert auth.verify("gwt_made_up", f"10.0.{n}.1") is None
    assert len(auth._failures) == 50
    clock.now += 61
    assert auth.verify("gwt_made_up", "10.9.9.9") is None
    assert len(auth._failures) == 1
