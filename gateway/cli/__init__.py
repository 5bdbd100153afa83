"""The ``gateway`` command. Each command group lives in its own module exposing ``register``."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from gateway.cli.output import quiet_on_broken_pipe
from gateway.errors import GatewayError
from gateway.logs import cli_log_level, configure_logging, flush_logs
from gateway.settings import Settings, logging_options

#: command modules, in the order ``gateway --help`` lists them
COMMAND_MODULES = ("serve", "check", "doctor", "token", "roles", "pending", "audit", "policy", "cert", "db",
                   "bootstrap-token", "completion")

#: commands whose module is named otherwise
MODULE_NAMES = {"bootstrap-token": "bootstrap"}


def add_path_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every command that reads configuration shares (each mirrors a GATEWAY_* variable)."""
    parser.add_argument("--home", help="state directory (GATEWAY_HOME, default ~/.gateway)")
    parser.add_argument("--targets", help="targets.yaml (GATEWAY_TARGETS_FILE)")
    parser.add_argument("--rules", help="rules.yaml (GATEWAY_RULES_FILE)")
    parser.add_argument("--roles", help="roles.yaml (GATEWAY_ROLES_FILE)")
    parser.add_argument("--audit-log", dest="audit_log", help="audit JSONL file (GATEWAY_AUDIT_LOG)")
    parser.add_argument("--database-url", dest="database_url", metavar="postgresql://USER@HOST/DB",
                        help="shared state on PostgreSQL for several replicas (GATEWAY_DATABASE_URL; "
                             "no password here: use PGPASSFILE); unset: SQLite under --home")
    add_verbose_flag(parser)


def add_verbose_flag(parser: argparse.ArgumentParser, default: object = argparse.SUPPRESS) -> None:
    """``-v/--verbose``: log to stderr at INFO (commands other than serve log nothing unless asked)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="log to stderr at INFO (GATEWAY_LOG_LEVEL sets any level)")


def settings_from(args: argparse.Namespace, **extra: object) -> Settings:
    names = ("home", "targets", "rules", "roles", "audit_log", "database_url")
    flags = {k: getattr(args, k, None) for k in names}
    flags.update(extra)
    return Settings.from_env(os.environ, **flags)


def version() -> str:
    """The installed package's version (pyproject.toml's), or "unknown" outside an installation."""
    try:
        return importlib.metadata.version("vsphere-mcp-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed; run `make venv`)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="vSphere MCP Gateway")
    add_verbose_flag(parser, default=False)
    parser.add_argument("--version", action="version", version=f"gateway {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # none: the help, exit 0
    for name in COMMAND_MODULES:
        module_name = f"gateway.cli.{MODULE_NAMES.get(name, name)}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `gateway`: what it can do, not a usage error
        parser.print_help()
        return 0
    try:
        log_format, _ = logging_options(os.environ)
        configure_logging(log_format, cli_log_level(args.command, bool(args.verbose), os.environ))
        return quiet_on_broken_pipe(lambda: int(args.handler(args) or 0))
    except GatewayError as exc:
        flush_logs()  # the command's log lines before its last word
        print(f"gateway: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        flush_logs()  # a command's log lines are written when it returns (a thread writes them)


if __name__ == "__main__":
    raise SystemExit(main())
