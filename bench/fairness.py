"""Fair queueing on a slowed target: agent B's call alone against behind agent A's burst, fair and FIFO.

Plain script: ``python bench/fairness.py [--rounds 5] [--burst 24] [--delay-ms 120] [--jitter 0 0.25]
[--fleet-only]``; ``make bench`` runs it as one section of bench/run_all.py.

One simulator with every SOAP call slowed by ``--delay-ms`` (its control endpoint's ``/delay``), one
target with ``pool_size: 2`` and ``mirror: off`` (every read goes to the target), and the gateway's
whole pipeline in this process (``Calls.call``: the gate, the read, the scheduler, the audit). Each
round, for each ``--jitter`` in turn (the spread of every delay, as a fraction: 0 is the issue's
condition, "every call slowed to 120 ms", fixed; 0.25 the simulator's normal spread, as a real
target's calls vary), side by side:

- **fair**: A (``agent-a``) queues a burst of ``--burst`` get_vm_details at once; as soon as it is in
  the lane, B (``agent-b``) makes the same call again and again, one at a time, each after a random
  pause of up to one call time (an agent of its own, whose calls come at any moment of A's), until
  A's burst is done;
- **back to back**: the same with no pause (B always asks right after its call's slot went to A);
- **starts not spread**: the first, with the lane's stagger off (``Lane.spread_starts``: a freed slot
  goes to the next waiter at once even when that starts it together with the other slot; what the
  lane did before): at fixed delays A's two calls stay in lock step and B waits half a call on average;
- **strict FIFO**: the first, but A and B call as one principal, so the lane holds one caller's queue
  and serves it in arrival order (what every call got before per-caller queues);
- **ten agents for one person**: the first, but the burst comes from ten agents acting for one person
  (IdP clients with that person's subject, ``--burst`` calls between them), once with their role's
  ``fair_share: person`` (one share for the ten) and once with ``fair_share: caller`` (ten shares, what
  a holder of ten tokens got): B's wait with and without it (``--fleet-only``: just these two arms).

Reported per jitter: B alone (median of sequential calls), B's median behind the burst in each arm and
its ratio to alone (target <= 1.5x fair), and the calls finished per second during the burst, fair
(with and without the stagger) against FIFO (target >= 0.95x).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a plain script from a checkout: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.auth.principal import CallerKey
from gateway.auth.tokens import Principal
from gateway.dev.simulators import SimulatorProcess, build_simulator, start_simulator, write_targets
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.vocabulary import Kind
from gateway.vsphere.lane import Lane

VM = "DC0_C0_RP0_VM0"
READ = {"target": "vc1", "vm": VM}
Row = tuple[str, str, str]
_RANDOM = random.Random(19)  # B's pauses: the same every run
_ISSUER = "https://idp.bench.example"
#: the ten agents' roles: the same rights, one share for the ten or one each
_FLEET_ROLES = "".join(
    f"  {name}:\n    tools: read\n    allow_write: []\n    allow_destructive: []\n    targets: \"*\"\n"
    f"    approve: none\n    fair_share: {share}\n" for name, share in (("fleet", "person"),
                                                                         ("fleet-apart", "caller")))


def fleet(role: str, count: int = 10) -> list[Principal]:
    """``count`` agents acting for one person (IdP clients carrying her subject) with ``role``."""
    person = CallerKey.person(_ISSUER, "alice")
    return [Principal(f"alice/agent-{n}", role, surface="bench", kind=Kind.AGENT, acting_for="alice",
                      key=CallerKey.client(_ISSUER, f"agent-{n}", for_subject="alice"),
                      acting_for_key=person) for n in range(count)]


def _gateway(sim: SimulatorProcess, tmp: Path) -> Gateway:
    env = write_targets(tmp / "targets.yaml", {"vc1": sim}, {"vc1": {"pool_size": 2, "mirror": "off"}})
    home = tmp / "home"
    home.mkdir(mode=0o700)
    (home / "roles.yaml").write_text(f"roles:\n{_FLEET_ROLES}")
    (home / "roles.yaml").chmod(0o600)
    return Gateway.build(Settings.from_env(env, home=str(home), targets=str(tmp / "targets.yaml")))


async def _timed(gw: Gateway, who: Principal) -> float:
    started = time.perf_counter()
    await gw.calls.call(who, "get_vm_details", READ)
    return time.perf_counter() - started


async def _round(gw: Gateway, a: Principal | list[Principal], b: Principal, burst: int,
                 think: float) -> tuple[list[float], float]:
    """A's burst (a list: its callers in turn) with B calling behind it (each call after a random pause
    of up to ``think`` seconds: B is an agent of its own, whose calls come at any moment of A's; 0: back
    to back), B's latencies, and calls finished per second from the burst's start until its last call
    finished."""
    started = time.perf_counter()
    callers = a if isinstance(a, list) else [a]
    calls = [asyncio.create_task(gw.calls.call(callers[n % len(callers)], "get_vm_details", READ))
             for n in range(burst)]
    while gw.scheduler.stats()["vc1"]["queued"] < burst - 4:  # the burst is in the lane
        await asyncio.sleep(0.002)
    b_times: list[float] = []
    while not all(c.done() for c in calls):
        await asyncio.sleep(_RANDOM.uniform(0, think))
        if all(c.done() for c in calls):
            break
        b_times.append(await _timed(gw, b))
    await asyncio.gather(*calls)
    elapsed = time.perf_counter() - started
    return b_times, (burst + len(b_times)) / elapsed


def _staggered(gw: Gateway) -> int:
    """Starts the lane has moved apart so far (``Lane.snapshot``)."""
    return int(gw.scheduler.queue_stats()["vc1"]["staggered"])


async def _fleet_arms(gw: Gateway, b: Principal, burst: int, alone: float,
                      got: dict[str, list[float]]) -> None:
    """One round of the ten agents' arms, one share and ten (appended to ``got``)."""
    times, _rate = await _round(gw, fleet("fleet"), b, burst, alone)
    got["fleet_person"] += times
    times, _rate = await _round(gw, fleet("fleet-apart"), b, burst, alone)
    got["fleet_caller"] += times


