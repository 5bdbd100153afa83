"""``gateway policy show``: the effective policy per target, or why rules.yaml cannot be used."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from gateway.auth.roles import RoleBook
from gateway.cli import add_path_flags, settings_from
from gateway.config import ConfigProblems, Target, load_targets
from gateway.guard.names import KnownNames
from gateway.guard.policy.describe import describe
from gateway.guard.policy.store import PolicyStore
from gateway.tools.registry import tool_categories


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("policy", help="inspect the policy in force")
    actions = parser.add_subparsers(dest="policy_action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="effective policy per target (exit 1 while rules.yaml is broken)")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    add_path_flags(show)
    show.set_defaults(handler=run_show)


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
