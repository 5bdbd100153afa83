"""The audit log's Merkle tree: what keeping it costs a change, and what a proof costs.

    python bench/audit_tree.py [--changes 2000] [--dir DIR]

1. Audited changes per second with the tree kept against today's sink without it, in one run:
   each change writes the intent row and the outcome row (durably: fdatasync per row; then again
   not durably, which shows the tree's CPU cost alone), signed checkpoints on. Both sinks are open at
   once on one filesystem and take changes in turn, so load weighs on both alike; the ratio is
   printed (target >= 0.9x). "Today" is the same ``AuditSink`` with its tree replaced by a no-op.
2. Inclusion-proof time at 10^4 and 10^6 rows: a 10^4-row log written by the sink, and a 10^6-leaf
   tree file in the sink's format (``gateway.audit.tree_file``; leaves hashed from synthetic rows,
   written with ``merkle.Frontier`` as the sink does), each proof read from the file through
   ``FileAuditReader.read_hashes`` and verified; median and p99 over 2000 random rows.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.audit.file_sink import AuditSink
from gateway.audit.merkle import Frontier, inclusion_plan, leaf_hash, read_plan, verify_inclusion
from gateway.audit.readers import FileAuditReader
from gateway.audit.tree_file import tree_path

EXECUTING = {
    "phase": "executing", "tool": "power_off_vm", "target": "prod-vc1", "caller": "ops-agent",
    "role": "operator", "surface": "https", "correlation_id": "9f1c2a7e", "proposal_id": "p-7f3a",
    "args": {"target": "prod-vc1", "vm": "web-1"},
    "decision": {"allowed": True, "reason": "operators may power off", "rule": "ops-power"},
}
OUTCOME = {**EXECUTING, "phase": "executed", "outcome": "ok", "duration_ms": 812.4,
           "result": {"vm": "web-1", "power_state": "poweredOff"}}


class NoTree:
    """Today's sink: the tree's hooks do nothing."""

    frontier = None

    def sync(self, *_args: object) -> None: ...

    def add(self, _line: bytes) -> None: ...

    def flush(self) -> None: ...

    def forget(self) -> None: ...


def _sink(path: Path, durable: bool, tree: bool) -> AuditSink:
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = AuditSink(path, durable=durable, key_file=path.parent / "signing.key", checkpoint_rows=1000)
    if not tree:
        sink._tree = NoTree()  # type: ignore[assignment]
    return sink


def tree_ratio(directory: Path, changes: int, durable: bool) -> tuple[float, float]:
    """(today's changes/s, with the tree): two sinks on the same filesystem at once, changes given to
    each in turn (which one goes first alternates), so disk and machine load weigh on both alike."""
    sinks = {tree: _sink(directory / f"{durable}-{tree}" / "audit.jsonl", durable, tree)
             for tree in (False, True)}
    spent = {False: 0.0, True: 0.0}
    cpu = {False: 0.0, True: 0.0}
    try:
        for index in range(changes):
            for tree in (False, True) if index % 2 == 0 else (True, False):
                start, start_cpu = time.perf_counter(), time.process_time()
                sinks[tree].write(EXECUTING)
                sinks[tree].write(OUTCOME)
                spent[tree] += time.perf_counter() - start
                cpu[tree] += time.process_time() - start_cpu
    finally:
        for sink in sinks.values():
            sink.close()
    label = "durable" if durable else "not durable"
    print(f"  CPU per change ({label}): today {cpu[False] / changes * 1e6:.0f} us, with the tree "
          f"{cpu[True] / changes * 1e6:.0f} us (ratio of rates {cpu[False] / cpu[True]:.2f}x)")
    return changes / spent[False], changes / spent[True]


def proof_times(reader: FileAuditReader, size: int, leaf: object, root: bytes,
                samples: int = 2000) -> list[float]:
    times = []
    rng = random.Random(7)
    for _ in range(samples):
        index = rng.randrange(size)
        start = time.perf_counter()
        proof = read_plan(inclusion_plan(index, size), reader.read_hashes)
        assert callable(leaf)
        ok = verify_inclusion(index, size, leaf(index), proof, root)
        times.append(time.perf_counter() - start)
        assert ok, index
    return times


def synthetic_tree(path: Path, size: int) -> bytes:
    """A tree file of ``size`` leaves (row i's data: b"row <i>") in the sink's format; its root."""
    frontier = Frontier()
    with open(tree_path(path), "wb") as out:
        chunk: list[bytes] = []
        for i in range(size):
            chunk.extend(frontier.append(leaf_hash(b"row %d" % i)))
            if len(chunk) > 65536:
                out.write(b"".join(chunk))
                chunk.clear()
        out.write(b"".join(chunk))
    return frontier.root()


def report(label: str, times: list[float]) -> None:
    times = sorted(times)
    p50 = statistics.median(times) * 1e6
    p99 = times[int(len(times) * 0.99)] * 1e6
    print(f"  inclusion proof, {label:>10}: median {p50:8.1f} us, p99 {p99:8.1f} us (read from the tree file "
          "and verified)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--changes", type=int, default=2000, help="changes per variant")
    parser.add_argument("--dir", default=None, help="where to write (default: system temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="audit-tree-bench-") as tmp:
        directory = Path(tmp)
        print(f"audit tree benchmark in {directory}, {os.cpu_count()} CPUs")
        for durable in (True, False):
            today, kept = tree_ratio(directory, args.changes, durable)
            label = "durable" if durable else "not durable"
            print(f"  changes/s (intent + outcome, {label}), today's sink:    {today:10.0f}")
            print(f"  changes/s (intent + outcome, {label}), with the tree:   {kept:10.0f}")
            print(f"  ratio with the tree / today ({label}):                  {kept / today:10.2f}x")

        small = directory / "small" / "audit.jsonl"
        small.parent.mkdir()
        with AuditSink(small, durable=False) as sink:
            for i in range(10_000):
                sink.write({"phase": "call", "tool": "list_vms", "args": {"i": i}})
        lines = small.read_bytes().splitlines()
        frontier = Frontier()
        for line in lines:
            frontier.append(leaf_hash(line))
        report("10^4 rows", proof_times(FileAuditReader(small), 10_000, lambda i: leaf_hash(lines[i]),
                                         frontier.root()))

        big = directory / "big" / "audit.jsonl"
        big.parent.mkdir()
        started = time.perf_counter()
        root = synthetic_tree(big, 1_000_000)
        print(f"  (10^6-leaf tree file built in {time.perf_counter() - started:.1f} s, "
              f"{tree_path(big).stat().st_size / 1e6:.0f} MB)")
        report("10^6 rows", proof_times(FileAuditReader(big), 1_000_000,
                                         lambda i: leaf_hash(b"row %d" % i), root))


if __name__ == "__main__":
    main()
