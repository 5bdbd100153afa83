"""Audited rows per second with the syslog forwarder on against off, in one run, and how fast the
forwarder delivers them to a real rsyslogd over TLS on loopback.

    python bench/syslog_forward.py [--rows 2000] [--rounds 6] [--dir DIR]

Each round writes ``--rows`` rows through the gateway's one audit path (``AuditTrail.write_row`` into
the JSONL sink), once without a forwarder and once with one attached to a running rsyslogd (tests/
rsyslog.py: Debian's rsyslog and rsyslog-gnutls), alternating, for a durable sink (flushed per row, as
the gateway runs) and a non-durable one (so the forwarder's own cost is not hidden behind the disk).
Prints the median rate of each and the ratio on/off, the cost of ``Forwarder.offer`` (all a call
pays), and the forwarder's delivery rate (rows offered until the last is in rsyslog's output file)
with the CPU the sender thread spent per row. On a shared machine the on/off ratio is within the
noise of the disk (it has come out above 1: with the sender busy the CPU is less often idle when an
fsync returns); ``offer`` and the sender's CPU per row are the stable figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.rsyslog import Rsyslog  # noqa: E402  (the tests' real receiver)

from gateway.audit.file_sink import AuditSink  # noqa: E402
from gateway.audit.syslog_config import SyslogConfig  # noqa: E402
from gateway.audit.syslog_forward import Forwarder  # noqa: E402
from gateway.server.base.audit_trail import AuditTrail  # noqa: E402

EVENT: dict[str, Any] = {
    "phase": "call", "tool": "get_vm_details", "target": "prod-vc1", "caller": "ops-agent", "role": "reader",
    "surface": "https", "correlation_id": "9f1c2a7e", "args": {"target": "prod-vc1", "vm": "web-1"},
    "decision": {"allowed": True, "reason": "read", "rule": "role:reader"}, "outcome": "ok",
    "duration_ms": 41.7, "result": {"name": "web-1", "power_state": "poweredOn", "cpus": 4},
}


def _round(directory: Path, rows: int, durable: bool, forwarder: Forwarder | None) -> float:
    path = directory / f"audit-{time.monotonic_ns()}.jsonl"
    sink = AuditSink(path, durable=durable)
    trail = AuditTrail(sink, path)
    trail.forwarder = forwarder
    started = time.perf_counter()
    for _ in range(rows):
        trail.write_row(EVENT)
    elapsed = time.perf_counter() - started
    sink.close()
    return rows / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        siem = Rsyslog(directory / "siem").start()
        config = SyslogConfig(host="127.0.0.1", port=siem.port, ca_file=siem.ca_file,
                              backlog=args.rows * args.rounds * 2 + 10)
        forwarder = Forwarder(config).start()
        try:
            print(f"rows per round: {args.rows}, rounds: {args.rounds}, directory: {directory}")
            for durable in (True, False):
                off, on = [], []
                for n in range(args.rounds):  # alternate which goes first: the machine's load drifts
                    pair = [(off, None), (on, forwarder)]
                    for rates, attached in pair if n % 2 == 0 else pair[::-1]:
                        rates.append(_round(directory, args.rows, durable, attached))
                ratio = statistics.median(on) / statistics.median(off)
                print(f"{'durable' if durable else 'not durable':>12}: forwarding off "
                      f"{statistics.median(off):8.0f} rows/s, on {statistics.median(on):8.0f} rows/s, "
                      f"ratio on/off {ratio:.2f}x")
            idle = Forwarder(replace(config, backlog=args.rows * 10))  # never started: offer() alone
            started = time.perf_counter()
            for _ in range(args.rows * 10):
                idle.offer(EVENT)
            offer_us = (time.perf_counter() - started) / (args.rows * 10) * 1e6
            print(f"       offer: {offer_us:.2f} us per row on the write path (the call's whole share)")
            idle.close(drain_seconds=0)  # its rows were never meant to be sent (logged as dropped)
            expected = 2 * args.rows * args.rounds
            while forwarder.stats()["backlog"]:  # the rounds' rows sent first
                time.sleep(0.005)
            target = forwarder.stats()["forwarded"] + args.rows
            started, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.rows):
                forwarder.offer({**EVENT, "seq": 0, "hash": "0" * 64, "prev": "0" * 64})
            while forwarder.stats()["forwarded"] < target:  # sent (a cheap poll, not reading the file)
                time.sleep(0.005)
            sent, cpu = time.perf_counter() - started, time.process_time() - cpu
            siem.wait_for(lambda m: len(m) >= expected + args.rows, seconds=300)
            delivery = time.perf_counter() - started
            print(f"    delivery: {args.rows} rows offered to rsyslog received in {delivery:.2f}s "
                  f"({args.rows / delivery:.0f} rows/s, TLS on loopback); sent in {sent:.2f}s with "
                  f"{cpu / args.rows * 1e6:.0f} us of this process's CPU per row (framing, TLS)")
            print(f"       stats: {forwarder.stats()}")
        finally:
            forwarder.close()
            siem.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