async def _arms(gw: Gateway, a: Principal, b: Principal, one: Principal, burst: int, alone: float,
                got: dict[str, list[float]], *, fleet_only: bool = False) -> None:
    """One round of every arm (appended to ``got``)."""
    await _fleet_arms(gw, b, burst, alone, got)
    if fleet_only:
        return
    spread = _staggered(gw)
    times, rate = await _round(gw, a, b, burst, alone)
    got["fair"] += times
    got["fair_rate"].append(rate)
    got["fair_spread"].append((_staggered(gw) - spread) / (burst + len(times)))
    times, _rate = await _round(gw, a, b, burst, 0.0)
    got["tight"] += times
    Lane.spread_starts = False
    try:
        times, rate = await _round(gw, a, b, burst, alone)
    finally:
        Lane.spread_starts = True
    got["unspread"] += times
    got["unspread_rate"].append(rate)
    times, rate = await _round(gw, one, one, burst, alone)
    got["fifo"] += times
    got["fifo_rate"].append(rate)


async def measure(gw: Gateway, sim: SimulatorProcess, *, rounds: int, burst: int, delay_ms: int,
                  jitters: tuple[float, ...], fleet_only: bool = False) -> dict[float, dict[str, float]]:
    """Per jitter: B alone and the medians of every arm."""
    a, b, one = (Principal(n, "admin", surface="bench") for n in ("agent-a", "agent-b", "agent"))
    await asyncio.gather(*(gw.calls.call(a, "get_vm_details", READ) for _ in range(2)))  # two sessions open
    alone: dict[float, float] = {}
    for jitter in jitters:
        sim.control("/delay", {"delay": delay_ms, "jitter": jitter})
        alone[jitter] = statistics.median([await _timed(gw, b) for _ in range(max(5, rounds * 2))])
    arms = ("fleet_person", "fleet_caller") + (() if fleet_only else (
        "fair", "fair_rate", "fair_spread", "tight", "unspread", "unspread_rate", "fifo", "fifo_rate"))
    got: dict[float, dict[str, list[float]]] = {j: {k: [] for k in arms} for j in jitters}
    for _ in range(rounds):  # the conditions and arms alternate, so drift on a shared machine hits them alike
        for jitter in jitters:
            sim.control("/delay", {"delay": delay_ms, "jitter": jitter})
            await _arms(gw, a, b, one, burst, alone[jitter], got[jitter], fleet_only=fleet_only)
    return {j: {"alone": alone[j], **{k: statistics.median(v) for k, v in got[j].items()}} for j in jitters}


