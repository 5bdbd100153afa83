"""What audit-before-action costs per change: the audit work of one change, before and after the intent row.

    python bench/audit_intent.py [--changes 1000] [--dir DIR]

(a) before  the old pattern: ``AuditSink.writable()`` checked, then one durable row after the change,
            written on the event loop.
(b) intent  the pipeline's pattern: a durable ``executing`` row BEFORE the change and the outcome row
            after it, each through ``AuditTrail.record`` / ``record_outcome`` (a worker thread with a
            deadline, so the event loop never waits on the disk).

Both run in one invocation on the same filesystem, interleaved in rounds so machine noise is common to
both, and the script prints changes per second for each and the ratio (intent / before). No vSphere
call is made: this isolates the audit's share of a change.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.audit.file_sink import AuditSink  # noqa: E402
from gateway.audit.verify import verify  # noqa: E402

ROW = {
    "tool": "power_off_vm", "risk": "high", "target": "prod-vc1", "caller": "ops-agent", "role": "operator",
    "surface": "https", "client": "claude-code/2.1", "correlation_id": "9f1c2a7e",
    "args": {"target": "prod-vc1", "vm": "web-1", "guest_timeout_seconds": 0},
    "decision": {"allowed": True, "reason": "write calls are allowed", "rule": "defaults"},
}


class Recorder:
    """The two audit methods of ``server.base.audit_trail.AuditTrail``, on a bare sink (same code path:
    ``asyncio.to_thread`` + ``wait_for`` around ``AuditSink.write``)."""

    def __init__(self, sink: AuditSink) -> None:
        self.sink = sink

    async def record(self, row: dict[str, Any]) -> None:
        await asyncio.wait_for(asyncio.to_thread(self.sink.write, row), 10.0)


async def before(sink: AuditSink, changes: int) -> float:
    start = time.perf_counter()
    for _ in range(changes):
        assert sink.writable()
        sink.write({**ROW, "phase": "executed", "outcome": "ok"})
    return time.perf_counter() - start


async def intent(recorder: Recorder, changes: int) -> float:
    start = time.perf_counter()
    for _ in range(changes):
        await recorder.record({**ROW, "phase": "executing"})
        await recorder.record({**ROW, "phase": "executed", "outcome": "ok"})
    return time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=opts.dir) as tmp:
        a_log, b_log = Path(tmp) / "before.jsonl", Path(tmp) / "intent.jsonl"
        totals = {"before": 0.0, "intent": 0.0}
        per_round = max(1, opts.changes // opts.rounds)
        with AuditSink(a_log) as a_sink, AuditSink(b_log) as b_sink:
            recorder = Recorder(b_sink)
            for _ in range(opts.rounds):
                totals["before"] += await before(a_sink, per_round)
                totals["intent"] += await intent(recorder, per_round)
        assert verify(a_log).ok and verify(b_log).ok
    done = per_round * opts.rounds
    rate = {k: done / v for k, v in totals.items()}
    print(f"changes: {done} per pattern, durable appends, {opts.rounds} interleaved rounds")
    print(f"before (writable check + 1 row, on the loop):     {rate['before']:8.0f} changes/s")
    print(f"intent (intent row + outcome row, worker thread): {rate['intent']:8.0f} changes/s")
    print(f"ratio intent/before: {rate['intent'] / rate['before']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
