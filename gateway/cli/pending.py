"""``gateway pending``: the human approval path from a shell (the web page offers the same).

The shell user is the person ``os:<user>``, decided like anyone on the page: never their own proposal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from gateway.auth.local import os_person
from gateway.cli import add_path_flags, settings_from
from gateway.cli.output import iso_utc, print_json
from gateway.guard.decision import Proposed, proposal_rights
from gateway.server.proposals.views import proposal_view
from gateway.server.runtime import Gateway


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("pending", help="list, approve or deny proposals")
    actions = parser.add_subparsers(dest="pending_action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="proposals awaiting a decision")
    listing.add_argument("--all", action="store_true", help="include decided proposals")
    listing.add_argument("--json", action="store_true",
                         help="one JSON object per line: the proposal as the web page shows it, with "
                              "created_at and expires_at in ISO-8601 UTC (as the webhooks write times)")
    add_path_flags(listing)
    listing.set_defaults(handler=run_list)
    helps = {
        "approve": "approve a proposal by id; this executes it at once, or records one approval when "
                   "it needs several people (N of M)",
        "deny": "deny a proposal by id; it never runs and cannot be confirmed afterwards",
    }
    for name, fn in (("approve", run_approve), ("deny", run_deny)):
        p = actions.add_parser(name, help=helps[name], description=helps[name].capitalize() + ".")
        p.add_argument("proposal_id")
        p.add_argument("--reason", default="", help="why (kept in the audit row and shown to the others; "
                       "required where rules.yaml sets reason_required)")
        add_path_flags(p)
        p.set_defaults(handler=fn)


def run_list(args: argparse.Namespace) -> int:
    gateway = Gateway.build(settings_from(args), credentials_required=False, cli=True)  # logs in nowhere
    states = None if args.all else ["pending"]

    async def go() -> list[dict[str, Any]]:
        try:
            await gateway.start_notifier()  # proposals this listing expires are told like any other
            gateway.moves.expire_due()
            viewer = gateway.facts.party(os_person())
            return [{**proposal_view(p, gateway.clock()), "created_at": iso_utc(p.created_at),
                     "expires_at": iso_utc(p.expires_at)} for p in gateway.store.list_proposals(states)
                    if proposal_rights(viewer, Proposed.of(p)).see]
        finally:
            await gateway.close()

    rows = asyncio.run(go())
    if args.json:
        for row in rows:
            print_json(row, one_line=True)
        return 0
    if not rows:
        print("no proposals")
    for r in rows:
        print(describe(r))
        print(f"    {r['summary']}")
        for line in approval_lines(r):
            print(f"    {line}")
    return 0


def approval_lines(r: dict[str, Any]) -> list[str]:
    """The blast radius and the approvals so far (who, why) of one proposal, as indented lines."""
    lines = []
    blast = r.get("blast_radius") or {}
    for obj in (blast.get("objects") or [])[:20]:
        disks = "; ".join(f"{d.get('label')} {d.get('size')} on {d.get('datastore')}"
                          for d in obj.get("disks") or [])
        facts = [str(obj.get("power_state")), f"host {obj.get('host')}"]
        if obj.get("cluster"):
            facts.append(f"cluster {obj['cluster']}")
        if "snapshot_count" in obj:
            facts.append(f"{obj['snapshot_count']} snapshot(s)")
        lines.append(f"affects {obj.get('name')} ({obj.get('moid')}): {', '.join(facts)}"
                     + (f"; disks: {disks}" if disks else ""))
    if blast.get("count", 0) > 20:
        lines.append(f"... {blast['count']} objects in all")
    if r.get("approvals_progress"):
        who = ", ".join(f"{a['by']}" + (f" ({a['reason']})" if a.get("reason") else "")
                        for a in r.get("approvals") or [])
        lines.append(f"{r['approvals_progress']}" + (f": {who}" if who else "")
                     + ("; a reason is required" if r.get("reason_required") else ""))
    if r.get("deny_reason"):
        lines.append(f"denied because: {r['deny_reason']}")
    return lines


def describe(r: dict[str, Any]) -> str:
    """One line per proposal: a pending one says whether it waits for a human and when it expires; a
    decided one says who decided and how it ended (never a countdown)."""
    head = (f"{r['proposal_id']}  {r['state']:<9} target={r['target']} ({r['target_host']})  "
            f"{r['tool']}  requested by {r['requested_by']}")
    if r["state"] == "pending":
        gate = "BLOCKED until approved" if r["requires_human_approval"] else "not gated"
        if r.get("approvals_progress") and r.get("approvals_required", 1) > 1:
            gate += f" ({r['approvals_progress']})"
        return f"{head}  {gate}  expires in {r['expires_in_seconds']}s"
    tail = [f"decided by {r['approved_by']}"] if r.get("approved_by") else []
    if r.get("outcome"):
        tail.append(f"outcome {r['outcome']}")
    return "  ".join([head, *tail])


def _decide(args: argparse.Namespace, approve: bool) -> int:
    gateway = Gateway.build(settings_from(args), cli=True)

    async def go() -> dict[str, Any]:
        try:
            await gateway.start_notifier()  # humans hear of a decision made from a shell too
            if approve:
                approved = await gateway.actions.approve(args.proposal_id, os_person(), reason=args.reason)
                return approved.value
            return await gateway.actions.deny(args.proposal_id, os_person(), reason=args.reason)
        finally:
            await gateway.close()

    print(json.dumps(asyncio.run(go()), indent=2, sort_keys=True, default=str))
    return 0


def run_approve(args: argparse.Namespace) -> int:
    return _decide(args, approve=True)


def run_deny(args: argparse.Namespace) -> int:
    return _decide(args, approve=False)
