"""The Merkle tree over ``audit_rows`` in PostgreSQL (``gateway.audit.pg_tree``), on a real server (the
``postgres`` tier: ``pg_url``): the hashes written with each row, reading them by position, and
``PgTree.frontier_at`` rebuilding a tree that is missing or longer than the rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.audit.merkle import Frontier, leaf_hash, root_of, stored_hash_count, stored_hash_index
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.pg_tree import PgTree, read_hashes, stored_frontier
from gateway.store.postgres import PostgresStore

ROWS = 7


@pytest.fixture
def sink(pg_url: str) -> Iterator[PgAuditSink]:
    store = PostgresStore(pg_url, max_size=2)
    audit = PgAuditSink(store)
    try:
        for i in range(ROWS):
            audit.write({"phase": "call", "n": i})
        yield audit
    finally:
        audit.close()
        store.close()


def _leaves(conn: Any) -> list[bytes]:
    found = conn.execute("SELECT body FROM audit_rows ORDER BY seq").fetchall()
    return [leaf_hash(str(r["body"]).encode()) for r in found]


def _count(conn: Any) -> int:
    return int(conn.execute("SELECT count(*) AS n FROM audit_tree").fetchone()["n"])


def test_each_row_is_written_with_its_tree_hashes(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn:
        assert _count(conn) == stored_hash_count(ROWS)
        leaves = _leaves(conn)
        assert read_hashes(conn, [stored_hash_index(0, i) for i in range(ROWS)]) == leaves


def test_read_hashes_keeps_the_order_asked(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn:
        forward = read_hashes(conn, [0, 1, 2])
        assert read_hashes(conn, [2, 0, 1]) == [forward[2], forward[0], forward[1]]


def test_read_hashes_of_nothing_reads_nothing(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn:
        assert read_hashes(conn, []) == []


def test_a_missing_hash_is_a_lookup_error_naming_its_position(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn, pytest.raises(LookupError, match="no hash at position 999"):
        read_hashes(conn, [0, 999])


def test_stored_frontier_gives_the_root_of_the_rows(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn:
        leaves = _leaves(conn)
        for size in range(ROWS + 1):
            frontier = stored_frontier(conn, size)
            assert frontier is not None
            assert frontier.root() == root_of(leaves[:size])
        assert stored_frontier(conn, 100) is None


def test_frontier_at_rebuilds_a_missing_tree_from_the_rows(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn, conn.transaction():
        leaves = _leaves(conn)
        conn.execute("DELETE FROM audit_tree")
        head = conn.execute("SELECT hash FROM audit_rows WHERE seq = %s", (ROWS,)).fetchone()["hash"]
        frontier = PgTree().frontier_at(conn, ROWS, head)
        assert frontier.size == ROWS
        assert frontier.root() == root_of(leaves)
        assert _count(conn) == stored_hash_count(ROWS)


def test_frontier_at_cuts_a_tree_longer_than_the_rows(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn, conn.transaction():
        leaves = _leaves(conn)
        frontier = PgTree().frontier_at(conn, 4, "head-of-4")
        assert frontier.root() == root_of(leaves[:4])
        assert _count(conn) == stored_hash_count(4)


def test_frontier_at_is_cached_for_the_same_size_and_head(sink: PgAuditSink) -> None:
    tree = PgTree()
    with sink.store.pool.connection() as conn:
        first = tree.frontier_at(conn, ROWS, "h")
        assert tree.frontier_at(conn, ROWS, "h") is first
        assert tree.frontier_at(conn, ROWS, "other") is not first


def test_committed_and_rolled_back_keep_or_drop_the_pending_frontier() -> None:
    tree = PgTree()
    pending = Frontier(3, [b"\x00" * 32, b"\x01" * 32])
    tree.pending = (pending, "h3")
    tree.committed()
    assert tree.frontier is pending
    tree.rolled_back()
    assert tree.frontier is None
