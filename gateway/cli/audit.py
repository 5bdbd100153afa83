"""``gateway audit``: read, summarise and verify the audit log, file or table, with the same output."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit.note import verifier_key
from gateway.audit.signing import (
    SIGNING_KEY_NAME,
    load_or_create_signing_key,
    public_key_text,
)
from gateway.audit.verify import VerifyReport
from gateway.audit.witness import read_witness
from gateway.cli import add_path_flags, audit_proofs, settings_from
from gateway.cli.audit_reading import public_key_arg, reading
from gateway.errors import AuditUnavailable

if TYPE_CHECKING:
    pass

_RELATIVE = re.compile(r"(?P<amount>\d+)(?P<unit>[smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: `log` shows this many rows unless --last says otherwise (0 = all)
DEFAULT_LAST = 50


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """ISO-8601 (no offset means UTC; a date alone is its midnight) or an age: 30s, 15m, 1h, 2d, 1w."""
    if match := _RELATIVE.fullmatch(text.strip()):
        age = timedelta(**{_UNITS[match["unit"]]: int(match["amount"])})
        return (now or datetime.now(UTC)) - age
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO-8601 time (2026-03-28T14:00:00Z) nor an age like 1h or 2d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("audit", help="read, summarise and verify the audit log")
    commands = parser.add_subparsers(dest="audit_command", required=True, metavar="SUBCOMMAND")

    log_cmd = commands.add_parser("log", help="show audit rows, newest last")
    add_path_flags(log_cmd)
    log_cmd.add_argument("--last", type=int, metavar="N",
                         help=f"only the newest N matching rows (0 for all; default {DEFAULT_LAST}, "
                              "or all when --since or --until is given)")
    log_cmd.add_argument("--since", type=parse_when, help="ISO-8601 time or an age such as 1h, 2d")
    log_cmd.add_argument("--until", type=parse_when, help="ISO-8601 time or an age such as 30m")
    for flag in ("target", "tool", "caller"):
        log_cmd.add_argument(f"--{flag}", help=f"only rows whose {flag} is exactly this")
    log_cmd.add_argument("--phase", "--status", dest="phase", help="only rows whose phase is exactly this "
                         "(--status is the same filter, for older runbooks)")
    log_cmd.add_argument("--correlation-id", dest="correlation_id", help="only rows of this request")
    log_cmd.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    log_cmd.set_defaults(handler=show_log)

    stats_cmd = commands.add_parser("stats", help="count rows by phase, tool, target, caller, outcome")
    add_path_flags(stats_cmd)
    window = stats_cmd.add_mutually_exclusive_group()
    window.add_argument("--since", type=parse_when, help="ISO-8601 time or an age such as 7d")
    window.add_argument("--days", type=_days, metavar="N", dest="since",
                        help="the last N days (the same as --since Nd)")
    stats_cmd.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    stats_cmd.set_defaults(handler=show_stats)

    verify_cmd = commands.add_parser(
        "verify", help="check the hash chain across rotated files (exit 0 intact, 1 otherwise)")
    add_path_flags(verify_cmd)
    verify_cmd.add_argument(
        "--checkpoint", action="store_true",
        help="also check the signed checkpoints beside the log (detects a cut tail or a rewritten history)")
    verify_cmd.add_argument(
        "--public-key", dest="public_key", type=public_key_arg, metavar="KEY",
        help="the key checkpoints must be signed with, as `gateway audit key` (ed25519:HEX) or `gateway "
             "audit key --note` printed it; default: the key in the state directory "
             f"({SIGNING_KEY_NAME}) when readable, else the first checkpoint's")
    verify_cmd.add_argument(
        "--witness", type=Path, metavar="FILE_OR_DIR",
        help="checkpoint notes a witness kept (a file of notes, or a directory such as "
             "GATEWAY_AUDIT_WITNESS_DIR): fail, naming the first one, unless the log still extends every one")
    verify_cmd.add_argument("--json", action="store_true", help="print the report as one JSON object")
    verify_cmd.set_defaults(handler=run_verify)

    key_cmd = commands.add_parser(
        "key", help="print the public key audit checkpoints are signed with (pin it off this host)")
    add_path_flags(key_cmd)
    key_cmd.add_argument("--note", action="store_true",
                         help="print it as a signed-note verifier key (<name>+<id>+<key>, as Go's sumdb/note "
                              "reads it), named by the log's origin (GATEWAY_AUDIT_ORIGIN)")
    key_cmd.set_defaults(handler=show_key)

    audit_proofs.register(commands)


# -- log ----------------------------------------------------------------------------------------------

def _detail(row: Mapping[str, Any]) -> str:
    raw = row.get("decision")
    decision: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    parts = [
        row.get("outcome"), row.get("error_code"),
        f"rule={decision['rule']}" if decision.get("rule") else None,
        decision.get("reason"),
        f"proposal={row['proposal_id']}" if row.get("proposal_id") else None,
        f"{row['duration_ms']}ms" if row.get("duration_ms") is not None else None,
    ]
    return "; ".join(str(p) for p in parts if p not in (None, ""))


#: the table's columns: header, how to read the cell from a row
_COLUMNS: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("TIME", lambda r: str(r.get("ts", ""))[:19].replace("T", " ")),
    ("SEQ", lambda r: r.get("seq")),
    ("PHASE", lambda r: r.get("phase")),
    ("CALLER", lambda r: r.get("caller")),
    ("TARGET", lambda r: r.get("target")),
    ("TOOL", lambda r: r.get("tool")),
    ("DETAIL", _detail),
)
_MAX_CELL = 60
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _cell(value: Any) -> str:
    # Rows carry text from callers and vSphere: never let it drive the terminal.
    text = _CONTROL.sub("?", "" if value is None else str(value))
    return text if len(text) <= _MAX_CELL else text[:_MAX_CELL - 1] + "…"


def render_table(rows: Sequence[Mapping[str, Any]]) -> str:
    cells = [[_cell(read(row)) for _, read in _COLUMNS] for row in rows]
    widths = [max([len(header)] + [len(line[i]) for line in cells]) for i, (header, _) in enumerate(_COLUMNS)]
    lines = [[header for header, _ in _COLUMNS], *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def _row_limit(args: argparse.Namespace) -> int | None:
    if args.last is not None:
        return args.last or None
    return None if args.since or args.until else DEFAULT_LAST


def show_log(args: argparse.Namespace) -> int:
    limit = _row_limit(args)
    with reading(args) as (reader, failed):
        rows = reader.rows(last=limit, since=args.since, until=args.until, target=args.target, tool=args.tool,
                           phase=args.phase, caller=args.caller, correlation_id=args.correlation_id)
    if failed:
        return 1
    return print_rows(rows, args, limit, where=reader.where)


def print_rows(rows: Sequence[Mapping[str, Any]], args: argparse.Namespace, limit: int | None, *,
               where: object) -> int:
    """What ``gateway audit log`` prints for ``rows`` read from ``where`` (the file or the table)."""
    if args.json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
    elif rows:
        print(render_table(rows))
    else:
        print(f"no matching rows in {where}", file=sys.stderr)
    if args.last is None and limit is not None and len(rows) == limit:
        print(f"(the newest {limit} rows; --last 0 shows all)", file=sys.stderr)
    return 0


# -- stats --------------------------------------------------------------------------------------------

def render_stats(summary: Mapping[str, Any]) -> str:
    lines = [f"{summary['rows']} rows" + (f" since {summary['since']}" if summary["since"] else "")]
    if summary["rows"]:
        lines.append(f"from {summary['first_ts']} to {summary['last_ts']}")
    for key in ("by_phase", "by_outcome", "by_tool", "by_target", "by_caller"):
        counts: Mapping[str, int] = summary[key]
        if counts:
            lines.append(f"\n{key.removeprefix('by_')}:")
            width = max(len(_cell(name)) for name in counts)
            lines.extend(f"  {_cell(name).ljust(width)}  {count}" for name, count in counts.items())
    return "\n".join(lines)


def _days(text: str) -> datetime:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days")
    return datetime.now(UTC) - timedelta(days=int(text))


def show_stats(args: argparse.Namespace) -> int:
    with reading(args) as (reader, failed):
        summary = reader.stats(since=args.since)
    if failed:
        return 1
    print(json.dumps(summary, ensure_ascii=False) if args.json else render_stats(summary))
    return 0


# -- verify -------------------------------------------------------------------------------------------

def describe(report: VerifyReport) -> list[str]:
    """What `verify` prints: one line per finding, the verdict first."""
    span = f"seq {report.first_seq}..{report.last_seq}" if report.rows else "no rows"
    files = f"{len(report.files)} file{'s' if len(report.files) != 1 else ''}"
    lines: list[str] = []
    if report.first_broken_line is not None:
        more = f" (and {report.problems - 1} more)" if report.problems > 1 else ""
        lines += [f"BROKEN: the chain is broken: the log was tampered with or damaged ({report.rows} rows, "
                  f"{span}, {files})", f"first broken line{more}: {report.first_broken_line}"]
    if report.torn_last_line is not None:
        lines.append(f"TORN: the last line is incomplete, an interrupted write (not tampering): "
                     f"{report.torn_last_line.file}:{report.torn_last_line.line}; "
                     "the next append removes it and records the repair")
    if report.ok:
        lines.append(f"OK: the audit chain is intact: {report.rows} rows, {span}, {files}")
    if report.starts_after_rotation:
        lines.append(f"note: the oldest kept file starts at seq {report.first_seq}; "
                     "earlier rows were rotated away")
    return lines


def state_key(key_file: Path) -> Ed25519PublicKey | None:
    """The public half of the signing key (``Settings.signing_key_file``), when there is one to read."""
    if not key_file.is_file():
        return None
    try:
        return load_or_create_signing_key(key_file).public_key()
    except (OSError, ValueError, AuditUnavailable) as exc:
        print(f"gateway: cannot read the audit signing key {key_file} ({exc}); checking checkpoints "
              "against the key they carry", file=sys.stderr)
        return None


def describe_checkpoints(report: VerifyReport) -> list[str]:
    checkpoint = report.checkpoint
    if checkpoint is None:
        return []
    if checkpoint.ok:
        skipped = f", {checkpoint.skipped} for rows rotated away" if checkpoint.skipped else ""
        return [f"checkpoints: OK: {checkpoint.checked} signed heads match (newest seq {checkpoint.last_seq}"
                f"{skipped}); signed by {checkpoint.public_key}",
                f"note: rows after seq {checkpoint.last_seq} are protected by the chain alone"
                if checkpoint.last_seq is not None and report.last_seq is not None
                and report.last_seq > checkpoint.last_seq else ""]
    more = f" (and {len(checkpoint.faults) - 1} more)" if len(checkpoint.faults) > 1 else ""
    return [f"checkpoints: FAILED: the log does not match its signed checkpoints ({checkpoint.file})",
            f"first failure{more}: {checkpoint.first_fault}"]


def describe_witness(report: VerifyReport) -> list[str]:
    witness = report.witness
    if witness is None:
        return []
    if witness.ok:
        return [f"witness: OK: the log extends all {witness.checked} witnessed checkpoints"]
    more = f" (and {len(witness.faults) - 1} more)" if len(witness.faults) > 1 else ""
    return ["witness: FAILED: the log no longer extends what a witness saw (a rollback or a split view)",
            f"first inconsistent checkpoint{more}: {witness.first_fault}"]


def report_json(report: VerifyReport) -> dict[str, Any]:
    """``verify --json``: the report as plain values (faults as {where, reason, detail})."""
    def fault(value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        where = getattr(value, "file", None) or getattr(value, "where", None)
        place = ({"line": value.line} if hasattr(value, "line")
                 else {"tree_size": getattr(value, "size", None)})
        return {"where": str(where) if where is not None else None, **place, "reason": value.reason,
                "detail": value.detail}

    checkpoint = report.checkpoint
    witness = report.witness
    return {
        "ok": report.ok, "rows": report.rows, "first_seq": report.first_seq, "last_seq": report.last_seq,
        "files": [str(f) for f in report.files], "problems": report.problems,
        "first_broken_line": fault(report.first_broken_line), "torn_last_line": fault(report.torn_last_line),
        "starts_after_rotation": report.starts_after_rotation,
        "checkpoint": None if checkpoint is None else {
            "ok": checkpoint.ok, "checked": checkpoint.checked, "skipped": checkpoint.skipped,
            "last_seq": checkpoint.last_seq, "public_key": checkpoint.public_key,
            "faults": [fault(f) for f in checkpoint.faults]},
        "witness": None if witness is None else {
            "ok": witness.ok, "checked": witness.checked, "faults": [fault(f) for f in witness.faults]},
    }


def run_verify(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    pinned: Ed25519PublicKey | None = args.public_key
    if (args.checkpoint or args.witness) and pinned is None:
        pinned = state_key(settings.signing_key_file)
    try:
        witness = read_witness(args.witness) if args.witness is not None else None
    except (OSError, UnicodeDecodeError) as exc:
        print(f"gateway: cannot read the witness {args.witness}: {exc}", file=sys.stderr)
        return 1
    with reading(args, settings) as (reader, failed):
        report = reader.verify(checkpoints=args.checkpoint, public_key=pinned, witness=witness)
    if failed:
        return 1
    if not report.files and not report.rows and not args.json:
        print(f"no audit log at {reader.where} (check GATEWAY_AUDIT_LOG / --audit-log, or "
              "GATEWAY_DATABASE_URL)", file=sys.stderr)
        if witness is None:
            return 1
    if args.json:
        print(json.dumps(report_json(report), ensure_ascii=False))
        return 0 if report.ok and report.rows else 1
    lines = [line for line in (*describe(report), *describe_checkpoints(report), *describe_witness(report))
             if line]
    good = [line for line in lines if not _is_failure(line)]
    bad = [line for line in lines if _is_failure(line)]
    if good:
        print("\n".join(good))
    if bad:
        print("\n".join(bad), file=sys.stderr)
    return 0 if report.ok and report.rows else 1


#: what a failed verification prints goes to stderr (scripts read stdout; BROKEN is not output)
_FAILURE_PREFIXES = ("BROKEN:", "first broken line", "checkpoints: FAILED", "first failure",
                     "witness: FAILED", "first inconsistent checkpoint")


def _is_failure(line: str) -> bool:
    return line.startswith(_FAILURE_PREFIXES)


def show_key(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    key_file = settings.signing_key_file
    if not key_file.is_file():
        print(f"gateway: no audit signing key at {key_file}; the gateway creates it on its first "
              "checkpoint (GATEWAY_AUDIT_SIGNING_KEY_FILE names it; default in GATEWAY_HOME)",
              file=sys.stderr)
        return 1
    try:
        key = load_or_create_signing_key(key_file)
    except (OSError, ValueError, AuditUnavailable) as exc:
        print(f"gateway: cannot read the audit signing key {key_file}: {exc}", file=sys.stderr)
        return 1
    public = key.public_key()
    print(verifier_key(settings.audit_origin, public) if args.note else public_key_text(public))
    return 0
