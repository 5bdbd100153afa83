"""``ts_epoch``: every audit row, on both engines, carries its time as seconds since the epoch, the same
instant as ``ts``; the chain, its checkpoints and the Merkle tree still verify with it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.chain import parse_ts
from gateway.audit.file_sink import AuditSink
from gateway.audit.files import log_files
from gateway.audit.pg_reader import PgAuditReader
from gateway.audit.pg_sink import PgAuditSink
from gateway.audit.readers import FileAuditReader
from gateway.audit.verify import verify
from gateway.store.postgres import PostgresStore

#: instants the rows are stamped at: sub-millisecond parts, a leap day, the epoch's own second
MOMENTS = [datetime(2026, 8, 20, 14, 2, 11, 204999, tzinfo=UTC), datetime(2028, 2, 29, 23, 59, 59, 999999,
           tzinfo=UTC), datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), datetime(2026, 12, 2, 5, 0, 0, 1000,
           tzinfo=UTC)]
EVENTS: list[Mapping[str, Any]] = [
    {"phase": "call", "tool": "list_vms", "target": "vc1", "caller": "ann"},
    {"phase": "result", "tool": "list_vms", "caller": "ann", "result": {"vms": ["a"]}},
    {"phase": "call", "tool": "power_off_vm", "ts_epoch": 1.0, "ts": "forged"},  # stamps are the sink's
] * 4


def _clock() -> Iterator[datetime]:
    step = 0
    while True:
        yield MOMENTS[step % len(MOMENTS)] + timedelta(days=step // len(MOMENTS))
        step += 1


def assert_agree(rows: list[dict[str, Any]]) -> None:
    assert rows, "no rows to check"
    for row in rows:
        assert type(row.get("ts_epoch")) is float, row
        moment = parse_ts(row["ts"])
        assert moment is not None, row
        assert row["ts_epoch"] == round(moment.timestamp(), 3), row
        assert datetime.fromtimestamp(row["ts_epoch"], UTC) == moment, row


def test_file_rows_carry_ts_epoch_agreeing_with_ts(tmp_path: Path) -> None:
    clock = _clock()
    path = tmp_path / "audit.jsonl"
    # small files: rotation markers (bookkeeping rows) are stamped by the same serializer
    with AuditSink(path, max_bytes=900, key_file=tmp_path / "k.key", clock=lambda: next(clock)) as sink:
        written = [sink.write(event) for event in EVENTS]
    assert_agree(written)
    stored = FileAuditReader(path).rows()
    assert any(r.get("phase") == "audit_rotated" for r in stored), "the test wants a rotation marker"
    assert len(log_files(path)) > 1
    assert_agree(stored)
    report = verify(path, checkpoints=True)
    assert report.ok, report


def test_pg_rows_carry_ts_epoch_agreeing_with_ts(pg_url: str, tmp_path: Path) -> None:
    clock = _clock()
    with PostgresStore(pg_url) as store:
        with PgAuditSink(store, key_file=tmp_path / "k.key", clock=lambda: next(clock)) as sink:
            written = [sink.write(event) for event in EVENTS]
        assert_agree(written)
        reader = PgAuditReader(store)
        assert_agree(reader.rows())
        report = reader.verify()
        assert report.ok and report.rows == len(EVENTS), report


@pytest.mark.parametrize("moment", MOMENTS)
def test_epoch_seconds_is_ts_to_the_millisecond(moment: datetime) -> None:
    from gateway.audit.chain import epoch_seconds, format_ts

    parsed = parse_ts(format_ts(moment))
    assert parsed is not None and epoch_seconds(moment) == parsed.timestamp()
