"""gateway/server/edge/gc_tuning.py: a served gateway's startup heap is frozen out of the collector, and every
collection's pause is counted in /metrics by generation."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx2
from prometheus_client.core import Metric
from support.httpserver import FAST_HASH, https_argv, run_serve, serve_home
from support.simulator import Simulator

from gateway.auth.tokens import create_token
from gateway.server.edge.gc_tuning import PAUSE_BUCKETS, YOUNG_THRESHOLD, GcPauses
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore


class _Clock:
    """A clock the test sets (the pause is the difference between two readings)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


Labels = tuple[tuple[str, str], ...]


def _samples(families: list[Metric], name: str) -> dict[Labels, float]:
    """The samples called ``name``, by their labels (sorted name-value pairs)."""
    return {tuple(sorted(s.labels.items())): s.value for family in families for s in family.samples
            if s.name == name}


def test_each_pause_lands_in_its_generations_bucket_and_sum() -> None:
    clock = _Clock()
    pauses = GcPauses(clock)
    for generation, seconds in ((0, 0.0002), (0, 0.003), (2, 0.04), (2, 2.0)):
        pauses.callback("start", {"generation": generation})
        clock.now += seconds
        pauses.callback("stop", {"generation": generation, "collected": 0})
    families = list(pauses.families())
    buckets = _samples(families, "gateway_gc_pause_seconds_bucket")
    counts = _samples(families, "gateway_gc_pause_seconds_count")
    sums = _samples(families, "gateway_gc_pause_seconds_sum")

    def bucket(generation: int, bound: str) -> float:
        return buckets[(("generation", str(generation)), ("le", bound))]

    assert bucket(0, "0.0005") == 1 and bucket(0, "0.0025") == 1 and bucket(0, "0.005") == 2
    assert bucket(2, "0.025") == 0 and bucket(2, "0.05") == 1 and bucket(2, "1.0") == 1
    assert bucket(2, "+Inf") == 2 and bucket(1, "+Inf") == 0
    assert counts[(("generation", "0"),)] == 2
    assert abs(sums[(("generation", "2"),)] - 2.04) < 1e-9
    assert len([b for b in buckets if b[0] == ("generation", "0")]) == len(PAUSE_BUCKETS) + 1


def test_a_stop_without_its_start_records_nothing() -> None:
    pauses = GcPauses(_Clock())
    pauses.callback("stop", {"generation": 1, "collected": 0})
    counts = _samples(list(pauses.families()), "gateway_gc_pause_seconds_count")
    assert set(counts.values()) == {0}


def test_a_served_gateway_freezes_its_startup_heap_and_reports_its_collections(
    sim_vc1: Simulator, tmp_path: Path,
) -> None:
    home, env = serve_home(tmp_path, {"vc1": sim_vc1})
    with SqliteStore(home / "state.db") as store:
        token, _record = create_token(store, "ops", "admin", expires_in=None, now=time.time(),
                                      hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    try:
        tls = ssl.create_default_context(cafile=str(cert.cert))
        text = httpx2.get(f"{command.base()}/metrics", headers={"Authorization": f"Bearer {token}"},
                          verify=tls, timeout=30).text
    finally:
        code = command.stop()
    assert code == 0, command.output()
    frozen = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("gateway_gc_frozen_objects ")]
    assert frozen and frozen[0] > 50_000, frozen  # modules, pyVmomi's types: tens of thousands of objects
    assert 'gateway_gc_pause_seconds_bucket{generation="0",le="+Inf"}' in text
    assert 'gateway_gc_pause_seconds_bucket{generation="2",le="0.0005"}' in text
    assert f'gateway_gc_threshold{{generation="0"}} {float(YOUNG_THRESHOLD)}' in text, text
