"""``gateway audit``: read, summarise and verify the audit log: the file named by settings.audit_log, or
the ``audit_rows`` table when the chain lives in PostgreSQL (GATEWAY_DATABASE_URL), with the same output."""

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

from gateway.audit.query import read_rows, stats
from gateway.audit.signing import (
    SIGNING_KEY_NAME,
    load_or_create_signing_key,
    parse_public_key,
    public_key_text,
)
from gateway.audit.verify import VerifyReport, verify
from gateway.cli import add_path_flags, settings_from
from gateway.errors import AuditUnavailable

if TYPE_CHECKING:
    from gateway.audit.pg_reader import PgAuditReader
    from gateway.settings import Settings
    from gateway.store.postgres import PostgresStore

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
    for flag in ("target", "tool", "phase", "caller"):
        log_cmd.add_argument(f"--{flag}", help=f"only rows whose {flag} is exactly this")
    log_cmd.add_argument("--correlation-id", dest="correlation_id", help="only rows of this request")
    log_cmd.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    log_cmd.set_defaults(handler=show_log)

    stats_cmd = commands.add_parser("stats", help="count rows by phase, tool, target, caller, outcome")
    add_path_flags(stats_cmd)
    stats_cmd.add_argument("--since", type=parse_when, help="ISO-8601 time or an age such as 7d")
    stats_cmd.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    stats_cmd.set_defaults(handler=show_stats)

    verify_cmd = commands.add_parser(
        "verify", help="check the hash chain across rotated files (exit 0 intact, 1 otherwise)")
    add_path_flags(verify_cmd)
    verify_cmd.add_argument(
        "--checkpoint", action="store_true",
        help="also check the signed checkpoints beside the log (detects a cut tail or a rewritten history)")
    verify_cmd.add_argument(
        "--public-key", dest="public_key", type=_public_key, metavar="ed25519:HEX",
        help="the key checkpoints must be signed with (as `gateway audit key` printed it); default: the key "
             f"in the state directory ({SIGNING_KEY_NAME}) when readable, else the first checkpoint's")
    verify_cmd.set_defaults(handler=run_verify)

    key_cmd = commands.add_parser(
        "key", help="print the public key audit checkpoints are signed with (pin it off this host)")
    add_path_flags(key_cmd)
    key_cmd.set_defaults(handler=show_key)


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
    if (shared := settings_from(args)).database_url:  # the chain is in PostgreSQL
        return _show_table_log(args, shared)
    path = shared.audit_log
    limit = _row_limit(args)
    try:
        rows = read_rows(path, last=limit, since=args.since, until=args.until,
                         target=args.target, tool=args.tool, phase=args.phase, caller=args.caller,
                         correlation_id=args.correlation_id)
    except OSError as exc:
        return _unreadable(path, exc)
    return print_rows(rows, args, limit, where=path)


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


def show_stats(args: argparse.Namespace) -> int:
    if (shared := settings_from(args)).database_url:  # the chain is in PostgreSQL
        return _show_table_stats(args, shared)
    path = shared.audit_log
    try:
        summary = stats(path, since=args.since)
    except OSError as exc:
        return _unreadable(path, exc)
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


def _public_key(text: str) -> Ed25519PublicKey:
    try:
        return parse_public_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _state_key(key_file: Path) -> Ed25519PublicKey | None:
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


def run_verify(args: argparse.Namespace) -> int:
    if (settings := settings_from(args)).database_url:  # the chain is in PostgreSQL
        return _verify_table(args, settings)
    path = settings.audit_log
    pinned: Ed25519PublicKey | None = args.public_key
    if args.checkpoint and pinned is None:
        pinned = _state_key(settings.signing_key_file)
    try:
        report = verify(path, checkpoints=args.checkpoint, public_key=pinned)
    except OSError as exc:
        return _unreadable(path, exc)
    if not report.files:
        print(f"no audit log at {path} (check GATEWAY_AUDIT_LOG / --audit-log)", file=sys.stderr)
        return 1
    lines = [line for line in (*describe(report), *describe_checkpoints(report)) if line]
    print("\n".join(lines))
    return 0 if report.ok else 1


def show_key(args: argparse.Namespace) -> int:
    key_file = settings_from(args).signing_key_file
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
    print(public_key_text(key.public_key()))
    return 0


def _unreadable(path: object, exc: OSError) -> int:
    print(f"gateway: cannot read the audit log {path}: {exc.strerror or exc}", file=sys.stderr)
    return 1


# -- the chain in PostgreSQL (GATEWAY_DATABASE_URL): the same output, read from the audit_rows table ------


def _table_reader(settings: Settings) -> tuple[PostgresStore, PgAuditReader]:
    """The audit table's reader on its own small pool (imported here: only PostgreSQL mode needs it)."""
    from gateway.audit.pg_reader import PgAuditReader
    from gateway.store.postgres import PostgresStore

    assert settings.database_url is not None
    store = PostgresStore(settings.database_url, max_size=2)
    return store, PgAuditReader(store)


def _show_table_log(args: argparse.Namespace, settings: Settings) -> int:
    store, reader = _table_reader(settings)
    limit = _row_limit(args)
    try:
        rows = reader.rows(last=limit, since=args.since, until=args.until, target=args.target, tool=args.tool,
                           phase=args.phase, caller=args.caller, correlation_id=args.correlation_id)
    except AuditUnavailable as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return print_rows(rows, args, limit, where=reader.where)


def _show_table_stats(args: argparse.Namespace, settings: Settings) -> int:
    store, reader = _table_reader(settings)
    try:
        summary = reader.stats(since=args.since)
    except AuditUnavailable as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(json.dumps(summary, ensure_ascii=False) if args.json else render_stats(summary))
    return 0


def _verify_table(args: argparse.Namespace, settings: Settings) -> int:
    pinned = args.public_key
    if args.checkpoint and pinned is None:
        pinned = _state_key(settings.signing_key_file)
    store, reader = _table_reader(settings)
    try:
        report = reader.verify(checkpoints=args.checkpoint, public_key=pinned)
    except AuditUnavailable as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if not report.rows:
        print(f"no audit rows in {reader.where} (check GATEWAY_DATABASE_URL)", file=sys.stderr)
        return 1
    print("\n".join(line for line in (*describe(report), *describe_checkpoints(report)) if line))
    return 0 if report.ok else 1
