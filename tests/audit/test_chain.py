"""Audit rows and their chain (``gateway.audit.chain``): canonical bytes, hashes, stamps, timestamps,
result fingerprints and reading a row back from a line."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gateway.answer import Answer
from gateway.audit.chain import (
    GENESIS,
    STAMPED,
    canonical_json,
    epoch_seconds,
    format_ts,
    parse_row,
    parse_ts,
    prepare_event,
    result_fingerprint,
    row_hash,
    row_line,
    stamp,
)

MOMENT = datetime(2026, 8, 20, 14, 2, 11, 204_567, tzinfo=UTC)


def test_genesis_is_sixty_four_zeros() -> None:
    assert GENESIS == "0" * 64


def test_canonical_json_sorts_keys_compact_and_ascii() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == b'{"a":["\\u00e9",null],"b":1}'


def test_canonical_json_refuses_non_finite_floats() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_row_hash_is_sha256_of_canonical_json_without_hash() -> None:
    row = {"seq": 1, "prev": GENESIS, "phase": "call"}
    expected = hashlib.sha256(canonical_json(row)).hexdigest()
    assert row_hash(row) == expected
    assert row_hash({**row, "hash": "anything"}) == expected


def test_row_hash_does_not_depend_on_key_order() -> None:
    assert row_hash({"a": 1, "b": 2}) == row_hash({"b": 2, "a": 1})


def test_row_hash_changes_with_any_field() -> None:
    row = {"seq": 1, "prev": GENESIS, "phase": "call"}
    assert row_hash(row) != row_hash({**row, "phase": "cal1"})
    assert row_hash(row) != row_hash({**row, "prev": "1" * 64})


def test_row_line_keeps_key_order_and_utf8() -> None:
    assert row_line({"z": 1, "a": "é"}) == '{"z":1,"a":"é"}'.encode()


def test_row_line_escapes_a_lone_surrogate_rather_than_failing() -> None:
    line = row_line({"a": "x\ud800"})
    assert line == b'{"a":"x\\ud800"}'
    assert json.loads(line) == {"a": "x\ud800"}


@pytest.mark.parametrize(("moment", "text"), [
    (MOMENT, "2026-08-20T14:02:11.204Z"),
    (datetime(2026, 1, 1, tzinfo=UTC), "2026-01-01T00:00:00.000Z"),
    (datetime(2026, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))), "2026-01-01T00:00:00.000Z"),
])
def test_format_ts_is_utc_with_milliseconds_and_z(moment: datetime, text: str) -> None:
    assert format_ts(moment) == text


@pytest.mark.parametrize(("moment", "seconds"), [
    (datetime(1970, 1, 1, tzinfo=UTC), 0.0),
    (datetime(1970, 1, 1, 0, 0, 1, 999_999, tzinfo=UTC), 1.999),
    (MOMENT, 1787234531.204),
])
def test_epoch_seconds_cuts_to_the_millisecond(moment: datetime, seconds: float) -> None:
    assert epoch_seconds(moment) == seconds


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-08-20T14:02:11.204Z", datetime(2026, 8, 20, 14, 2, 11, 204_000, tzinfo=UTC)),
    ("2026-08-20T14:02:11", datetime(2026, 8, 20, 14, 2, 11, tzinfo=UTC)),
    ("2026-08-20T16:02:11+02:00", datetime(2026, 8, 20, 14, 2, 11, tzinfo=UTC)),
    ("yesterday", None),
    ("", None),
    (None, None),
    (17, None),
])
def test_parse_ts(text: Any, expected: datetime | None) -> None:
    assert parse_ts(text) == expected


def test_parse_ts_reads_back_what_format_ts_wrote() -> None:
    assert parse_ts(format_ts(MOMENT)) == MOMENT.replace(microsecond=204_000)


def test_stamp_orders_fields_and_chains_the_hash() -> None:
    row = stamp({"phase": "call", "tool": "list_vms"}, 7, "a" * 64, MOMENT)
    assert list(row) == ["ts", "ts_epoch", "seq", "phase", "tool", "prev", "hash"]
    assert row["ts"] == "2026-08-20T14:02:11.204Z"
    assert row["ts_epoch"] == 1787234531.204
    assert row["seq"] == 7
    assert row["prev"] == "a" * 64
    assert row["hash"] == row_hash(row)


def test_ts_and_ts_epoch_of_a_stamp_are_one_instant() -> None:
    row = stamp({}, 1, GENESIS, MOMENT)
    parsed = parse_ts(row["ts"])
    assert parsed is not None
    assert parsed.timestamp() == row["ts_epoch"]


def test_prepare_event_drops_stamp_fields_callers_may_not_set() -> None:
    event = {name: "forged" for name in STAMPED} | {"phase": "call"}
    assert prepare_event(event) == {"phase": "call"}


def test_prepare_event_replaces_the_result_by_its_digest_and_size() -> None:
    answer = Answer.of({"vms": ["web1"]})
    body = prepare_event({"phase": "result", "result": answer})
    assert "result" not in body
    assert body["result_digest"] == hashlib.sha256(answer.data).hexdigest()
    assert body["result_size"] == len(answer.data)


def test_prepare_event_redacts_and_bounds() -> None:
    body = prepare_event({"args": {"password": "hunter2"}, "note": "n" * 5000})
    assert body["args"] == {"password": "***"}
    assert body["note"]["size"] == 5000


def test_result_fingerprint_of_an_answer_is_of_its_text() -> None:
    answer = Answer.of({"a": 1})
    assert result_fingerprint(answer) == (hashlib.sha256(b'{"a":1}').hexdigest(), 7)


def test_result_fingerprint_of_an_answer_is_the_one_it_and_its_copies_keep() -> None:
    """A mirror's kept answer is sent (as copies) to many calls: the audit hashes its text once."""
    kept = Answer.of({"vms": [{"name": "a"}], "count": 1})
    first = result_fingerprint(kept.copy())
    assert kept.derived.get("fingerprint") == first == (hashlib.sha256(kept.data).hexdigest(), len(kept.data))
    assert result_fingerprint(kept.copy()) is kept.derived["fingerprint"]


