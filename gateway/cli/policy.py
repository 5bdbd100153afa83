"""``gateway policy``: the policy in force, and what a change to it would decide otherwise.

``show`` prints the effective policy per target, or why rules.yaml cannot be used. ``test`` replays the
audited calls of a window through a candidate rules file and the rules in force
(``gateway.guard.policy.replay``) and lists each call decided otherwise: exit 0 when none is, 1 when
some are, 2 when the replay could not run (a broken candidate, with its ``file:line`` errors).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gateway.auth.roles import RoleBook
from gateway.cli import add_path_flags, add_verbose_flag, settings_from
from gateway.cli.audit import parse_when
from gateway.cli.audit_reading import reading
from gateway.config import ConfigProblems, Target, load_targets
from gateway.errors import ConfigError
from gateway.guard.names import KnownNames, unknown_names
from gateway.guard.policy.describe import describe
from gateway.guard.policy.model import Policy
from gateway.guard.policy.read_filter import unreachable_rules
from gateway.guard.policy.replay import EXAMPLES, ToolFacts, World, replay
from gateway.guard.policy.store import PolicyStore
from gateway.sanitize import clean_text
from gateway.settings import Settings
from gateway.tools.registry import all_tools, tool_categories

#: the window ``policy test`` replays unless --since says otherwise
DEFAULT_SINCE = "7d"
#: the exit status of a replay that could not run (a broken candidate, an unreadable audit log)
CANNOT_REPLAY = 2
#: what every replay says it cannot see
REPLAY_NOTES = (
    "roles, target tags and tool categories are today's (roles.yaml, targets.yaml, this build); the "
    "caller's token is taken as usable",
    "what read rules hide from a listing is not replayed, only whether the read is allowed",
)


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("policy", help="inspect the policy in force, test a "
                                                                     "change to it")
    actions = parser.add_subparsers(dest="policy_action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="effective policy per target (exit 1 while rules.yaml is broken)")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    add_path_flags(show)
    show.set_defaults(handler=run_show)
    what = ("replay the audited calls of a window through a candidate rules file and the rules in force; "
            "list each call decided otherwise (exit 0: none, 1: some, 2: a broken candidate or an "
            "unreadable audit log)")
    test = actions.add_parser("test", help=what, description=f"{what[0].upper()}{what[1:]}.")
    test.add_argument("--rules", dest="candidate", required=True, metavar="CANDIDATE",
                      help="the rules file to test")
    test.add_argument("--current", metavar="RULES",
                      help="the rules in force to compare with (default GATEWAY_RULES_FILE, else "
                           "$GATEWAY_HOME/rules.yaml)")
    add_replay_flags(test)
    test.add_argument("--json", action="store_true", help="print one JSON object")
    for flag, what_it_is in (("home", "state directory (GATEWAY_HOME, default ~/.gateway)"),
                             ("targets", "targets.yaml (GATEWAY_TARGETS_FILE)"),
                             ("roles", "roles.yaml (GATEWAY_ROLES_FILE)")):
        test.add_argument(f"--{flag}", help=what_it_is)
    test.add_argument("--audit-log", dest="audit_log", help="audit JSONL file (GATEWAY_AUDIT_LOG)")
    test.add_argument("--database-url", dest="database_url", metavar="postgresql://USER@HOST/DB",
                      help="the audit table on PostgreSQL (GATEWAY_DATABASE_URL; no password here)")
    add_verbose_flag(test)
    test.set_defaults(handler=run_test)


def add_replay_flags(parser: argparse.ArgumentParser) -> None:
    """The window and the examples of a replay (``policy test``)."""
    parser.add_argument("--since", type=parse_when, metavar="WHEN",
                        help=f"replay calls since this ISO-8601 time or age (default {DEFAULT_SINCE})")
    parser.add_argument("--until", type=parse_when, metavar="WHEN", help="and until this time or age")
    parser.add_argument("--examples", type=_examples, default=EXAMPLES, metavar="N",
                        help=f"calls listed per kind of change (default {EXAMPLES}; 0: every one)")


def _examples(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def run_show(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    known_targets: tuple[Target, ...] | None
    try:
        known_targets = load_targets(settings.targets_file)
    except ConfigProblems:
        known_targets = None  # the policy can still be shown for its defaults; `gateway check` explains
    known = KnownNames.of(known_targets, RoleBook(settings.roles_file).roles(), tool_categories())
    missing = settings.missing_named_files()
    for line in missing:
        print(line, file=sys.stderr)
    if missing:  # a mistyped --rules must not show the built-in defaults as if they were the file's
        report: dict[str, object] = {"file": str(settings.rules_file), "status": "error", "errors": missing,
                                     "effect": "nothing shown: the files named do not exist"}
    else:
        report = describe(PolicyStore(settings.rules_file), known_targets or (), known)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        print(yaml.safe_dump(json.loads(json.dumps(report, default=str)), sort_keys=False), end="")
    return 1 if report.get("status") == "error" else 0


# -- policy test ----------------------------------------------------------------------------------------


def run_test(args: argparse.Namespace) -> int:
    settings = settings_from(args, rules=args.current)
    code, result = replay_files(settings, Path(args.candidate), settings.rules_file, since=args.since,
                                until=args.until, examples=args.examples)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print_replay(result)
    return code


def replay_files(settings: Settings, candidate: Path, current: Path, *, since: datetime | None = None,
                 until: datetime | None = None, examples: int = EXAMPLES) -> tuple[int, dict[str, Any]]:
    """Replay the calls the audit log of ``settings`` holds from ``since`` (default: the last
    ``DEFAULT_SINCE``) to ``until`` through ``candidate`` and ``current``: the exit status and the
    result as JSON values (``errors`` when it could not run)."""
    since = since or parse_when(DEFAULT_SINCE)
    head: dict[str, Any] = {"candidate": str(candidate), "current": str(current),
                            "since": _iso(since), "until": _iso(until)}
    problems: list[str] = []
    rules: list[Policy] = []
    for path, which in ((candidate, "candidate"), (current, "rules in force")):
        policy, found = _rules(path, which, must_exist=which == "candidate")
        problems += found
        if policy is not None:
            rules.append(policy)
    if problems:
        return CANNOT_REPLAY, {**head, "ok": False, "errors": problems}
    world, targets, warnings = world_of(settings)
    known = KnownNames.of(targets, world.roles, tool_categories())
    warnings += [f"warning: {u}" for u in unknown_names(rules[0].refs, known)]
    warnings += [f"warning: {p}" for p in unreachable_rules(rules[0], tool_categories())]
    if rules[1].builtin:
        warnings.append(f"warning: {current} does not exist: the calls are compared with the built-in strict "
                        "defaults, as the gateway would decide them")
    rows: list[dict[str, Any]] = []
    with reading(argparse.Namespace(), settings) as (reader, failed):
        rows = reader.rows(since=since, until=until)
        head["audit"] = reader.where
    if failed:
        return CANNOT_REPLAY, {**head, "ok": False, "errors": ["the audit log could not be read (see above)"]}
    report = replay(rows, rules[1], rules[0], world, examples=examples)
    result = {**head, "ok": True, "warnings": warnings, "notes": list(REPLAY_NOTES), **report.to_dict()}
    return (1 if report.changes else 0), result


def _rules(path: Path, which: str, *, must_exist: bool) -> tuple[Policy | None, list[str]]:
    """The rules of ``path`` as the server would read them, or their problems (``file:line`` each)."""
    if must_exist and not path.is_file():
        return None, [f"{path}: the {which} rules file does not exist"]
    try:
        return PolicyStore(path).current(), []
    except ConfigError as exc:
        found = exc.details.get("problems") or [exc.message]
        return None, [*found, f"{path}: the {which} rules file cannot be used; nothing was replayed"]


def world_of(settings: Settings) -> tuple[World, tuple[Target, ...] | None, list[str]]:
    """Today's tools, roles and targets' tags (what the replay rebuilds each call's facts in), the
    targets (None: targets.yaml cannot be read) and what is wrong with the files."""
    warnings: list[str] = []
    targets: tuple[Target, ...] | None
    try:
        targets = load_targets(settings.targets_file)
    except ConfigProblems as exc:
        targets = None
        warnings += [f"warning: {p}" for p in exc.problems]
        warnings.append("warning: without targets.yaml no call can be replayed (the targets and their tags "
                        "are unknown)")
    book = RoleBook(settings.roles_file)
    warnings += [f"warning: {p}" for p in book.check()]
    tools = {spec.name: ToolFacts(spec.kind, spec.risk, spec.target_mode != "none", spec.reaches)
             for spec in all_tools(destructive=True)}
    tags = {t.name: tuple(t.tags) for t in targets or ()}
    return World(tools, book.roles(), tags), targets, warnings


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def print_replay(result: Mapping[str, Any]) -> None:
    """``policy test``'s text: the changes by kind and candidate rule with their calls on stdout; the
    calls not replayed, warnings and errors on stderr."""
    for line in result.get("errors", ()):
        print(line, file=sys.stderr)
    for line in result.get("warnings", ()):
        print(line, file=sys.stderr)
    if not result.get("ok"):
        return
    print(f"{result['candidate']} against {result['current']} (in force): calls in {result['audit']} since "
          f"{result['since']}{' until ' + result['until'] if result['until'] else ''}")
    print(f"{result['changed']} of {result['calls']} calls replayed would be decided otherwise "
          f"({result['rows']} rows read, {result['not_replayed']} calls not replayed)")
    for group in result["groups"]:
        was = ", ".join(f"{rule} {n}" for rule, n in group["current_rules"].items())
        print(f"\n{group['change']}: {group['count']} call{'s' if group['count'] != 1 else ''} by "
              f"{_cell(group['rule'])} (in force: {_cell(was)})")
        for change in group["examples"]:
            print(f"  {_call_line(change)}")
        more = group["count"] - len(group["examples"])
        if more > 0:
            print(f"  ... and {more} more (--examples 0 lists every one; --json lists them all)")
    for entry in result["reasons_not_replayed"]:
        count = entry["count"]
        print(f"not replayed: {count} call{'s' if count != 1 else ''}: {_cell(entry['reason'])}",
              file=sys.stderr)
        for call in entry["examples"][:3]:
            print(f"  {_call_line(call)}", file=sys.stderr)
    for note in result["notes"]:
        print(f"note: {note}", file=sys.stderr)


def _call_line(call: Mapping[str, Any]) -> str:
    ts = str(call.get("ts") or "")[:19].replace("T", " ")
    parts: Sequence[Any] = (f"seq {call.get('seq')}", ts, call.get("caller"), call.get("target"),
                            call.get("tool"), f"(recorded: {call.get('recorded')})")
    return "  ".join(_cell(p) for p in parts)


def _cell(value: Any) -> str:
    """Text from rows made safe for a terminal: hidden characters escaped, one line, bounded."""
    return clean_text(str(value), 120).replace("\n", "\\n").replace("\t", "\\t")
