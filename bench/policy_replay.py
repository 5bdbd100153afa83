"""``gateway policy test`` on a large audit log: the time to replay 100,000 recorded rows through the rules
in force and a candidate.

    python bench/policy_replay.py [--rows 100000] [--repeat 3] [--dir DIR]

Writes ``--rows`` rows with the real audit sink (chained and bounded, as the gateway writes them; not
flushed per row) in the shapes a busy gateway leaves: reads, power changes as intent and outcome rows,
destructive calls as proposals with their objects and moves, rate-limited refusals, configuration
loads. Then times, median of ``--repeat`` runs: reading the rows back (``FileAuditReader.rows``), the
pure replay (``gateway.guard.policy.replay.replay``) of those rows through a rules file with object
rules and a maintenance window and a candidate adding a deny rule, and the whole command
(``gateway policy test --json``, in this process, its output discarded). Prints each time, wall
clock and this process's CPU, and the calls replayed per second of CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from gateway.audit.file_sink import AuditSink
from gateway.audit.readers import FileAuditReader
from gateway.cli import main as gateway
from gateway.cli.policy import world_of
from gateway.guard.policy.replay import replay
from gateway.guard.policy.store import PolicyStore
from gateway.settings import Settings

TARGETS = ("prod-vc1", "prod-vc2", "lab-vc", "dr-vc")
CALLERS = tuple(f"agent-{i:02d}" for i in range(20))
SECTIONS = {"defaults": {}, "protected": [], "rules": [], "targets": {}, "maintenance_windows": []}
CURRENT = {
    **SECTIONS,
    "defaults": {"read": "allow", "write": "allow", "destructive": "require_approval"},
    "protected": [{"name": "crown", "vm_patterns": ["prod-db-*"]}],
    "rules": [{"name": "prod-deletes", "action": "require_approval", "approvals_required": 2,
               "match": {"tools": ["delete_vm"], "target_tags": ["env:prod"], "vm_patterns": ["prod-*"]}},
              {"name": "lab-free", "action": "allow", "match": {"targets": ["lab-*"]}}],
    "maintenance_windows": [{"name": "nights", "start": "22:00", "end": "06:00", "risk_levels": ["critical"],
                             "targets": ["prod-*"]}],
}
CANDIDATE = {**CURRENT, "rules": [{"name": "no-power-off", "action": "deny",
                                   "match": {"tools": ["power_off_vm"], "targets": ["prod-*"]}},
                                  *CURRENT["rules"]]}


def _who(i: int) -> dict[str, Any]:
    caller = CALLERS[i % len(CALLERS)]
    return {"caller": caller, "caller_key": f"token:t{i % len(CALLERS):04d}", "kind": "agent",
            "role": "admin", "surface": "https", "client": "bench/1.0", "correlation_id": f"c{i}"}


def shapes(i: int) -> Iterator[dict[str, Any]]:
    """The rows of one round of calls (about ten rows) by one caller on one target."""
    target, who, vm = TARGETS[i % len(TARGETS)], _who(i), f"prod-web-{i % 300}"
    args = {"target": target, "vm": vm}
    yield {"phase": "call", "tool": "list_vms", "risk": "low", "target": target, "args": {"target": target},
           "outcome": "ok", "duration_ms": 12.0, **who}
    yield {"phase": "call", "tool": "get_vm_details", "risk": "low", "target": target, "args": args,
           "outcome": "ok", "duration_ms": 8.0, **who}
    for tool, risk in (("power_on_vm", "medium"), ("power_off_vm", "high")):
        decision = {"allowed": True, "reason": "write calls are allowed", "rule": "defaults"}
        yield {"phase": "executing", "tool": tool, "risk": risk, "target": target, "args": args,
               "decision": decision, **who}
        yield {"phase": "executed", "tool": tool, "risk": risk, "target": target, "args": args,
               "decision": decision, "outcome": "ok", "duration_ms": 800.0, **who}
    affected = [{"type": "vm", "name": vm, "moid": f"vm-{i % 300}", "folder": "vm",
                 "resource_pool": "Resources"}]
    yield {"phase": "proposed", "tool": "delete_vm", "risk": "critical", "target": target, "args": args,
           "proposal_id": f"p{i}", "affected": affected,
           "decision": {"allowed": True, "require_approval": True, "rule": "rule:prod-deletes"}, **who}
    yield {"phase": "approval", "tool": "delete_vm", "target": target, "proposal_id": f"p{i}",
           "caller": "alice", "kind": "person", "role": "admin"}
    yield {"phase": "denied", "tool": "create_snapshot", "risk": "low", "target": target, "args": args,
           "error_code": "rate_limited", **who}
    if i % 50 == 0:
        yield {"phase": "config_reload", "file": "rules", "status": "loaded", "caller": "gateway"}


def write_log(path: Path, rows: int) -> int:
    written = 0
    with AuditSink(path, durable=False, max_bytes=10 * 1024 ** 3) as sink:
        i = 0
        while written < rows:
            for row in shapes(i):
                if written >= rows:
                    break
                sink.write(row)
                written += 1
            i += 1
    return written


def home(tmp: Path, rows: int) -> Path:
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"targets": [
        {"name": t, "host": f"{t}.example", "credential_env_prefix": "VC", "insecure": True,
         "tags": ["env:prod"] if t.startswith("prod") else []} for t in TARGETS]}))
    (tmp / "rules.yaml").write_text(yaml.safe_dump(CURRENT))
    (tmp / "candidate.yaml").write_text(yaml.safe_dump(CANDIDATE))
    write_log(tmp / "audit.jsonl", rows)
    return tmp


def timed(work: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Median wall-clock and CPU seconds (this process) of ``repeat`` runs of ``work``, and its last
    result (the CPU time says what a run costs when other work shares the machine)."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        result = work()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def command(tmp: Path) -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        return gateway(["policy", "test", "--home", str(tmp), "--rules", str(tmp / "candidate.yaml"),
                     "--since", "30d", "--json"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the log is written (default: temp)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as raw:
        tmp = home(Path(raw), args.rows)
        size = (tmp / "audit.jsonl").stat().st_size
        reading, reading_cpu, rows = timed(lambda: FileAuditReader(tmp / "audit.jsonl").rows(), args.repeat)
        settings = Settings.from_env({"GATEWAY_HOME": str(tmp)})
        world, _targets, _warnings = world_of(settings)
        current, candidate = (PolicyStore(tmp / name).current() for name in ("rules.yaml", "candidate.yaml"))
        replaying, replaying_cpu, report = timed(lambda: replay(rows, current, candidate, world), args.repeat)
        whole, whole_cpu, code = timed(lambda: command(tmp), args.repeat)
    summary = report.to_dict()
    print(f"{len(rows):,} rows ({size / 1e6:.1f} MB): {summary['calls']:,} calls replayed, "
          f"{summary['changed']:,} changed, {summary['not_replayed']:,} not replayed, "
          f"{sum(summary['rows_without_a_call'].values()):,} rows without a call; command exit {code}")
    for what, wall, cpu in (("reading the audit file", reading, reading_cpu),
                            ("replay, two rules files", replaying, replaying_cpu),
                            ("the whole command", whole, whole_cpu)):
        print(f"policy test, {len(rows):,} recorded rows: {what:24s} {wall:7.2f} s ({cpu:.2f} s CPU)")
    print(f"replay: {summary['calls'] / replaying_cpu:,.0f} calls/s of CPU")
    print(json.dumps({"rows": len(rows), "read_s": round(reading, 3), "replay_s": round(replaying, 3),
                      "command_s": round(whole, 3), "read_cpu_s": round(reading_cpu, 3),
                      "replay_cpu_s": round(replaying_cpu, 3), "command_cpu_s": round(whole_cpu, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
