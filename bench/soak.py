"""A bounded soak of the real HTTPS server: valid agents, floods of made-up tokens, MCP sessions opened
and abandoned, approval-page sessions, proposals approved and denied, for ``--minutes`` (default 10);
every minute one row of the server's RSS, open file descriptors, threads, asyncio tasks and the valid
agents' p50/p99, then a verdict: flat, or growing.

Plain script: ``python bench/soak.py [--minutes 10] [--vms 200]``. Loopback only: one simulator, one
`gateway serve --transport https --web` in a throwaway home; both stop with the run. The verdict
compares the last minute's RSS, fds, threads and tasks with the first minute's (after warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(REPO), str(BENCH), str(REPO / "tests")]

import httpx2  # noqa: E402
import yaml  # noqa: E402
from flood import Server, agent, attacker, start_server  # noqa: E402
from support.answers import answer_of  # type: ignore[import-not-found]  # noqa: E402
from support.simulator import build_simulator, start_simulator, write_targets  # type: ignore[import-not-found]  # noqa: E402

TARGET = "prod-vc"
ROLES = """roles:
  agent: {tools: "*", allow_write: [], allow_destructive: [], targets: "*", approve: none}
  lead: {tools: "*", allow_write: [], allow_destructive: [], targets: "*", approve: others}
"""
RULES = {"defaults": {"destructive": "allow", "max_calls_per_minute": {"write": None, "destructive": None}},
         "targets": {"prod-*": {"require_web_approval": True}}, "protected": [], "rules": [],
         "maintenance_windows": []}
#: the server counts its asyncio tasks into this file on SIGUSR2 (see ``TASKS_MAIN``)
TASKS_HOOK = """
import asyncio as _asyncio, os as _os, signal as _signal
def _count_tasks(_sig, _frame):
    path = _os.environ["BENCH_TASKS_FILE"]
    with open(path + ".part", "w") as out:
        out.write(str(len(_asyncio.all_tasks())))
    _os.replace(path + ".part", path)
_signal.signal(_signal.SIGUSR2, _count_tasks)
"""


@dataclass
class Load:
    """What the soak did, and the valid agents' call times of the current minute."""

    times: list[float] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


def tasks_of(server: Server, path: Path) -> int:
    """The server's asyncio tasks (asked by signal, answered through a file)."""
    path.unlink(missing_ok=True)
    server.process.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.is_file():
            return int(path.read_text())
        time.sleep(0.05)
    return -1


async def agents(server: Server, load: Load, until: float, n: int) -> None:
    async def one(k: int) -> None:
        async with agent(server, server.tokens["agent"]) as client:
            for i in itertools.count():
                if time.monotonic() >= until:
                    return
                tool, args = ("list_vms", {"target": TARGET}) if (i + k) % 3 == 0 else ("list_targets", {})
                started = time.perf_counter()
                result = await client.call_tool(tool, args)
                load.times.append(time.perf_counter() - started)
                load.count("agent calls" if not result.is_error else "agent errors")
                await asyncio.sleep(0.1)

    await asyncio.gather(*(one(k) for k in range(n)))


async def floods(server: Server, load: Load, until: float, requests: int, concurrency: int,
                 source: str) -> None:
    await asyncio.sleep(15)
    while time.monotonic() + 30 < until:
        child = attacker(server, requests, concurrency, source)
        out, _ = await asyncio.to_thread(child.communicate)
        load.count("flood requests", sum(json.loads(out).values()))
        await asyncio.sleep(45)


