"""Two source trees' ``bench/run_all.py`` tables side by side, runs alternating, with the machine's spread.

    python bench/before_after.py --before DIR [--after DIR] [--rounds 2] [--full] [--out FILE]

``--before`` is another checkout (``git worktree add DIR COMMIT``; its deploy/vcsim/bin built or copied);
``--after`` defaults to this one. Rounds alternate before, after, before, after, ... so a drift of the
machine hits both sides alike. Each row's spread is the largest relative difference between two runs of
the same side; a row is *worse* when the after side's median is further from the before side's median,
in the bad direction, than both spreads and 10%. ``--quick`` sizes unless ``--full``; ``--no-peer``
always (the peer is not ours). Exit 1 when a row is worse.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
#: a row whose unit is one of these is better when higher (throughput); every other number: lower
HIGHER_IS_BETTER = re.compile(r"/s\b|per second|completed per client", re.I)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
#: the least difference reported as worse, whatever the measured spread
FLOOR = 0.10


def run_table(tree: Path, full: bool) -> dict[str, float]:
    """One ``run_all.py`` run in ``tree``: its table's rows whose value starts with a number."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, str(tree / "bench" / "run_all.py"), "--no-peer", *([] if full else ["--quick"])]
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True).stdout
    rows: dict[str, float] = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("measurement", "---"):
            continue
        found = NUMBER.match(cells[1])
        if found:
            rows[cells[0]] = float(found.group().replace(",", ""))
    return rows


def spread(values: list[float]) -> float:
    """The largest relative difference between two runs of one side (0 with one run)."""
    low, high = min(values), max(values)
    return (high - low) / low if low > 0 else 0.0


def compare(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[dict[str, object]]:
    rows = []
    for what in before[0]:
        b = [run[what] for run in before if what in run]
        a = [run[what] for run in after if what in run]
        if not a or not b:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        change = (ma - mb) / mb if mb else 0.0
        bad = -change if HIGHER_IS_BETTER.search(what) else change
        allowed = max(spread(b), spread(a), FLOOR)
        rows.append({"what": what, "before": mb, "after": ma, "change": change,
                     "spread": max(spread(b), spread(a)), "worse": bad > allowed})
    return rows


def markdown(rows: list[dict[str, object]], rounds: int, full: bool) -> str:
    lines = [f"Sizes: {'full' if full else '--quick'}, {rounds} runs per side, alternating; medians.", "",
             "| measurement | before | after | change | spread | worse |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['what']} | {r['before']:g} | {r['after']:g} | {float(str(r['change'])):+.0%} | "
                     f"{float(str(r['spread'])):.0%} | {'WORSE' if r['worse'] else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=HERE)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    for n in range(args.rounds):
        for side, runs, tree in (("before", before, args.before), ("after", after, args.after)):
            print(f"round {n + 1}: {side} ({tree})", flush=True)
            runs.append(run_table(tree.resolve(), args.full))
    rows = compare(before, after)
    text = markdown(rows, args.rounds, args.full)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if any(r["worse"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
