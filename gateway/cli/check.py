"""``gateway check``: validate every configuration file and print each problem once.

Each problem is one ``file:line:column: ...; the fix`` line, then the names one file uses that
another does not define. Missing credentials are warnings (problems with ``--require-credentials``),
since linting needs no secrets. Exit 1 on any problem.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway import notify
from gateway.audit import syslog_config
from gateway.auth.roles import RoleBook
from gateway.cli import add_path_flags, policy, settings_from
from gateway.cli.audit import parse_when
from gateway.config import ConfigProblems, NameRef, Target, load_targets
from gateway.errors import ConfigError
from gateway.guard.names import KnownNames, unknown_names
from gateway.guard.policy.read_filter import unreachable_rules
from gateway.guard.policy.store import PolicyStore
from gateway.identity.config import load_identity
from gateway.role import BUILTIN_ROLES
from gateway.settings import Settings
from gateway.tools.exposure import allow_write_names
from gateway.tools.registry import tool_categories


def register(sub: Any) -> None:
    what = ("validate targets.yaml, rules.yaml, roles.yaml, notifications.yaml, identity.yaml and "
            "syslog.yaml (exit 1 on any problem; no secrets needed)")
    parser: argparse.ArgumentParser = sub.add_parser(
        "check", help=what, description=f"{what[0].upper()}{what[1:]}, and the seed's variable names set "
                                        "without their GATEWAY_* equivalent (warnings).")
    parser.add_argument("--strict", action="store_true",
                        help="a seed variable set without its GATEWAY_* equivalent (ENABLE_DESTRUCTIVE, "
                             "POLICY_FILE, ...) is a problem, not a warning")
    parser.add_argument("--require-credentials", action="store_true", dest="require_credentials",
                        help="a target's or channel's missing secret variable is a problem, not a warning "
                             "(what `serve` needs)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (see the module doc)")
    parser.add_argument("--replay", nargs="?", const=policy.DEFAULT_SINCE, type=parse_when, metavar="SINCE",
                        help="also replay the audited calls since SINCE (default "
                             f"{policy.DEFAULT_SINCE}) through the --rules file and the rules in force, as "
                             "`gateway policy test` does (exit 2: the rules file is broken, 1: a problem or "
                             "a call decided otherwise)")
    add_path_flags(parser)
    parser.set_defaults(handler=run)


class StandInSecrets(Mapping[str, str]):
    """The environment for linting a notifications file: a ``*_SECRET`` or ``*_URL`` variable that is
    not set reads as a harmless stand-in (an https URL), and its name is remembered in ``missing``."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.missing: list[str] = []

    def __getitem__(self, key: str) -> str:
        if self.environ.get(key):
            return self.environ[key]
        if key.endswith(("_SECRET", "_URL")):
            self.missing.append(key)
            return "https://stand-in.invalid/" if key.endswith("_URL") else "stand-in"
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.environ)

    def __len__(self) -> int:
        return len(self.environ)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: list[dict[str, str]] = field(default_factory=list)

    def file(self, name: str, path: Path, status: str, summary: str) -> None:
        self.files.append({"file": name, "path": str(path), "status": status, "summary": summary})


def check_targets(settings: Settings, report: Report, strict: bool) -> tuple[Target, ...] | None:
    """targets.yaml as serve reads it; without ``strict`` a missing credential is a warning (the
    problems the environment adds to those of the file alone)."""
    path = settings.targets_file
    targets: tuple[Target, ...] | None = None
    try:
        targets = load_targets(path)
        shape: list[str] = []
    except ConfigProblems as exc:
        shape = exc.problems
    try:
        load_targets(path, settings.credentials)
        secrets: list[str] = []
    except ConfigProblems as exc:
        secrets = [p for p in exc.problems if p not in shape]
    report.problems += shape + (secrets if strict else [])
    if not strict:
        report.warnings += [f"warning: {p} (needed by `serve`, not by this check)" for p in secrets]
    bad = shape or (secrets and strict)
    count = f"targets: {len(targets)} in {path}" if targets is not None else f"targets: {path} has problems"
    report.file("targets", path, "error" if bad else "ok", count)
    return targets


