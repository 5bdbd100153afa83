"""``gateway audit log|stats|verify`` when the audit chain lives in PostgreSQL (GATEWAY_DATABASE_URL):
the same output as on the JSONL file (``gateway.cli.audit``), read from the ``audit_rows`` table."""

from __future__ import annotations

import argparse
import json
import sys

from gateway.audit.pg_reader import PgAuditReader
from gateway.cli.audit import (
    _row_limit,
    _state_key,
    describe,
    describe_checkpoints,
    print_rows,
    render_stats,
)
from gateway.errors import AuditUnavailable
from gateway.settings import Settings
from gateway.store.postgres import PostgresStore


def _reader(settings: Settings) -> tuple[PostgresStore, PgAuditReader]:
    assert settings.database_url is not None
    store = PostgresStore(settings.database_url, max_size=2)
    return store, PgAuditReader(store)


def show_log(args: argparse.Namespace, settings: Settings) -> int:
    store, reader = _reader(settings)
    limit = _row_limit(args)
    try:
        rows = reader.rows(last=limit, since=args.since, until=args.until, target=args.target, tool=args.tool,
                           phase=args.phase, caller=args.caller, correlation_id=args.correlation_id)
    except AuditUnavailable as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return print_rows(rows, args, limit, where=reader.where)


def show_stats(args: argparse.Namespace, settings: Settings) -> int:
    store, reader = _reader(settings)
    try:
        summary = reader.stats(since=args.since)
    except AuditUnavailable as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    print(json.dumps(summary, ensure_ascii=False) if args.json else render_stats(summary))
    return 0


def run_verify(args: argparse.Namespace, settings: Settings) -> int:
    pinned = args.public_key
    if args.checkpoint and pinned is None:
        pinned = _state_key(settings.signing_key_file)
    store, reader = _reader(settings)
    try:
        report = reader.verify(checkpoints=args.checkpoint, public_key=pinned)
    except AuditUnavailable as exc:
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if not report.rows:
        print(f"no audit rows in {reader.where} (check GATEWAY_DATABASE_URL)", file=sys.stderr)
        return 1
    print("\n".join(line for line in (*describe(report), *describe_checkpoints(report)) if line))
    return 0 if report.ok else 1
