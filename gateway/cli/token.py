"""``gateway token``: create, list, revoke, re-role and re-kind bearer tokens.

A token is shown once (only its hash is kept) and is an agent's unless ``--kind person``. Every change
is an audit row naming ``os:<user>``; a change that cannot be audited is undone and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from gateway.audit.file_sink import AuditSink
from gateway.auth.local import os_person
from gateway.auth.roles import RoleBook
from gateway.auth.tokens import caller_fields, create_token, parse_expiry
from gateway.backends import open_store
from gateway.cli import add_path_flags, settings_from
from gateway.cli.output import iso_utc, print_json
from gateway.errors import AuditUnavailable, ConfigError, InvalidArgument, NotFound
from gateway.settings import Settings
from gateway.store import StateStore
from gateway.store.base import TokenRecord
from gateway.vocabulary import Kind

KINDS = tuple(k.value for k in Kind)


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("token", help="create, list, revoke and re-role tokens")
    actions = parser.add_subparsers(dest="token_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token and print it (once) on stdout")
    create.add_argument("name", help="who uses it (audit rows name the caller by it); never reused")
    create.add_argument("--role", required=True, help="reader, admin, or a role from roles.yaml")
    create.add_argument("--expires-in", dest="expires_in",
                        help="lifetime such as 30d, 12h, 90m (default: never expires)")
    create.add_argument("--kind", choices=KINDS, default=Kind.AGENT.value,
                        help="agent (default): an MCP client's token; person: a human's, the only kind that "
                             "signs in to the approval page and approves (never their own proposals)")
    create.add_argument("--json", action="store_true",
                        help='print {"token", "name", "kind", "role", "token_id", "expires"} (ISO-8601 UTC '
                             "or null) instead of the token alone")
    create.set_defaults(handler=run_create)
    listing = actions.add_parser("list", help="tokens with kind, role, dates and state (never a secret)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.add_argument("-l", "--long", action="store_true", help="also the token ids (a long listing)")
    listing.set_defaults(handler=run_list)
    revoke = actions.add_parser("revoke", help="refuse a token from the next request on")
    revoke.add_argument("name")
    revoke.set_defaults(handler=run_revoke)
    set_role = actions.add_parser("set-role", help="change a token's role (applies from its next request)")
    set_role.add_argument("name")
    set_role.add_argument("role")
    set_role.set_defaults(handler=run_set_role)
    set_kind = actions.add_parser("set-kind", help="make a token a person's or an agent's (applies from its "
                                  "next request; the page's sessions of a token made an agent's end)")
    set_kind.add_argument("name")
    set_kind.add_argument("kind", choices=KINDS)
    set_kind.set_defaults(handler=run_set_kind)
    for action in (create, listing, revoke, set_role, set_kind):
        add_path_flags(action)


@contextmanager
def _opened(args: argparse.Namespace) -> Iterator[tuple[Settings, StateStore]]:
    settings = settings_from(args)
    store = open_store(settings)
    try:
        yield settings, store
    finally:
        store.close()


def _audit(settings: Settings, phase: str, rec: TokenRecord, **extra: Any) -> None:
    by = os_person()
    with AuditSink.for_settings(settings) as sink:
        sink.write({"phase": phase, **caller_fields(by), "kind": by.kind.value, "surface": by.surface,
                    "token_name": rec.name, "token_id": rec.token_id, "role": rec.role,
                    "token_kind": rec.kind.value, **extra})


def _require_role(settings: Settings, role: str) -> None:
    book = RoleBook(settings.roles_file)
    if book.get(role) is not None:
        return
    known = ", ".join(book.roles())
    broken = " (roles.yaml is broken, its roles are off; see `gateway roles check`)" if book.check() else ""
    raise InvalidArgument("role", f"{role!r} is not a defined role{broken}; defined roles: {known}")


def run_create(args: argparse.Namespace) -> int:
    expires_in = parse_expiry(args.expires_in) if args.expires_in else None
    with _opened(args) as (settings, store):
        _require_role(settings, args.role)
        token, rec = create_token(store, args.name, args.role, expires_in=expires_in, now=time.time(),
                                  kind=Kind(args.kind))
        try:
            _audit(settings, "token_created", rec, expires_at=rec.expires_at)
        except AuditUnavailable:
            store.update_token(rec.name, revoked=True)
            raise
    if args.json:
        print_json({"token": token, "name": rec.name, "kind": rec.kind.value, "role": rec.role,
                    "token_id": rec.token_id, "expires": iso_utc(rec.expires_at)})
    else:
        print(token)
    print(f"created {rec.kind.value} token {rec.name!r} with role {rec.role}; it is shown only this once",
          file=sys.stderr)
    return 0


def token_row(rec: TokenRecord, now: float) -> dict[str, Any]:
    """What ``list`` shows of a token: never its secret or hash."""
    state = "revoked" if rec.revoked else "expired" if rec.expired(now) else "active"
    return {"name": rec.name, "kind": rec.kind.value, "role": rec.role, "token_id": rec.token_id,
            "created": iso_utc(rec.created_at),
            "expires": iso_utc(rec.expires_at), "last_used": iso_utc(rec.last_used), "revoked": rec.revoked,
            "state": state}


_COLUMNS = ("name", "kind", "role", "state", "created", "expires", "last_used")


def _print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = _COLUMNS) -> None:
    cells = [[str(r[c] if r[c] is not None else "-") for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def run_list(args: argparse.Namespace) -> int:
    with _opened(args) as (_settings, store):
        rows = [token_row(rec, time.time()) for rec in store.list_tokens()]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
    elif rows:
        _print_table(rows, ("name", "token_id", *_COLUMNS[1:]) if args.long else _COLUMNS)
    else:
        print("no tokens; create one with `gateway token create NAME --role reader`")
    return 0


def _existing(store: StateStore, name: str) -> TokenRecord:
    rec = store.token_by_name(name)
    if rec is None:
        raise NotFound(f"no token named {name!r}; `gateway token list` shows the names")
    return rec


def run_revoke(args: argparse.Namespace) -> int:
    with _opened(args) as (settings, store):
        if _existing(store, args.name).revoked:
            print(f"token {args.name!r} was already revoked")
            return 0
        try:
            cancelled = _revoke(settings, store, args.name)
        except AuditUnavailable as exc:
            # A revocation only narrows access, so it stands even when it cannot be recorded.
            print(f"gateway: {exc.code}: the revocation stands but was not audited: {exc.message}",
                  file=sys.stderr)
            return 1
    print(f"revoked token {args.name!r}; servers refuse it from their next request")
    if cancelled:
        print(f"cancelled its open proposals: {', '.join(cancelled)}")
    return 0


def _revoke(settings: Settings, store: StateStore, name: str) -> list[str]:
    """Revoke through the gateway's one path (which also cancels the token's open proposals); when the
    gateway cannot be built here (no targets file), revoke and audit directly: servers cancel the
    proposals themselves, and no proposal of a revoked token can run anyway."""
    from gateway.server.runtime import Gateway

    try:
        gateway = Gateway.build(settings, cli=True)
    except ConfigError:
        rec = store.update_token(name, revoked=True)
        _audit(settings, "token_revoked", rec)
        return []
    try:
        return gateway.moves.revoke_token(name, by=os_person())
    finally:
        gateway.backends.close()


def run_set_role(args: argparse.Namespace) -> int:
    with _opened(args) as (settings, store):
        before = _existing(store, args.name)
        if before.revoked:
            raise InvalidArgument("name", f"token {args.name!r} is revoked; create a new token instead")
        _require_role(settings, args.role)
        rec = store.update_token(args.name, role=args.role)
        try:
            _audit(settings, "token_role_changed", rec, old_role=before.role)
        except AuditUnavailable:
            store.update_token(args.name, role=before.role)
            raise
    print(f"token {rec.name!r} now has role {rec.role} (was {before.role}); applies from its next request")
    return 0


def run_set_kind(args: argparse.Namespace) -> int:
    kind = Kind(args.kind)
    with _opened(args) as (settings, store):
        before = _existing(store, args.name)
        if before.revoked:
            raise InvalidArgument("name", f"token {args.name!r} is revoked; create a new token instead")
        if before.kind is kind:
            print(f"token {args.name!r} is already of kind {kind.value}")
            return 0
        rec = store.update_token(args.name, kind=kind)
        try:
            _audit(settings, "token_kind_changed", rec, old_kind=before.kind.value)
        except AuditUnavailable:
            store.update_token(args.name, kind=before.kind)
            raise
    print(f"token {rec.name!r} is now of kind {kind.value} (was {before.kind.value}); applies from its next "
          "request")
    return 0
