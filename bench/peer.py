"""The peer in the benchmark: the PyPI package ``vmware-monitor``, run from its own venv (bench/.peer-venv).

Run by bench/run_all.py with that venv's Python, never imported by the gateway (it is not a dependency):

    peer.py list  --host H --port P --user U --runs N     median seconds of its VM listing function
                                                          (``vmware_monitor.ops.inventory.list_vms``
                                                          on one pyVmomi session), as one JSON line
    peer.py serve --host H --port P --user U --listen L --cert C --key K --home DIR
                                                          its MCP server over HTTPS on 127.0.0.1:L,
                                                          after printing ``TOKEN=<bearer token>``

The simulator's password comes in ``PEER_PASSWORD``. HOME and OPS_HOME should point at a scratch folder:
the package reads and rewrites files under them (``~/.vmware-monitor/.env``, ``$OPS_HOME/mcp-tokens``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

VENV = Path(__file__).resolve().parent / ".peer-venv"
PACKAGE = "vmware-monitor"
TARGET = "sim"  # the target's name in the peer's config.yaml


def list_median(args: argparse.Namespace) -> None:
    from pyVim.connect import Disconnect, SmartConnect
    from vmware_monitor.ops.inventory import list_vms

    si = SmartConnect(host=args.host, port=args.port, user=args.user, pwd=os.environ["PEER_PASSWORD"],
                      disableSslCertValidation=True)
    try:
        total = list_vms(si)["total"]  # warm-up, not timed
        samples = []
        for _ in range(args.runs):
            started = time.perf_counter()
            total = list_vms(si)["total"]
            samples.append(time.perf_counter() - started)
    finally:
        Disconnect(si)
    print(json.dumps({"median_s": statistics.median(samples), "count": total}))


def serve(args: argparse.Namespace) -> None:
    from vmware_policy.tokens import create_token

    home = Path(args.home)
    config = home / "config.yaml"
    config.write_text(f"targets:\n  - name: {TARGET}\n    host: {args.host}\n    port: {args.port}\n"
                      f"    username: {args.user}\n    verify_ssl: false\n")
    os.environ.update({"VMWARE_MONITOR_CONFIG": str(config),
                       f"VMWARE_{TARGET.upper()}_PASSWORD": os.environ["PEER_PASSWORD"]})
    tokens = home / "mcp-tokens"
    print(f"TOKEN={create_token('bench', tokens)}", flush=True)
    from vmware_monitor.mcp_server.server import main

    main(transport="https", host="127.0.0.1", port=args.listen, cert=args.cert, key=args.key,
         public_name="localhost", token_file=str(tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("list", "serve"))
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--listen", type=int)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--home")
    args = parser.parse_args()
    {"list": list_median, "serve": serve}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
