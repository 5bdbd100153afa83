"""Memory under floods of bad tokens: every per-address and per-token structure the flood touches stays
within its bound, the flood's state is gone once its refusals are audited, and the heap trimmer gives
a burst's freed memory back (counted in trims, never in RSS)."""

from __future__ import annotations

import asyncio
import gc
import secrets
import string
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from support.httpserver import Served, build_gateway, serve
from support.simulator import Simulator, wait_until

from gateway.auth import tokens
from gateway.server.edge.gc_tuning import MMAP_THRESHOLD_BYTES, Trimmer, fix_mmap_threshold, glibc

MIB = 1 << 20


class Heap:
    """Free bytes set by hand, and the trims asked for."""

    def __init__(self) -> None:
        self.free = 0
        self.trimmed = 0

    def trim(self) -> None:
        self.trimmed += 1


@pytest.mark.parametrize(("readings", "trims"), [
    ([0, 8 * MIB, 15 * MIB], 0),            # below the threshold above the floor
    ([0, 16 * MIB], 1),                      # a burst's worth freed: trim
    ([20 * MIB, 4 * MIB, 19 * MIB], 0),      # the floor follows the lowest reading
    ([20 * MIB, 4 * MIB, 21 * MIB], 1),
    ([0, 16 * MIB, 16 * MIB, 16 * MIB], 1),  # a trim leaves the free bytes counted: the new floor
    ([0, 16 * MIB, 32 * MIB], 2),            # a second burst trims again
])
def test_the_trimmer_trims_once_per_burst_of_freed_memory(readings: list[int], trims: int) -> None:
    heap = Heap()
    trimmer = Trimmer(lambda: heap.free, heap.trim, threshold=16 * MIB)
    for free in readings:
        heap.free = free
        trimmer.check()
    assert (heap.trimmed, trimmer.trims) == (trims, trims)


def test_the_trimmer_runs_on_this_c_library_and_gives_a_freed_burst_back() -> None:
    trimmer = Trimmer.for_glibc(threshold=16 * MIB)
    assert trimmer is not None, "glibc's mallinfo2 and malloc_trim were not found"
    trimmer.check()
    burst = [bytearray(4096) for _ in range(12_000)]  # about 48 MiB in blocks below mmap's threshold
    keep = burst[::500]                                # a few survivors pin the heap's top
    del burst
    gc.collect()
    assert trimmer.check(), f"no trim with {trimmer.free_bytes} free bytes over a floor of {trimmer.floor}"
    assert not trimmer.check(), "a second check without new garbage must not trim again"
    assert keep


# ---------------------------------------------------------------- a flood over HTTPS, counted per structure

ALPHABET = string.ascii_lowercase + string.digits


def made_up() -> str:
    return ("gwt_" + "".join(secrets.choice(ALPHABET) for _ in range(12)) + "_"
            + "".join(secrets.choice(ALPHABET) for _ in range(43)))


@pytest.fixture
def served(sim_vc1: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setattr(tokens, "_CLIENT_LIMIT", 16)
    running = serve(tmp_path, build_gateway(tmp_path, sim_vc1), edge={"refusal_audit_seconds": 0.2})
    running.app.state.refusals.max_sources = 8
    yield running
    running.stop()
    anyio.run(running.gateway.close)


async def flood(served: Served, addresses: int, per_address: int, concurrency: int) -> dict[int, int]:
    """``per_address`` made-up tokens from each of ``addresses`` loopback addresses (127.0.0.2...),
    ``concurrency`` requests at once."""
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(http: httpx2.AsyncClient) -> None:
        async with gate:
            answer = await http.get("/metrics", headers={"Authorization": f"Bearer {made_up()}"})
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

    clients = [httpx2.AsyncClient(base_url=served.base, timeout=60, transport=httpx2.AsyncHTTPTransport(
        verify=served.tls(), local_address=f"127.0.0.{n + 2}")) for n in range(addresses)]
    try:
        await asyncio.gather(*(one(http) for http in clients for _ in range(per_address)))
    finally:
        for http in clients:
            await http.aclose()
    return statuses


def test_a_flood_of_made_up_tokens_from_many_addresses_keeps_every_structure_bounded(served: Served) -> None:
    authenticator = served.gateway.authenticator
    refusals = served.app.state.refusals
    threads = threading.active_count()
    statuses = anyio.run(flood, served, 40, 15, 100)
    assert sum(statuses.values()) == 600 and set(statuses) <= {401, 429, 503}, statuses
    # per (address, token id): at most the limit, each address's failures at most max_failures + 1
    assert len(authenticator._failures) <= 16, len(authenticator._failures)
    assert all(len(times) <= authenticator._max_failures + 1 for times in authenticator._failures.values())
    assert authenticator._pending == {} and authenticator._waiting == 0
    assert len(authenticator._verified) == 0 and len(authenticator._touched) == 0
    # refusals per (source, reason): at most max_sources plus one "*" key per reason, then flushed
    assert len(refusals._counts) <= 8 + 3, refusals._counts
    wait_until(lambda: not refusals._counts and not refusals._token_ids, timeout=30,
               what="the flood's refusals flushed to the audit")
    assert threading.active_count() <= threads + 8, "a flood must not leave threads behind"


def test_a_valid_caller_is_served_after_the_flood_and_nothing_of_it_is_kept(served: Served) -> None:
    authenticator = served.gateway.authenticator
    anyio.run(flood, served, 1, 300, 100)
    assert len(authenticator._failures) == 1, "one address, made-up ids: one entry"

    async def valid() -> int:
        async with served.http(served.tokens["bob"]) as http:
            return (await http.get("/metrics")).status_code

    assert anyio.run(valid) == 200
    assert len(authenticator._verified) == 1 and len(authenticator._failures) == 1
    wait_until(lambda: not served.app.state.refusals._counts, timeout=30, what="refusals flushed")


def test_glibc_takes_the_fixed_mmap_threshold() -> None:
    libc = glibc()
    assert libc is not None, "glibc's malloc functions were not found"
    assert fix_mmap_threshold(libc, MMAP_THRESHOLD_BYTES)
