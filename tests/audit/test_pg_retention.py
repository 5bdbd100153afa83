"""PostgreSQL audit retention (``gateway.audit.pg_retention``), on a real server (the ``postgres`` tier:
``pg_url``): ``prune_audit`` drops old rows only while the tree covers them, records the drop as an
``audit_pruned`` row, and the table still verifies from its first kept row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_retention import PRUNED_PHASE, prune_audit, retained_from
from gateway.audit.pg_sink import PgAuditSink
from gateway.errors import AuditUnavailable, InvalidArgument
from gateway.store.postgres import PostgresStore

ROWS = 10


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


def _first_seq(sink: PgAuditSink) -> int:
    with sink.store.pool.connection() as conn:
        return retained_from(conn)


def test_nothing_pruned_keeps_from_seq_one(sink: PgAuditSink) -> None:
    assert _first_seq(sink) == 1


def test_prune_drops_the_rows_before_the_seq_and_records_it(sink: PgAuditSink) -> None:
    assert prune_audit(sink, 6) == 5
    assert _first_seq(sink) == 6
    reader = PgAuditReader(sink.store)
    rows = reader.rows()
    assert [r["seq"] for r in rows] == [6, 7, 8, 9, 10, 11]
    pruned = rows[-1]
    assert pruned["phase"] == PRUNED_PHASE
    assert (pruned["first_seq"], pruned["last_seq"], pruned["rows"]) == (1, 5, 5)


def test_the_table_verifies_after_a_prune(sink: PgAuditSink) -> None:
    prune_audit(sink, 4)
    report = PgAuditReader(sink.store).verify()
    assert report.ok
    assert report.first_seq == 4
    assert report.starts_after_rotation


def test_a_second_prune_starts_where_the_first_ended(sink: PgAuditSink) -> None:
    prune_audit(sink, 3)
    assert prune_audit(sink, 8) == 5
    assert _first_seq(sink) == 8


@pytest.mark.parametrize("before_seq", [1, 0, ROWS + 1, 500])
def test_a_seq_outside_the_kept_rows_is_an_invalid_argument(sink: PgAuditSink, before_seq: int) -> None:
    with pytest.raises(InvalidArgument, match=f"keep from a seq between 2 and the newest row \\({ROWS}\\)"):
        prune_audit(sink, before_seq)
    assert _first_seq(sink) == 1


def test_the_newest_row_always_stays(sink: PgAuditSink) -> None:
    assert prune_audit(sink, ROWS) == ROWS - 1
    assert [r["seq"] for r in PgAuditReader(sink.store).rows()] == [ROWS, ROWS + 1]


def test_rows_the_tree_does_not_cover_are_not_dropped(sink: PgAuditSink) -> None:
    with sink.store.pool.connection() as conn:
        conn.execute("DELETE FROM audit_tree")
    with pytest.raises(AuditUnavailable, match="would no longer be provable"):
        prune_audit(sink, 6)
    assert len(PgAuditReader(sink.store).rows()) == ROWS