def check_notifications(settings: Settings, report: Report, strict: bool) -> None:
    path = settings.notifications_file
    if path is None or not path.exists():
        if path is not None and path not in settings.named_files:
            report.file("notifications", path, "absent", f"notifications: {path} absent; no channel")
        return
    environ: Mapping[str, str] = settings.notify_env if strict else StandInSecrets(settings.notify_env)
    try:
        config = notify.load(path, environ)
    except ConfigError as exc:
        report.problems += exc.details.get("problems") or [exc.message]
        report.file("notifications", path, "error", f"notifications: {path} has problems")
        return
    for name in dict.fromkeys(getattr(environ, "missing", [])):
        report.warnings.append(f"warning: {path}: the environment variable {name} is not set (needed by "
                               "`serve`, not by this check)")
    report.file("notifications", path, "ok", f"notifications: {len(config.channels)} channel(s) in {path}")


def check_environment(settings: Settings, report: Report, strict: bool) -> None:
    """The seed variables set without their GATEWAY_* equivalent (warnings; problems with ``strict``),
    and a GATEWAY_ALLOW_WRITE that ``serve`` would refuse."""
    if strict:
        report.problems += list(settings.seed_warnings)
    else:
        report.warnings += [f"warning: {line}" for line in settings.seed_warnings]
    if settings.allow_write_env is not None:
        try:
            allow_write_names(settings.allow_write_env, "GATEWAY_ALLOW_WRITE")
        except ValueError as exc:
            report.problems.append(f"GATEWAY_ALLOW_WRITE={settings.allow_write_env!r}: {exc}")
        if not settings.read_only:
            report.problems.append("GATEWAY_ALLOW_WRITE narrows read-only mode (reads plus those writes); "
                                   "without GATEWAY_READ_ONLY=true every write tool is offered already: set "
                                   "it, or unset GATEWAY_ALLOW_WRITE (`serve` refuses this)")


def survey(settings: Settings, strict: bool, strict_environment: bool = False) -> Report:
    report = Report()
    check_environment(settings, report, strict_environment)
    refs: list[NameRef] = []
    targets = check_targets(settings, report, strict)
    report.problems += settings.missing_named_files()
    rules = settings.rules_file
    if rules.exists():
        try:
            policy = PolicyStore(rules).current()
            refs += policy.refs
            unreachable = unreachable_rules(policy, tool_categories())
            report.problems += unreachable
            report.file("rules", rules, "error" if unreachable else "ok", f"rules: {rules} ok")
        except ConfigError as exc:
            report.problems += exc.details.get("problems") or [exc.message]
            report.file("rules", rules, "error", f"rules: {rules} has problems")
    elif rules in settings.named_files:
        report.file("rules", rules, "error", f"rules: {rules} does not exist")
    else:
        report.file("rules", rules, "absent", f"rules: {rules} absent; built-in strict defaults apply "
                                              "(destructive denied)")
    role_names: list[str] = list(BUILTIN_ROLES)
    roles = settings.roles_file
    if roles.exists():
        role_problems, custom, role_refs = RoleBook(roles).survey()
        report.problems += role_problems
        refs += role_refs
        role_names += custom
        if not role_problems:
            report.file("roles", roles, "ok", f"roles: {roles} ok")
        else:  # a rule naming a custom role is not reported while the roles file itself is broken
            refs = [r for r in refs if r.kind != "role"]
            report.file("roles", roles, "error", f"roles: {roles} has problems")
    elif roles in settings.named_files:
        report.file("roles", roles, "error", f"roles: {roles} does not exist")
    else:
        report.file("roles", roles, "absent", f"roles: {roles} absent; built-in roles reader and admin only")
    check_notifications(settings, report, strict)
    check_identity(settings.identity_file, report, role_names)
    check_syslog(settings.syslog_file, report)
    known = KnownNames.of(targets, role_names, tool_categories())
    report.problems += [str(u) for u in unknown_names(refs, known)]
    report.problems = list(dict.fromkeys(report.problems))
    for entry in report.files:  # a file with a problem is not "ok"
        if entry["status"] == "ok" and any(p.startswith(entry["path"]) for p in report.problems):
            entry["status"] = "error"
    return report