@pytest.mark.parametrize("data", [b"raw bytes", bytearray(b"raw bytes")])
def test_result_fingerprint_of_bytes_is_of_those_bytes(data: bytes | bytearray) -> None:
    assert result_fingerprint(data) == (hashlib.sha256(b"raw bytes").hexdigest(), 9)


def test_result_fingerprint_of_a_plain_value_is_of_its_answer_encoding() -> None:
    assert result_fingerprint({"a": 1}) == result_fingerprint(Answer.of({"a": 1}))


def test_result_fingerprint_of_an_unencodable_value_uses_its_repr() -> None:
    value = {1j: "complex key"}
    data = repr(value).encode()
    assert result_fingerprint(value) == (hashlib.sha256(data).hexdigest(), len(data))


def test_parse_row_reads_a_stamped_row() -> None:
    row = stamp({"phase": "call"}, 1, GENESIS, MOMENT)
    assert parse_row(row_line(row)) == row
    assert parse_row(row_line(row) + b"\n") == row


@pytest.mark.parametrize("line", [
    b"",
    b"not json",
    b"[1, 2]",
    b'{"seq": 1, "hash": "h"}',
    b'{"seq": "1", "hash": "h", "prev": "p"}',
    b'{"seq": true, "hash": "h", "prev": "p"}',
    b'{"seq": 1.0, "hash": "h", "prev": "p"}',
    b'{"seq": 1, "hash": 5, "prev": "p"}',
    b'{"seq": 1, "hash": "h", "prev": null}',
    b"[" * 100_000,
])
def test_parse_row_is_none_for_lines_that_are_not_rows(line: bytes) -> None:
    assert parse_row(line) is None
