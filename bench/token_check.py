"""What a bearer token costs per request: the first verification (argon2id) against the cached one.

Plain script: ``python bench/token_check.py [--iterations N]``. Uses a throwaway SQLite store with the
production hasher settings and prints the cost of each path and the ratio to the first sight.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.auth.tokens import TokenAuthenticator, create_token
from gateway.store import SqliteStore


def _per_call(fn: Callable[[], object], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) / iterations


def _first_sight(store: SqliteStore, token: str, rounds: int) -> float:
    """A fresh authenticator each round: every verification runs argon2id."""
    samples = []
    for _ in range(rounds):
        auth = TokenAuthenticator(store)
        start = time.perf_counter()
        if auth.verify(token) is None:
            raise SystemExit("the benchmark token did not verify")
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000, help="cached verifications to time")
    parser.add_argument("--rounds", type=int, default=5, help="first-sight verifications to time (median)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, SqliteStore(Path(tmp) / "state.db") as store:
        token, rec = create_token(store, "bench", "reader", expires_in=None, now=time.time())
        first = _first_sight(store, token, args.rounds)
        auth = TokenAuthenticator(store)
        auth.verify(token)
        cached = _per_call(lambda: auth.verify(token, "bench"), args.iterations)
        forged = f"gwt_{'z' * 12}_{token[len('gwt_') + 13:]}"  # well-formed, id unknown
        unknown = _per_call(lambda: auth.verify(forged), min(args.iterations, 2_000))
    rows = [("first sight (argon2id verify)", first), ("cached (same token again)", cached),
            ("unknown id (refused, no argon2)", unknown)]
    print(f"{'path':<34}{'per request':>14}{'first / this':>14}")
    for label, seconds in rows:
        print(f"{label:<34}{seconds * 1e6:>11.1f} us{first / seconds:>13.0f}x")
    print(f"cached verification is {first / cached:.0f}x cheaper than the first (token id {rec.token_id})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
