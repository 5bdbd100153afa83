"""``gateway db upgrade``: run the schema migrations the state database lacks and print its version.

Refuses a schema newer than this gateway; names the database without its password.
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.backends import engine_of, open_store
from gateway.cli import add_path_flags, settings_from
from gateway.settings import Settings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("db", help="the state database's schema migrations")
    commands = parser.add_subparsers(dest="db_command", required=True, metavar="SUBCOMMAND")
    upgrade = commands.add_parser("upgrade", help="run the schema migrations the database lacks")
    upgrade.set_defaults(handler=run_upgrade)
    add_path_flags(upgrade)


def describe(settings: Settings) -> tuple[str, int]:
    """(the database as it may be shown, the newest schema version this gateway knows)."""
    return engine_of(settings).describe(settings)


def run_upgrade(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    where, known = describe(settings)
    store = open_store(settings)  # opening migrates (and refuses a newer schema)
    try:
        version = store.schema_version()
    finally:
        store.close()
    print(f"{where}: schema version {version} (this gateway knows up to {known})")
    return 0
