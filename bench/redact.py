"""Redaction per audit row: the time ``prepare_event`` (redaction and bounds) takes for the rows a gateway
writes, and ``redact_text`` alone on short texts with and without a credential word, each both seen
before (a clean short text is looked up once it has been searched: names and states recur) and new.

    python bench/redact.py [--rows 20000] [--repeat 5]

Prints microseconds per row (median of ``--repeat`` runs) for: a typical call row (names, moids, a
decision), a row whose free text mentions credential words (a proposal's reason, a refusal), and a
4 kB argument. Runs against whatever ``gateway`` is importable first (``PYTHONPATH`` selects a tree),
so one tree's figures can be set beside another's.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # PYTHONPATH (another tree) first

from gateway.audit.chain import prepare_event
from gateway.audit.redact import redact_text

CALL_ROW: Mapping[str, Any] = {
    "phase": "call", "tool": "get_vm_details", "target": "prod-vc1", "caller": "ops-agent", "role": "reader",
    "surface": "https", "correlation_id": "9f1c2a7e", "args": {"target": "prod-vc1", "vm": "web-1"},
    "decision": {"allowed": True, "reason": "read", "rule": "role:reader"}, "outcome": "ok",
    "duration_ms": 41.7, "result": {"name": "web-1", "power_state": "poweredOn", "cpus": 4},
}
WORDY_ROW: Mapping[str, Any] = {
    **CALL_ROW, "phase": "proposed", "tool": "reset_vm",
    "args": {"vm": "db-02", "reason": "login to the console failed after the token was rotated; the password "
                                      "policy of vc1.example.com locks the account for 30 minutes"},
    "decision": {"allowed": False, "reason": "the api key of this caller expired at 12:00", "rule": "deny"},
}
LONG_ROW: Mapping[str, Any] = {
    **CALL_ROW,
    "args": {"vm": "web-1", "notes": "datastore [LocalDS_0] web-1/web-1.vmx moid vm-42 host-12 " * 60},
}


def per_row(work: Callable[[], Any], rows: int, repeat: int) -> float:
    """Median microseconds per call of ``work`` over ``repeat`` runs of ``rows`` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(rows):
            work()
        runs.append((time.perf_counter() - start) / rows * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    fresh = itertools.count()  # texts never seen: what a text costs before the clean set holds it
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("call row (prepare_event)", lambda: prepare_event(CALL_ROW)),
        ("row with credential words (prepare_event)", lambda: prepare_event(WORDY_ROW)),
        ("row with a 4 kB argument (prepare_event)", lambda: prepare_event(LONG_ROW)),
        ("redact_text, a VM name seen before", lambda: redact_text("DC0_C0_RP0_VM0")),
        ("redact_text, a new VM name each time", lambda: redact_text(f"DC0_C0_RP0_VM{next(fresh)}")),
        ("redact_text, a sentence with 'password' seen before",
         lambda: redact_text("the password policy locks it")),
        ("redact_text, a new sentence with 'password' each time",
         lambda: redact_text(f"the password policy locks it {next(fresh)}")),
    ]
    import gateway

    print(f"gateway from {Path(gateway.__file__).resolve().parent}")
    for name, work in cases:
        print(f"{name:56s} {per_row(work, args.rows, args.repeat):8.2f} us/row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
