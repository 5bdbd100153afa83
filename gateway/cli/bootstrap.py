"""``gateway bootstrap-token``: print a new token for ``GATEWAY_BOOTSTRAP_TOKEN_FILE``.

Nothing is stored: ``gateway serve`` adopts it as the admin token ``bootstrap`` on a state with no
usable token.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.auth.tokens import new_token


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "bootstrap-token", help="print a new token for GATEWAY_BOOTSTRAP_TOKEN_FILE (stores nothing)")
    parser.set_defaults(handler=run)


def run(_args: argparse.Namespace) -> int:
    print(new_token())
    print("put it in the file GATEWAY_BOOTSTRAP_TOKEN_FILE names (a Secret); serve adopts it as the admin "
          "token 'bootstrap' on a fresh state", file=sys.stderr)
    return 0
