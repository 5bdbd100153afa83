"""PostgreSQL audit retention: ``prune_audit`` drops old rows; the tree keeps the rest provable.

It refuses unless the tree covers the rows to drop, and records the drop as an ``audit_pruned`` row.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import psycopg

from gateway.audit.merkle import tree_size_for
from gateway.audit.pg_sink import AUDIT_LOCK, PgAuditSink
from gateway.errors import AuditUnavailable, InvalidArgument, StateUnavailable

log = logging.getLogger(__name__)

#: the phase of the row recording a prune
PRUNED_PHASE = "audit_pruned"


def retained_from(conn: psycopg.Connection[Any]) -> int:
    """The oldest seq the table is meant to hold (1 until something was pruned)."""
    found = conn.execute("SELECT first_seq FROM audit_retention WHERE id = 1").fetchone()
    return int(cast("dict[str, Any]", found)["first_seq"]) if found else 1


def prune_audit(sink: PgAuditSink, before_seq: int) -> int:
    """Drop the rows with seq below ``before_seq`` (the newest row always stays); return how many went."""
    try:
        with sink.store.pool.connection(timeout=sink.timeout) as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (AUDIT_LOCK,))
            head = conn.execute("SELECT max(seq) AS seq FROM audit_rows").fetchone()
            newest = int(cast("dict[str, Any]", head)["seq"] or 0)
            first = retained_from(conn)
            if not first < before_seq <= newest:
                raise InvalidArgument("before_seq", f"keep from a seq between {first + 1} and the newest row "
                                      f"({newest})")
            counted = conn.execute("SELECT count(*) AS n FROM audit_tree").fetchone()
            covered = tree_size_for(int(cast("dict[str, Any]", counted)["n"]))
            if covered is None or covered < before_seq - 1:
                raise AuditUnavailable(f"the audit tree covers {covered} rows, fewer than the "
                                       f"{before_seq - 1} to drop: they would no longer be provable; write "
                                       "a row first")
            dropped = conn.execute("DELETE FROM audit_rows WHERE seq < %s", (before_seq,)).rowcount
            conn.execute("INSERT INTO audit_retention (id, first_seq) VALUES (1, %s) "
                         "ON CONFLICT (id) DO UPDATE SET first_seq = excluded.first_seq", (before_seq,))
    except (psycopg.Error, StateUnavailable) as exc:
        raise AuditUnavailable(f"cannot prune {sink.where}: {exc}; fix: check PostgreSQL") from None
    log.warning("AUDIT RETENTION: dropped %d rows (seq %d..%d) of %s; their tree hashes stay", dropped, first,
                before_seq - 1, sink.where)
    sink.write({"phase": PRUNED_PHASE, "caller": "gateway", "first_seq": first, "last_seq": before_seq - 1,
                "rows": dropped})
    return int(dropped)
