"""``gateway check``: validate every configuration file and print each problem found."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.auth.roles import RoleBook
from gateway.cli import add_path_flags, settings_from
from gateway.config import ConfigProblems, load_targets
from gateway.errors import ConfigError
from gateway.guard.policy import PolicyStore


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "check", help="validate targets.yaml, rules.yaml and roles.yaml (exit 1 on any problem)"
    )
    add_path_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    problems: list[str] = []
    try:
        targets = load_targets(settings.targets_file, settings.credentials)
        print(f"targets: {len(targets)} in {settings.targets_file}")
    except ConfigProblems as exc:
        problems += exc.problems
    if settings.rules_file.exists():
        try:
            PolicyStore(settings.rules_file).current()
            print(f"rules: {settings.rules_file} ok")
        except ConfigError as exc:
            problems.append(f"{settings.rules_file}: {exc.message}")
    else:
        print(f"rules: {settings.rules_file} absent; built-in strict defaults apply (destructive denied)")
    if settings.roles_file.exists():
        role_problems = RoleBook(settings.roles_file).check()
        problems += role_problems
        if not role_problems:
            print(f"roles: {settings.roles_file} ok")
    else:
        print(f"roles: {settings.roles_file} absent; built-in roles reader and admin only")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0
