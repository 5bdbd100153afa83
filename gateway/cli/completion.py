"""``gateway completion bash|zsh``: a shell completion script generated from the command's own parser."""

from __future__ import annotations

import argparse
import sys
from typing import Any

SHELLS = ("bash", "zsh")


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "completion", help="print a bash or zsh completion script",
        description="Print a completion script for SHELL on stdout (generated from this command's parser).")
    parser.add_argument("shell", choices=SHELLS, help="bash or zsh")
    parser.set_defaults(handler=run)


def script(shell: str) -> str:
    """The completion script of ``gateway`` for ``shell``."""
    import shtab

    from gateway.cli import build_parser

    text: str = shtab.complete(build_parser(), shell=shell)
    return text


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.shell))
    return 0
