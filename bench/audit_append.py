"""Audit appends per second: durable (flushed to disk per row) against not, in one process and in two.

    python bench/audit_append.py [--rows 2000] [--dir DIR]

Runs side by side in one invocation and prints each rate and the ratios. The two-process runs start
both appenders together on one file and verify the chain afterwards. ``--dir`` decides the
filesystem measured (the default is the system temp directory; a tmpfs there makes flushing free).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.guard.audit import AuditSink, verify

EVENT = {
    "phase": "call", "tool": "get_vm_details", "target": "prod-vc1", "caller": "ops-agent", "role": "reader",
    "surface": "https", "correlation_id": "9f1c2a7e", "args": {"target": "prod-vc1", "vm": "web-1"},
    "decision": {"allowed": True, "reason": "read", "rule": "role:reader"}, "outcome": "ok",
    "duration_ms": 41.7, "result": {"name": "web-1", "power_state": "poweredOn", "cpus": 4},
}


def append_rows(path: Path, rows: int, durable: bool) -> tuple[float, float]:
    """Append ``rows`` rows; return (start, end) wall-clock times."""
    with AuditSink(path, durable=durable) as sink:
        start = time.time()
        for _ in range(rows):
            sink.write(EVENT)
        return start, time.time()


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
        for flag, label in ((True, "durable"), (False, "not durable")):
            rate, intact = two_processes(directory, args.rows, flag)
            verdict = "chain verifies" if intact else "CHAIN BROKEN"
            print(f"  2 processes, {label + ':':<28}{rate:10.0f} rows/s total ({verdict})")
            if not intact:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
