"""``gateway roles``: check roles.yaml and the tokens against it, list the roles in force."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from gateway.auth.roles import RoleBook
from gateway.backends import engine_of, open_store
from gateway.cli import add_path_flags, settings_from
from gateway.cli.output import print_json
from gateway.config import ConfigProblems, Target, load_targets
from gateway.guard.names import KnownNames, unknown_names
from gateway.role import BUILTIN_ROLES
from gateway.settings import Settings
from gateway.tools.registry import tool_categories


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("roles", help="check or list roles")
    actions = parser.add_subparsers(dest="roles_action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="exit 1 if roles.yaml is broken, names a tool or target that "
                                             "does not exist, or a token's role is undefined")
    check.add_argument("--json", action="store_true",
                       help='print {"ok", "problems", "roles_file", "custom_roles"} instead of lines')
    check.set_defaults(handler=run_check)
    listing = actions.add_parser("list", help="the built-in roles and those of roles.yaml")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(handler=run_list)
    for action in (check, listing):
        add_path_flags(action)


def token_problems(settings: Settings, book: RoleBook) -> list[str]:
    """Usable tokens whose role is not defined (they are refused on every call)."""
    if not engine_of(settings).exists(settings):
        return []
    store = open_store(settings)
    try:
        tokens = store.list_tokens()
    finally:
        store.close()
    now = time.time()
    return [f"token {t.name!r} has role {t.role!r}, which is not defined, so every call with it is refused; "
            f"define the role in {settings.roles_file} or run `gateway token set-role {t.name} ROLE`"
            for t in tokens if t.usable(now) and book.get(t.role) is None]


def run_check(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    book = RoleBook(settings.roles_file)
    problems, _, refs = book.survey()
    # While the file is broken every custom role counts as undefined: report the file, not each token.
    if not problems:
        targets: tuple[Target, ...] | None = None
        with contextlib.suppress(ConfigProblems):  # `gateway check` explains a broken targets.yaml
            targets = load_targets(settings.targets_file)
        problems = [str(u) for u in unknown_names(refs, KnownNames.of(targets, (), tool_categories()))]
        problems += token_problems(settings, book)
    custom = sorted(set(book.roles()) - set(BUILTIN_ROLES))
    if args.json:
        print_json({"ok": not problems, "problems": problems, "roles_file": str(settings.roles_file),
                    "custom_roles": custom})
        return 1 if problems else 0
    for problem in problems:
        print(problem)
    if problems:
        return 1
    source = f"{settings.roles_file}: {len(custom)} custom role(s)" if settings.roles_file.exists() else \
        f"{settings.roles_file} absent: built-in roles only"
    print(f"{source}; every usable token names a defined role")
    return 0


def run_list(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    book = RoleBook(settings.roles_file)
    catalog = tool_categories()
    rows = [{**role.describe(catalog),
             "source": "built-in" if name in BUILTIN_ROLES else str(settings.roles_file)}
            for name, role in book.roles().items()]
    for row in rows:
        if args.json:
            print(json.dumps(row, sort_keys=True))
            continue
        print(f"{row['name']}  ({row['source']})")
        for key in ("tools", "allow_write", "allow_destructive", "targets", "approve", "audit"):
            value = row[key]
            print(f"    {key}: {value if isinstance(value, str) else ', '.join(value) or '-'}")
    problems = book.check()
    if problems:
        print(f"custom roles are off until roles.yaml is fixed ({len(problems)} problem(s)); "
              "see `gateway roles check`")
    return 0