def _rows(burst: int, delay_ms: int, jitter: float, got: dict[str, float]) -> list[Row]:
    where = f"{delay_ms} ms per SOAP call " + ("fixed" if jitter == 0 else f"+-{jitter:g} sd")
    alone = got["alone"]
    behind = f"B behind A's burst of {burst}"
    fleet_behind = f"B behind {burst} calls of ten agents acting for one person"
    rows: list[Row] = [
        (f"fairness [{where}]: B's get_vm_details alone (pool_size 2)", f"{alone * 1000:.1f} ms", "1.00x"),
        (f"fairness [{where}]: {fleet_behind}, fair_share: person (one share)",
         f"{got['fleet_person'] * 1000:.1f} ms", f"{got['fleet_person'] / alone:.2f}x"),
        (f"fairness [{where}]: {fleet_behind}, fair_share: caller (ten shares)",
         f"{got['fleet_caller'] * 1000:.1f} ms", f"{got['fleet_caller'] / alone:.2f}x"),
    ]
    if "fair" not in got:  # --fleet-only
        return rows
    return [
        *rows,
        (f"fairness [{where}]: {behind}, per-caller queues (target <= 1.5x)",
         f"{got['fair'] * 1000:.1f} ms", f"{got['fair'] / alone:.2f}x"),
        (f"fairness [{where}]: {behind}, per-caller queues, B's calls back to back",
         f"{got['tight'] * 1000:.1f} ms", f"{got['tight'] / alone:.2f}x"),
        (f"fairness [{where}]: {behind}, per-caller queues, starts not spread",
         f"{got['unspread'] * 1000:.1f} ms", f"{got['unspread'] / alone:.2f}x"),
        (f"fairness [{where}]: {behind}, strict FIFO (one caller's queue)",
         f"{got['fifo'] * 1000:.1f} ms", f"{got['fifo'] / alone:.2f}x"),
        (f"fairness [{where}]: calls/s during the burst, per-caller queues vs strict FIFO (target >= 0.95x)",
         f"{got['fair_rate']:.2f}/s", f"{got['fair_rate'] / got['fifo_rate']:.2f}x"),
        (f"fairness [{where}]: calls/s during the burst, per-caller queues, starts not spread, vs FIFO",
         f"{got['unspread_rate']:.2f}/s", f"{got['unspread_rate'] / got['fifo_rate']:.2f}x"),
        (f"fairness [{where}]: starts moved apart, per-caller queues (of the calls in a burst)",
         f"{got['fair_spread'] * 100:.1f}%", ""),
    ]


def run(*, rounds: int = 5, burst: int = 24, delay_ms: int = 120,
        jitters: tuple[float, ...] = (0.0, 0.25), fleet_only: bool = False) -> list[Row]:
    """The rows for bench/run_all.py: (what, value, ratio), the conditions side by side."""
    sim = start_simulator(binary=build_simulator(), vms=2)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fair-") as tmp:
            gw = _gateway(sim, Path(tmp))

            async def main() -> dict[float, dict[str, float]]:
                try:
                    return await measure(gw, sim, rounds=rounds, burst=burst, delay_ms=delay_ms,
                                         jitters=jitters, fleet_only=fleet_only)
                finally:
                    await gw.close()

            got = asyncio.run(main())
    finally:
        sim.stop()
    return [row for jitter in jitters for row in _rows(burst, delay_ms, jitter, got[jitter])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="bursts per arm (medians over them)")
    parser.add_argument("--burst", type=int, default=24, help="calls in A's burst")
    parser.add_argument("--delay-ms", type=int, default=120, help="milliseconds added to every SOAP call")
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.0, 0.25],
                        help="spreads of each delay, as fractions (0: fixed, the issue's condition; 0.25: "
                             "the simulator's normal jitter), measured side by side")
    parser.add_argument("--fleet-only", action="store_true",
                        help="only B alone and the ten agents' arms (fair_share: person and caller)")
    args = parser.parse_args(argv)
    for what, value, ratio in run(rounds=args.rounds, burst=args.burst, delay_ms=args.delay_ms,
                                  jitters=tuple(args.jitter), fleet_only=args.fleet_only):
        print(f"  {what:<100} {value:>12} {ratio:>8}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
