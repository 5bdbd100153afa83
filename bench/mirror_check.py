"""What the mirror's self-check costs: SOAP bytes per minute from the target, against the update stream's.

Plain script: ``python bench/mirror_check.py [--vms 3000] [--seconds 60] [--changes 30] [--reads 60]``.
One simulator with about ``--vms`` VMs; a mirror of it built in this process, reached through a counting
TCP relay (``bench/mirror.py``'s), so every byte the simulator sends the mirror is counted. Two windows
of ``--seconds`` each, the same seeded workload in both: ``--changes`` direct changes a minute (power
toggles and renames of random VMs, made on a session of their own, not counted) and ``--reads``
list_vms answers a minute from the mirror (each with its freshness poll).

stream          the mirror with its self-check switched off in this process (no marker change per poll,
                no comparison rounds, no task reads): the update stream and the freshness polls, i.e. the
                mirror as it was before the self-check
with check      the mirror as shipped (``mirror_check_seconds`` at its default, 300 s)

A full comparison runs once per ``mirror_check_seconds``, so a window shorter than that rarely holds
one: its bytes are measured on their own (one live read of everything mirrored, through the relay)
and added per minute (bytes x 60 / mirror_check_seconds). The windows run one after the other: in
govmomi's simulator only the last session to start listening receives updates.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH), str(REPO / "tests")]

from mirror import CountingRelay  # noqa: E402
from pyVim.connect import Disconnect  # noqa: E402
from pyVmomi import vim  # noqa: E402
from support.simulator import (  # type: ignore[import-not-found]  # noqa: E402
    Simulator,
    build_simulator,
    pyvmomi_connect,
    start_simulator,
    wait_until,
)

from gateway.config import Credentials, Target  # noqa: E402
from gateway.tools.read import MIRROR_READS  # noqa: E402
from gateway.vsphere import mirror_check  # noqa: E402
from gateway.vsphere.mirror import MIRRORED, Mirror, MirrorStats  # noqa: E402
from gateway.vsphere.pool import SessionPool  # noqa: E402


def target_through(relay: CountingRelay, check_seconds: float) -> Target:
    return Target(name="bench", host="127.0.0.1", port=relay.port, insecure=True, timeout_seconds=600,
                  credential_env_prefix="BENCH", mirror_check_seconds=check_seconds)


@contextmanager
def self_check_off(mirror: Mirror) -> Iterator[None]:
    """The mirror without its self-check (this process only): what it did before the check existed."""
    originals = (mirror_check.Marker.change, mirror_check.finished_tasks, mirror_check.Marker.filter_spec)

    def no_change(marker: mirror_check.Marker) -> None:
        marker.outstanding = False

    def marker_only(marker: mirror_check.Marker, task_manager: Any, mirrored: Any) -> Any:  # no task list
        pc = mirror_check.PC
        return pc.FilterSpec(objectSet=[pc.ObjectSpec(obj=marker.view, skip=False), *mirrored.objectSet],
                             propSet=[pc.PropertySpec(type=vim.view.ListView, pathSet=["view"]),
                                      *mirrored.propSet])

    def no_round(session: Any, kind: mirror_check.Kind) -> None:
        mirror._schedule.done(kind, time.monotonic())

    mirror_check.Marker.change = no_change  # type: ignore[method-assign]
    mirror_check.Marker.filter_spec = marker_only  # type: ignore[method-assign]
    mirror_check.finished_tasks = lambda session, tasks: ({}, set())
    mirror._check = no_round  # type: ignore[method-assign]
    mirror._resync_wanted = True  # a new filter set without the task list
    try:
        yield
    finally:
        (mirror_check.Marker.change, mirror_check.finished_tasks,
         mirror_check.Marker.filter_spec) = originals  # type: ignore[method-assign]
        del mirror._check


def workload(sim: Simulator, seconds: float, changes: int, seed: int, stop: threading.Event) -> int:
    """``changes`` direct changes a minute for ``seconds`` on random VMs; returns how many were made."""
    si = pyvmomi_connect(sim)
    try:
        view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
        vms = list(view.view)
        view.DestroyView()
        rng = random.Random(seed)
        made, started = 0, time.monotonic()
        while not stop.is_set() and time.monotonic() - started < seconds:
            vm = rng.choice(vms)
            if rng.random() < 0.5:
                power = vm.runtime.powerState
                task = vm.PowerOffVM_Task() if power == "poweredOn" else vm.PowerOnVM_Task()
            else:
                task = vm.Rename_Task(f"bench-{made}")
            wait_until(lambda task=task: task.info.state in ("success", "error"), timeout=60)
            made += 1
            stop.wait(max(0.0, started + made * 60 / changes - time.monotonic()))
        return made
    finally:
        Disconnect(si)


def window(sim: Simulator, relay: CountingRelay, mirror: Mirror, seconds: float, changes: int,
           reads: int, seed: int) -> tuple[float, int, int, float]:
    """(bytes per minute the simulator sent the mirror, changes made, reads answered by the mirror,
    their median seconds)."""
    stop = threading.Event()
    made: list[int] = []
    worker = threading.Thread(target=lambda: made.append(workload(sim, seconds, changes, seed, stop)))
    relay.take()
    started = time.monotonic()
    worker.start()
    answered = 0
    latencies: list[float] = []
    read = MIRROR_READS["list_vms"]
    while time.monotonic() - started < seconds:
        asked = time.perf_counter()
        if mirror.answer(read, {"target": "bench"}, None) is not None:
            answered += 1
            latencies.append(time.perf_counter() - asked)
        time.sleep(max(0.0, started + (answered + 1) * 60 / reads - time.monotonic()))
    stop.set()
    worker.join()
    elapsed = time.monotonic() - started
    median = statistics.median(latencies or [0.0])
    return relay.take() * 60 / elapsed, made[0] if made else 0, answered, median


def full_round_bytes(sim: Simulator, relay: CountingRelay) -> tuple[int, int]:
    """(bytes of one full comparison's live read through the relay, objects read)."""
    target = target_through(relay, 300)
    pool = SessionPool(target, Credentials(sim.user, sim.password))
    try:
        def read(session: Any) -> int:
            content: Any = session.content
            view = content.viewManager.CreateContainerView(content.rootFolder, list(MIRRORED), True)
            try:
                relay.take()
                count = len(mirror_check.read_view(session, view, MIRRORED))
                return count
            finally:
                view.DestroyView()

        objects = pool.run(read)
        return relay.take(), objects
    finally:
        pool.close()


def synced_mirror(sim: Simulator, relay: CountingRelay) -> Mirror:
    mirror = Mirror(target_through(relay, 300), SessionPool(target_through(relay, 300),
                                                             Credentials(sim.user, sim.password)))
    mirror.start()
    wait_until(lambda: mirror.ready, timeout=3600, interval=0.2, what="mirror synced")
    return mirror


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--changes", type=int, default=30, help="direct changes per minute")
    parser.add_argument("--reads", type=int, default=60, help="list_vms answers per minute")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    sim = start_simulator(binary=build_simulator(), hosts_per_cluster=3, standalone_hosts=1,
                          vms=max(1, args.vms // 2), startup_timeout=3600)
    relay = CountingRelay(sim.port)
    try:
        print(f"{args.vms} VMs: simulator up in {time.perf_counter() - started:.0f}s", flush=True)
        full_bytes, objects = full_round_bytes(sim, relay)
        rows: dict[str, tuple[float, int, int, float]] = {}
        stats: MirrorStats | None = None
        for label in ("stream", "with check"):
            mirror = synced_mirror(sim, relay)
            try:
                if label == "stream":
                    with self_check_off(mirror):
                        wait_until(lambda m=mirror: m.ready and not m._resync_wanted, timeout=3600,
                                   interval=0.2, what="resynced without the task list")
                        rows[label] = window(sim, relay, mirror, args.seconds, args.changes, args.reads, 23)
                else:
                    rows[label] = window(sim, relay, mirror, args.seconds, args.changes, args.reads, 23)
                    stats = mirror.stats()
            finally:
                mirror.close()
            print(f"{label}: {rows[label][0] / 1e3:,.1f} kB/min ({rows[label][1]} changes, "
                  f"{rows[label][2]} mirror answers, median {rows[label][3] * 1000:,.0f} ms)", flush=True)
        stream = rows["stream"][0]
        rolling = rows["with check"][0] - stream
        full = full_bytes * 60 / 300
        check = rolling + full
        print(f"\n{datetime.now():%Y-%m-%d %H:%M} `python bench/mirror_check.py "
              f"{' '.join(argv or sys.argv[1:])}`: {objects:,} objects mirrored, {args.changes} changes "
              f"and {args.reads} reads a minute; self-check rounds {stats.checks if stats else {}}, "
              f"divergences {stats.divergences if stats else 0}\n")
        print("| what | SOAP bytes/min from the target | ratio to the stream |\n| --- | --- | --- |")
        for what, value in (
                ("update stream and freshness polls (self-check off)", stream),
                ("self-check: marker changes, task reads, rolling rounds (measured window)", rolling),
                (f"self-check: full comparison, one {full_bytes / 1e6:,.2f} MB read every 300 s", full),
                ("self-check total", check),
                ("mirror with its self-check, total", stream + check)):
            print(f"| {what} | {value / 1e3:,.1f} kB | {value / stream:.2f}x |")
        return 0
    finally:
        relay.close()
        sim.stop()


if __name__ == "__main__":
    raise SystemExit(main())
