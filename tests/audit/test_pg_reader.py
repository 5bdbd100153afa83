"""The PostgreSQL reader's pure parts (``gateway.audit.pg_reader``), without a database: how one table
row is judged against the chain (``_problem``, the same reasons as the file's verifier) and the time
window a query filters on. The reader against a real PostgreSQL is ``tests/audit/test_pg_sink.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gateway.audit.chain import GENESIS, row_hash, stamp
from gateway.audit.pg_reader import PgAuditReader, _problem

MOMENT = datetime(2026, 5, 1, 8, 30, tzinfo=UTC)


def _chain(count: int) -> list[dict[str, Any]]:
    rows, prev = [], GENESIS
    for seq in range(1, count + 1):
        row = stamp({"phase": "call", "n": seq}, seq, prev, MOMENT)
        rows.append(row)
        prev = row["hash"]
    return rows


def _record(row: dict[str, Any], **columns: Any) -> dict[str, Any]:
    """A table row as the reader sees it: seq and hash columns beside the JSON body."""
    return {"seq": row["seq"], "hash": row["hash"], "body": json.dumps(row), **columns}


ROWS = _chain(3)


def test_the_first_row_of_a_chain_has_no_problem() -> None:
    assert _problem(_record(ROWS[0]), None, GENESIS) is None


def test_a_row_following_its_predecessor_has_no_problem() -> None:
    assert _problem(_record(ROWS[1]), 2, ROWS[0]["hash"]) is None


def test_a_body_that_is_not_json() -> None:
    assert _problem({"seq": 1, "hash": "h", "body": "{"}, None, GENESIS) == (
        "not_json", "the row's body is not a stamped JSON row")


@pytest.mark.parametrize("columns", [{"seq": 9}, {"hash": "0" * 64}])
def test_columns_that_disagree_with_the_body_are_a_hash_mismatch(columns: dict[str, Any]) -> None:
    reason, detail = _problem(_record(ROWS[0], **columns), None, GENESIS) or ("", "")
    assert reason == "hash_mismatch"
    assert "columns do not match its body" in detail


def test_a_body_that_is_not_an_object_is_a_hash_mismatch() -> None:
    reason, _ = _problem({"seq": 1, "hash": "h", "body": "[1]"}, None, GENESIS) or ("", "")
    assert reason == "hash_mismatch"


def test_an_edited_body_is_a_hash_mismatch() -> None:
    edited = {**ROWS[0], "n": 99}
    reason, detail = _problem(_record(edited), None, GENESIS) or ("", "")
    assert reason == "hash_mismatch"
    assert "edited after writing" in detail


def test_a_missing_row_is_a_seq_gap() -> None:
    assert _problem(_record(ROWS[2]), 2, ROWS[0]["hash"]) == (
        "seq_gap", "expected seq 2, found 3: rows are missing")


def test_a_repeated_row_is_out_of_order() -> None:
    assert _problem(_record(ROWS[0]), 2, ROWS[0]["hash"]) == (
        "seq_gap", "expected seq 2, found 1: rows are out of order")


def test_a_table_not_starting_at_seq_one_is_a_seq_gap() -> None:
    reason, _ = _problem(_record(ROWS[1]), None, GENESIS) or ("", "")
    assert reason == "seq_gap"


def test_a_replaced_row_is_a_prev_mismatch() -> None:
    forged = {**ROWS[1], "prev": "1" * 64}
    forged["hash"] = row_hash(forged)
    assert _problem(_record(forged), 2, ROWS[0]["hash"]) == (
        "prev_mismatch", "prev does not match the hash of the row before: a row was replaced")


def test_the_first_row_kept_after_a_prune_chains_to_a_dropped_row() -> None:
    assert _problem(_record(ROWS[2]), None, GENESIS, retained=3) is None


def test_after_a_prune_the_table_must_start_where_retention_says() -> None:
    reason, detail = _problem(_record(ROWS[1]), None, GENESIS, retained=3) or ("", "")
    assert (reason, detail) == ("seq_gap", "expected seq 3, found 2: rows are out of order")


def test_no_window_filters_nothing() -> None:
    assert PgAuditReader._window(None, None) == ([], [])


def test_window_bounds_are_inclusive_utc_timestamps() -> None:
    since, until = MOMENT, MOMENT + timedelta(hours=1)
    assert PgAuditReader._window(since, until) == (
        ["ts >= %s", "ts <= %s"], ["2026-05-01T08:30:00.000Z", "2026-05-01T09:30:00.000Z"])


def test_window_reads_naive_datetimes_as_utc() -> None:
    assert PgAuditReader._window(datetime(2026, 5, 1, 8, 30), None) == (
        ["ts >= %s"], ["2026-05-01T08:30:00.000Z"])


def test_window_converts_other_zones_to_utc() -> None:
    moment = datetime(2026, 5, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))
    assert PgAuditReader._window(None, moment) == (["ts <= %s"], ["2026-05-01T08:30:00.000Z"])