async def abandoned_sessions(server: Server, load: Load, until: float) -> None:
    """MCP sessions initialized and never used again nor closed (their client just goes away)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}}
    headers = {"Authorization": f"Bearer {server.tokens['agent']}",
               "Accept": "application/json, text/event-stream"}
    while time.monotonic() < until:
        async with httpx2.AsyncClient(base_url=server.base, verify=server.tls(), timeout=60) as http:
            answer = await http.post("/mcp", json=body, headers=headers)
            load.count("sessions abandoned" if answer.status_code == 200 else f"session {answer.status_code}")
        await asyncio.sleep(1.0)


async def page_sessions(server: Server, load: Load, until: float) -> None:
    """Sign-ins to the approval page: half sign out, half leave their session behind."""
    origin = {"Origin": server.base}
    for i in itertools.count():
        if time.monotonic() >= until:
            return
        async with httpx2.AsyncClient(base_url=server.base, verify=server.tls(), timeout=60) as http:
            signed = await http.post("/ui/api/sign-in", json={"token": server.tokens["lead"]}, headers=origin)
            if signed.status_code != 200:
                load.count(f"sign-in {signed.status_code}")
            else:
                csrf = signed.json()["csrf"]
                await http.get("/ui/api/proposals")
                load.count("page sessions")
                if i % 2:
                    await http.post("/ui/api/sign-out", headers={**origin, "X-CSRF-Token": csrf})
        await asyncio.sleep(2.0)


async def proposals(server: Server, load: Load, until: float, vms: list[str]) -> None:
    """An agent proposes deleting a VM; the lead approves every other proposal and denies the rest."""
    origin = {"Origin": server.base, "Content-Type": "application/json"}
    async with agent(server, server.tokens["agent"]) as client, \
            httpx2.AsyncClient(base_url=server.base, verify=server.tls(), timeout=120) as page:
        signed = await page.post("/ui/api/sign-in", json={"token": server.tokens["lead"]}, headers=origin)
        csrf = signed.json()["csrf"]
        listed = answer_of(await client.call_tool("list_vms", {"target": TARGET}))
        vms = vms or sorted(row["name"] for row in listed["vms"])
        for i, vm in enumerate(vms):
            if time.monotonic() >= until:
                return
            result = await client.call_tool("delete_vm", {"target": TARGET, "vm": vm, "force_power_off": True,
                                                          "timeout_seconds": 600 + i})
            body = answer_of(result)
            pid = body.get("proposal_id") if isinstance(body, dict) else None
            if result.is_error or not pid:
                load.count("proposal errors")
                if "proposal error" not in load.counts:
                    load.counts["proposal error"] = 0
                    print(f"a proposal failed: {str(body)[:300]}", flush=True)
            else:
                action = "approve" if i % 2 == 0 else "deny"
                decided = await page.post(f"/ui/api/proposals/{pid}/{action}", json={"reason": "soak"},
                                          headers={**origin, "X-CSRF-Token": csrf})
                done = {"approve": "approved", "deny": "denied"}[action]
                load.count(f"proposals {done}" if decided.status_code == 200
                           else f"{action} {decided.status_code}")
            await asyncio.sleep(8.0)


def percentile(times: list[float], q: float) -> float:
    if not times:
        return float("nan")
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def soak(server: Server, minutes: float, vms: list[str], tasks_file: Path
               ) -> tuple[list[dict[str, float]], Load]:
    load = Load()
    until = time.monotonic() + minutes * 60
    work = [asyncio.create_task(c) for c in (
        agents(server, load, until, 3), floods(server, load, until, 2000, 500, "127.0.0.2"),
        abandoned_sessions(server, load, until), page_sessions(server, load, until),
        proposals(server, load, until, vms))]
    table: list[dict[str, float]] = []
    print(f"{'minute':>6} {'RSS MiB':>8} {'fds':>5} {'threads':>7} {'tasks':>6} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'calls':>6}", flush=True)
    for minute in itertools.count(1):
        await asyncio.sleep(max(0.0, min(60.0, until - time.monotonic())))
        times, load.times = load.times, []
        status = server.status()
        row = {"minute": minute, "rss": status["rss_kib"] / 1024, "fds": status["fds"],
               "threads": status["threads"], "tasks": await asyncio.to_thread(tasks_of, server, tasks_file),
               "p50": statistics.median(times) * 1000 if times else float("nan"),
               "p99": percentile(times, 0.99), "calls": len(times)}
        table.append(row)
        print(f"{minute:>6} {row['rss']:>8.1f} {row['fds']:>5.0f} {row['threads']:>7.0f} "
              f"{row['tasks']:>6.0f} {row['p50']:>7.1f} {row['p99']:>7.1f} {row['calls']:>6.0f}", flush=True)
        if time.monotonic() >= until:
            break
    for done in await asyncio.gather(*work, return_exceptions=True):
        if isinstance(done, BaseException):
            load.count(f"load failed: {type(done).__name__}: {done}"[:200])
    return table, load


def verdict(table: list[dict[str, float]]) -> str:
    """flat, or growing with what grew: the last row against the first (the warm-up minute)."""
    if len(table) < 2:
        return "too short to judge (run at least two minutes)"
    first, last = table[0], table[-1]
    grew = []
    if last["rss"] > first["rss"] * 1.10:
        grew.append(f"RSS {first['rss']:.0f} -> {last['rss']:.0f} MiB")
    for what, slack in (("fds", 10), ("threads", 4), ("tasks", 50)):
        if last[what] > first[what] + slack:
            grew.append(f"{what} {first[what]:.0f} -> {last[what]:.0f}")
    return "flat" if not grew else "growing: " + ", ".join(grew)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--vms", type=int, default=200, help="VMs on the simulator (proposals delete some)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp_name:
        tmp = Path(tmp_name)
        sim = start_simulator(binary=build_simulator(), vms=max(1, args.vms // 2))
        try:
            env = write_targets(tmp / "sim-targets.yaml", {TARGET: sim})
            targets_yaml = (tmp / "sim-targets.yaml").read_text()
            tasks_file = tmp / "tasks"
            home_files = {"roles.yaml": ROLES, "rules.yaml": yaml.safe_dump(RULES)}
            server = start_server(tmp, extra_env={**env, "BENCH_TASKS_FILE": str(tasks_file)},
                                  targets_yaml=targets_yaml, extra_argv=("--web", "--enable-destructive"),
                                  roles=(("agent", "agent", "agent"), ("lead", "lead", "person")),
                                  home_files=home_files, preamble=TASKS_HOOK)
            try:
                vms: list[str] = []  # the proposals take the names list_vms gives
                print(f"soak: {args.minutes:g} minutes against {server.base}, {args.vms} VMs", flush=True)
                table, load = asyncio.run(soak(server, args.minutes, vms, tasks_file))
            except BaseException:
                print(server.log.read_text(errors="replace")[-4000:], file=sys.stderr)
                raise
            finally:
                server.stop()
        finally:
            sim.stop()
    print("load: " + ", ".join(f"{what} {n}" for what, n in sorted(load.counts.items())))
    print(f"verdict: {verdict(table)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
