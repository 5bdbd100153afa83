"""``gateway check``: validate every configuration file and print each problem once.

Each problem is one line on stderr, ``file:line:column: where in the file: what is wrong; the fix``,
in the order of the files (targets.yaml, rules.yaml, roles.yaml, syslog.yaml), then the names one file
uses for what another defines (a target, tool, role or tag) that match nothing (``gateway.guard.names``), and
the rules whose object fields can never apply to the tools they name (``gateway.guard.policy.read_filter``).
A short summary of each good file goes to stdout. Exit 1 on any problem.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from gateway.audit import syslog_config
from gateway.auth.roles import RoleBook
from gateway.cli import add_path_flags, settings_from
from gateway.config import ConfigProblems, NameRef, Target, load_targets
from gateway.errors import ConfigError
from gateway.guard.names import KnownNames, unknown_names
from gateway.guard.policy.read_filter import unreachable_rules
from gateway.guard.policy.store import PolicyStore
from gateway.identity.config import load_identity
from gateway.role import BUILTIN_ROLES
from gateway.tools.registry import tool_categories


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "check", help="validate targets.yaml, rules.yaml and roles.yaml (exit 1 on any problem)"
    )
    add_path_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    problems: list[str] = []
    summary: list[tuple[Path, str]] = []
    refs: list[NameRef] = []
    targets: tuple[Target, ...] | None = None
    try:
        targets = load_targets(settings.targets_file, settings.credentials)
        summary.append((settings.targets_file, f"targets: {len(targets)} in {settings.targets_file}"))
    except ConfigProblems as exc:
        problems += exc.problems
        with contextlib.suppress(ConfigProblems):  # names can still be checked without credentials
            targets = load_targets(settings.targets_file)
    if settings.rules_file.exists():
        try:
            policy = PolicyStore(settings.rules_file).current()
            refs += policy.refs
            problems += unreachable_rules(policy, tool_categories())
            summary.append((settings.rules_file, f"rules: {settings.rules_file} ok"))
        except ConfigError as exc:
            problems += exc.details.get("problems") or [exc.message]
    else:
        summary.append((settings.rules_file, f"rules: {settings.rules_file} absent; built-in strict "
                                             "defaults apply (destructive denied)"))
    role_names: list[str] = list(BUILTIN_ROLES)
    if settings.roles_file.exists():
        role_problems, custom, role_refs = RoleBook(settings.roles_file).survey()
        problems += role_problems
        refs += role_refs
        role_names += custom
        if not role_problems:
            summary.append((settings.roles_file, f"roles: {settings.roles_file} ok"))
        else:  # a rule naming a custom role is not reported while the roles file itself is broken
            refs = [r for r in refs if r.kind != "role"]
    else:
        summary.append((settings.roles_file, f"roles: {settings.roles_file} absent; built-in roles reader "
                                             "and admin only"))
    problems += _identity_problems(settings.identity_file, summary, role_names)
    problems += _check_syslog(settings.syslog_file, summary)
    known = KnownNames.of(targets, role_names, tool_categories())
    problems += [str(u) for u in unknown_names(refs, known)]
    problems = list(dict.fromkeys(problems))
    for path, line in summary:
        if not any(p.startswith(str(path)) for p in problems):  # a file with a problem is not "ok"
            print(line)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"gateway check: {len(problems)} problem(s); fix them and run it again", file=sys.stderr)
    return 1 if problems else 0


def _identity_problems(path: Path | None, summary: list[tuple[Path, str]],
                       role_names: list[str]) -> list[str]:
    """identity.yaml (absent: gateway tokens only), and every role its mappings name."""
    if path is None:
        return []
    try:
        config = load_identity(path)
    except ConfigProblems as exc:
        return exc.problems
    if config is None:  # absent: gateway tokens only, and nothing to say (as before identity.yaml)
        return []
    summary.append((path, f"identity: {path} ok ({len(config.issuers)} issuer(s))"))
    return [f"{where}: issuer {i.issuer}: roles: {value!r} maps to the role {role!r}, which is not defined; "
            "define it in roles.yaml or map to another role"
            for i in config.issuers for (value, role), where in zip(i.roles, i.role_places, strict=True)
            if role not in role_names]


def _check_syslog(path: Path | None, summary: list[tuple[Path, str]]) -> list[str]:
    """syslog.yaml's problems (gateway.audit.syslog_config); none, and nothing said, without the file."""
    if path is None or not path.exists():
        return []
    try:
        config = syslog_config.load(path)
    except ConfigError as exc:
        return list(exc.details.get("problems") or [exc.message])
    if config is not None:
        summary.append((path, f"syslog: audit rows forwarded to the {config.where}"))
    return []
