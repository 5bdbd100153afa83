"""The Merkle tree over ``audit_rows`` in PostgreSQL: table ``audit_tree``, every stored subtree hash.

``PgTree.append`` runs in the row's own transaction, so no replica sees a row without its hashes. A
table whose rows predate the tree gets one built on the next append.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import psycopg

from gateway.audit.merkle import Frontier, frontier_indexes, leaf_hash, stored_hash_count, tree_size_for

log = logging.getLogger(__name__)


def read_hashes(conn: psycopg.Connection[Any], indexes: Sequence[int]) -> list[bytes]:
    """The stored hashes at ``indexes``, in that order (``LookupError`` when one is missing)."""
    if not indexes:
        return []
    found = conn.execute("SELECT idx, hash FROM audit_tree WHERE idx = ANY(%s)", (list(indexes),)).fetchall()
    by_index = {int(r["idx"]): bytes(r["hash"]) for r in cast("list[dict[str, Any]]", found)}
    missing = [i for i in indexes if i not in by_index]
    if missing:
        raise LookupError(f"the audit tree holds no hash at position {missing[0]}")
    return [by_index[i] for i in indexes]


def stored_frontier(conn: psycopg.Connection[Any], size: int) -> Frontier | None:
    try:
        return Frontier(size, read_hashes(conn, frontier_indexes(size)))
    except LookupError:
        return None


def _insert(conn: psycopg.Connection[Any], start: int, hashes: Sequence[bytes]) -> None:
    conn.execute("INSERT INTO audit_tree (idx, hash) SELECT * FROM unnest(%s::bigint[], %s::bytea[])",
                 (list(range(start, start + len(hashes))), list(hashes)))


class PgTree:
    """This process's view of the table's tree (see the module docstring); not thread-safe on its own:
    the sink calls it under the chain's advisory lock."""

    def __init__(self) -> None:
        self.frontier: Frontier | None = None
        self._head = ""  # the chain hash of the row the cached frontier ends with

    def frontier_at(self, conn: psycopg.Connection[Any], size: int, head_hash: str) -> Frontier:
        """The frontier of the table's first ``size`` rows (the head being ``head_hash``), building the
        tree's missing part from the rows when needed."""
        if self.frontier is not None and self.frontier.size == size and self._head == head_hash:
            return self.frontier
        found = conn.execute("SELECT count(*) AS n FROM audit_tree").fetchone()
        count = int(cast("dict[str, Any]", found)["n"])
        n = tree_size_for(count)
        if n is None or n > size:  # more hashes than rows: the rows were cut; keep what they cover
            n = min(size, n if n is not None else size)
            while n and stored_frontier(conn, n) is None:
                n -= 1
            conn.execute("DELETE FROM audit_tree WHERE idx >= %s", (stored_hash_count(n),))
            log.warning("audit tree: more hashes than rows in audit_rows; cut back to %d rows", n)
        frontier = stored_frontier(conn, n)
        if frontier is None:
            conn.execute("DELETE FROM audit_tree")
            frontier = Frontier()
        if frontier.size < size:
            log.warning("audit tree: building the hashes of rows %d..%d from audit_rows",
                        frontier.size + 1, size)
            with conn.cursor(name="audit_tree_build") as cursor:
                cursor.execute("SELECT body FROM audit_rows WHERE seq > %s AND seq <= %s ORDER BY seq",
                               (frontier.size, size))
                for record in cursor:
                    start = stored_hash_count(frontier.size)
                    _insert(conn, start, frontier.append(leaf_hash(str(record["body"]).encode("utf-8"))))
        self.frontier, self._head = frontier, head_hash
        return frontier

    def append(self, conn: psycopg.Connection[Any], size: int, head_hash: str, row: Any, line: bytes) -> None:
        """Add the row ``line`` (stored bytes) after the first ``size`` rows; in the row's transaction."""
        frontier = self.frontier_at(conn, size, head_hash).copy()
        start = stored_hash_count(frontier.size)
        _insert(conn, start, frontier.append(leaf_hash(line)))
        self.pending = (frontier, str(row["hash"]))

    def committed(self) -> None:
        """The transaction of the last ``append`` committed: its frontier is the table's now."""
        self.frontier, self._head = self.pending

    def rolled_back(self) -> None:
        self.frontier, self._head = None, ""

    pending: tuple[Frontier, str] = (Frontier(), "")