def run(args: argparse.Namespace) -> int:
    report = survey(settings_from(args), bool(args.require_credentials), bool(args.strict))
    if args.replay is not None:
        return run_replay(args, report)
    if args.json:
        print(json.dumps({"ok": not report.problems, "problems": report.problems, "warnings": report.warnings,
                          "files": report.files}, indent=2))
        return 1 if report.problems else 0
    for entry in report.files:
        if entry["status"] != "error":
            print(entry["summary"])
    for line in [*report.warnings, *report.problems]:
        print(line, file=sys.stderr)
    if report.problems:
        print(f"gateway check: {len(report.problems)} problem(s); fix them and run it again", file=sys.stderr)
    return 1 if report.problems else 0


def check_identity(path: Path | None, report: Report, role_names: list[str]) -> None:
    """identity.yaml (absent: gateway tokens only, and nothing to say), and every role its mappings name."""
    if path is None:
        return
    try:
        config = load_identity(path)
    except ConfigProblems as exc:
        report.problems += exc.problems
        report.file("identity", path, "error", f"identity: {path} has problems")
        return
    if config is None:
        return
    report.problems += [
        f"{where}: issuer {i.issuer}: roles: {value!r} maps to the role {role!r}, which is not defined; "
        "define it in roles.yaml or map to another role"
        for i in config.issuers for (value, role), where in zip(i.roles, i.role_places, strict=True)
        if role not in role_names]
    report.file("identity", path, "ok", f"identity: {path} ok ({len(config.issuers)} issuer(s))")


def check_syslog(path: Path | None, report: Report) -> None:
    """syslog.yaml (gateway.audit.syslog_config); absent: no forwarding, and nothing to say."""
    if path is None or not path.exists():
        return
    try:
        config = syslog_config.load(path)
    except ConfigError as exc:
        report.problems += list(exc.details.get("problems") or [exc.message])
        report.file("syslog", path, "error", f"syslog: {path} has problems")
        return
    if config is not None:
        report.file("syslog", path, "ok", f"syslog: audit rows forwarded to the {config.where}")


def run_replay(args: argparse.Namespace, report: Report) -> int:
    """``check --replay``: the check, then the replay of ``gateway policy test`` with the --rules file as
    the candidate and the rules the gateway reads without the flag (GATEWAY_RULES_FILE, else
    $GATEWAY_HOME/rules.yaml) in force. Exit 2 while the rules file is broken (nothing is replayed),
    else 1 on a problem or a call decided otherwise."""
    settings = settings_from(args)
    in_force = settings_from(args, rules=None)  # the rules file the gateway reads without --rules
    broken = any(entry["file"] == "rules" and entry["status"] == "error" for entry in report.files)
    code, result = (policy.CANNOT_REPLAY, {"ok": False, "errors": ["the rules file has problems (above); "
                                                                   "nothing was replayed"]}) if broken \
        else policy.replay_files(settings, settings.rules_file, in_force.rules_file, since=args.replay)
    if args.json:
        print(json.dumps({"ok": not report.problems and code == 0, "problems": report.problems,
                          "warnings": report.warnings, "files": report.files, "replay": result}, indent=2))
    else:
        for entry in report.files:
            if entry["status"] != "error":
                print(entry["summary"])
        for line in [*report.warnings, *report.problems]:
            print(line, file=sys.stderr)
        policy.print_replay(result)
    if code == policy.CANNOT_REPLAY:
        return policy.CANNOT_REPLAY
    return 1 if report.problems or code else 0
