"""Audit appends per second: durable (flushed to disk per row) against not, in one process and in two;
and changes per second with the intent row (the audit-before-action rule) against one row per change.

    python bench/audit_append.py [--rows 2000] [--dir DIR]

Runs side by side in one invocation and prints each rate and the ratios. The two-process runs start
both appenders together on one file and verify the chain afterwards. The intent pattern writes two
durable rows per change (``executing`` before the vSphere call, then the outcome) where today's
pattern writes one (the outcome); both are measured in the same run, alternating, and the ratio of
their change rates is printed. ``--dir`` decides the filesystem measured (the default is the system
temp directory; a tmpfs there makes flushing free).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.audit.file_sink import AuditSink
from gateway.audit.verify import verify

EVENT = {
    "phase": "call", "tool": "get_vm_details", "target": "prod-vc1", "caller": "ops-agent", "role": "reader",
    "surface": "https", "correlation_id": "9f1c2a7e", "args": {"target": "prod-vc1", "vm": "web-1"},
    "decision": {"allowed": True, "reason": "read", "rule": "role:reader"}, "outcome": "ok",
    "duration_ms": 41.7, "result": {"name": "web-1", "power_state": "poweredOn", "cpus": 4},
}


#: the intent row of a change, written durably before its vSphere call
EXECUTING = {
    "phase": "executing", "tool": "power_off_vm", "target": "prod-vc1", "caller": "ops-agent",
    "role": "operator", "surface": "https", "correlation_id": "9f1c2a7e", "proposal_id": "p-7f3a",
    "risk": "high",
    "args": {"target": "prod-vc1", "vm": "web-1"},
    "decision": {"allowed": True, "reason": "operators may power off", "rule": "ops-power"},
}
#: the outcome row of the same change (today's single row per change)
OUTCOME = {**EXECUTING, "phase": "executed", "outcome": "ok", "duration_ms": 812.4,
           "result": {"vm": "web-1", "power_state": "poweredOff"}}


def append_rows(path: Path, rows: int, durable: bool) -> tuple[float, float]:
    """Append ``rows`` rows; return (start, end) wall-clock times."""
    with AuditSink(path, durable=durable) as sink:
        start = time.time()
        for _ in range(rows):
            sink.write(EVENT)
        return start, time.time()


def append_changes(path: Path, changes: int, intent: bool) -> float:
    """Durable audit rows for ``changes`` changes (outcome only, or intent + outcome); changes/s."""
    with AuditSink(path, durable=True) as sink:
        start = time.perf_counter()
        for _ in range(changes):
            if intent:
                sink.write(EXECUTING)
            sink.write(OUTCOME)
        elapsed = time.perf_counter() - start
    assert verify(path).ok
    return changes / elapsed


def intent_ratio(directory: Path, changes: int, rounds: int = 9) -> tuple[float, float]:
    """(single-row changes/s, intent-row changes/s): medians of ``rounds`` alternating runs."""
    single: list[float] = []
    intent: list[float] = []
    per_round = max(1, changes // rounds)
    for index in range(rounds):
        single.append(append_changes(directory / f"single-{index}.jsonl", per_round, intent=False))
        intent.append(append_changes(directory / f"intent-{index}.jsonl", per_round, intent=True))
    return statistics.median(single), statistics.median(intent)


def child(path: str, rows: str, durable: str) -> None:
    print("ready", flush=True)
    sys.stdin.read(1)
    start, end = append_rows(Path(path), int(rows), durable == "1")
    print(json.dumps({"start": start, "end": end}), flush=True)


def one_process(directory: Path, rows: int, durable: bool) -> float:
    path = directory / f"one-{int(durable)}.jsonl"
    start, end = append_rows(path, rows, durable)
    assert verify(path).ok
    return rows / (end - start)


def two_processes(directory: Path, rows: int, durable: bool) -> tuple[float, bool]:
    """Total rows per second of two appenders released together, and whether the chain verifies."""
    path = directory / f"two-{int(durable)}.jsonl"
    argv = [sys.executable, __file__, "--child", str(path), str(rows), "1" if durable else "0"]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("g")
        proc.stdin.close()
    spans = []
    for proc in procs:
        assert proc.stdout is not None
        spans.append(json.loads(proc.stdout.read()))
        proc.stdout.close()
        if proc.wait(timeout=600) != 0:
            raise SystemExit(f"an appender failed with exit code {proc.returncode}")
    elapsed = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    report = verify(path)
    return 2 * rows / elapsed, report.ok and report.rows == 2 * rows


def filesystem_of(directory: Path) -> str:
    best = ("?", "")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, mount_point, fs_type = line.split()[:3]
            if str(directory).startswith(mount_point) and len(mount_point) >= len(best[1]):
                best = (fs_type, mount_point)
    return f"{best[0]} (mounted at {best[1]})"


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000, help="rows per run (per process)")
    parser.add_argument("--dir", default=None, help="where to write the logs (default: system temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="audit-bench-") as tmp:
        directory = Path(tmp).resolve()
        print(f"audit append benchmark: {args.rows} rows per run in {directory}, "
              f"filesystem {filesystem_of(directory)}, {os.cpu_count()} CPUs")
        durable = one_process(directory, args.rows, durable=True)
        fast = one_process(directory, args.rows, durable=False)
        print(f"  1 process,  durable (fdatasync per row): {durable:10.0f} rows/s")
        print(f"  1 process,  not durable:                 {fast:10.0f} rows/s")
        print(f"  ratio not durable / durable:             {fast / durable:10.1f}x")
        single, intent = intent_ratio(directory, args.rows)
        print(f"  changes/s, today's one durable row per change:       {single:10.0f}")
        print(f"  changes/s, intent row + outcome row (two durable):   {intent:10.0f}")
        print(f"  ratio intent / today:                                {intent / single:10.2f}x")
        for flag, label in ((True, "durable"), (False, "not durable")):
            rate, intact = two_processes(directory, args.rows, flag)
            verdict = "chain verifies" if intact else "CHAIN BROKEN"
            print(f"  2 processes, {label + ':':<28}{rate:10.0f} rows/s total ({verdict})")
            if not intact:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
