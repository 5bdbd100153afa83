"""``gateway cert create``: a self-signed certificate and key for the HTTPS transport.

For first steps and tests; production uses a certificate from its own CA.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.server.edge.tls import create_certificate


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("cert", help="make a self-signed TLS certificate")
    actions = parser.add_subparsers(dest="cert_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="write cert.pem and key.pem (0600) into --out")
    create.add_argument("--name", action="append", default=[], dest="names", metavar="NAME",
                        help="DNS name clients connect to (repeat for several)")
    create.add_argument("--ip", action="append", default=[], dest="ips", metavar="ADDR",
                        help="IP address clients connect to (repeat for several)")
    create.add_argument("--out", required=True, type=Path, help="directory for cert.pem and key.pem")
    create.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    create.add_argument("--force", action="store_true", help="replace existing files")
    create.set_defaults(handler=run_create)


def run_create(args: argparse.Namespace) -> int:
    paths = create_certificate(args.out, args.names, args.ips, days=args.days, force=args.force)
    print(f"certificate: {paths.cert}\nkey:         {paths.key} (both mode 0600)")
    names = " ".join(f"--public-name {n}" for n in args.names or args.ips)
    print(f"serve with: gateway serve --transport https --cert {paths.cert} --key {paths.key} {names}",
          file=sys.stderr)
    return 0
