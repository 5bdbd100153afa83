"""``gateway audit checkpoint|prove|verify-proof``: the audit log's Merkle tree from the command line.

``verify-proof`` needs only the public key, the checkpoint note(s) and the row: no log, no settings.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gateway.audit.proofs import (
    check_consistency,
    check_inclusion,
    consistency_proof,
    inclusion_proof,
    latest_note,
    open_signed,
)
from gateway.cli import add_path_flags
from gateway.cli.audit_reading import public_key_arg, reading
from gateway.errors import GatewayError


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    checkpoint_cmd = commands.add_parser("checkpoint", help="print the newest signed checkpoint note exactly")
    add_path_flags(checkpoint_cmd)
    checkpoint_cmd.set_defaults(handler=show_checkpoint)

    prove_cmd = commands.add_parser(
        "prove", help="an inclusion proof of row SEQ (or a consistency proof) against the newest checkpoint")
    add_path_flags(prove_cmd)
    prove_cmd.add_argument("seq", nargs="?", type=int, metavar="SEQ", help="the row to prove")
    prove_cmd.add_argument("--consistency", nargs="+", type=int, metavar="SIZE",
                           help="OLD [NEW]: prove the tree of OLD rows is a prefix of NEW's (default: the "
                                "newest checkpoint's size)")
    prove_cmd.add_argument("--json", action="store_true", help="print the proof as one JSON object")
    prove_cmd.set_defaults(handler=run_prove)

    check_cmd = commands.add_parser(
        "verify-proof", help="check a proof offline with the public key, the checkpoint and the row")
    check_cmd.add_argument("--public-key", dest="public_key", type=public_key_arg, required=True,
                           metavar="KEY",
                           help="ed25519:HEX or a note verifier key (`gateway audit key --note`)")
    check_cmd.add_argument("--checkpoint", type=Path, required=True, metavar="FILE",
                           help="the signed checkpoint note the proof is against (the newer one)")
    check_cmd.add_argument("--proof", type=Path, required=True, metavar="FILE",
                           help="the proof JSON (`gateway audit prove ... --json`)")
    check_cmd.add_argument("--row", type=Path, metavar="FILE",
                           help="the row exactly as stored (its JSONL line): for an inclusion proof")
    check_cmd.add_argument("--old-checkpoint", dest="old_checkpoint", type=Path, metavar="FILE",
                           help="the older signed checkpoint note: for a consistency proof")
    check_cmd.set_defaults(handler=run_verify_proof)


def show_checkpoint(args: argparse.Namespace) -> int:
    with reading(args) as (reader, failed):
        note = _or_error(lambda: latest_note(reader))
    if failed or note is None:
        return 1
    sys.stdout.write(note)
    return 0


def _or_error(produce: Any) -> Any:
    try:
        return produce()
    except GatewayError as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return None


def run_prove(args: argparse.Namespace) -> int:
    if (args.seq is None) == (args.consistency is None):
        print("gateway: give either SEQ or --consistency OLD [NEW]", file=sys.stderr)
        return 2
    if args.consistency is not None and len(args.consistency) > 2:
        print("gateway: --consistency takes OLD and at most one NEW", file=sys.stderr)
        return 2
    with reading(args) as (reader, failed):
        if args.seq is not None:
            proof = _or_error(lambda: inclusion_proof(reader, args.seq))
        else:
            old, *new = args.consistency
            proof = _or_error(lambda: consistency_proof(reader, old, new[0] if new else None))
    if failed or proof is None:
        return 1
    if args.json:
        print(json.dumps(proof))
    elif "index" in proof:
        print(f"row seq {proof['index'] + 1} is leaf {proof['index']} of the tree of {proof['tree_size']} "
              f"rows; audit path, leaf to root ({len(proof['hashes'])} hashes):")
        print("\n".join(proof["hashes"]))
    else:
        print(f"the tree of {proof['old_size']} rows is a prefix of the tree of {proof['new_size']} rows; "
              f"proof ({len(proof['hashes'])} hashes):")
        print("\n".join(proof["hashes"]))
    return 0


def run_verify_proof(args: argparse.Namespace) -> int:
    try:
        proof = json.loads(args.proof.read_text("utf-8"))
        if not isinstance(proof, dict):
            raise ValueError("the proof is not a JSON object")
        checkpoint = open_signed(args.checkpoint.read_text("utf-8"), args.public_key)
        if "index" in proof:
            if args.row is None:
                raise ValueError("an inclusion proof needs --row (the row exactly as stored)")
            check_inclusion(proof, checkpoint, args.row.read_bytes())
            what = f"row leaf {proof['index']} is in the signed tree of {checkpoint.size} rows"
        else:
            if args.old_checkpoint is None:
                raise ValueError("a consistency proof needs --old-checkpoint")
            old = open_signed(args.old_checkpoint.read_text("utf-8"), args.public_key)
            check_consistency(proof, old, checkpoint)
            what = f"the signed tree of {checkpoint.size} rows extends the signed tree of {old.size} rows"
    except (OSError, ValueError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"OK: {what} ({checkpoint.origin})")
    return 0
