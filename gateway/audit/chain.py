"""Audit rows and their hash chain: a row before stamping, its canonical bytes and hash, the time format.

``hash`` is the SHA-256 of the row's canonical JSON (sorted keys, compact, ASCII) without ``hash``;
``prev`` is the previous row's hash (``GENESIS`` first).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.answer import Answer, answer_bytes, encode_json
from gateway.audit.bounds import bounded

GENESIS = "0" * 64
#: phase of the row that opens a file after rotation
ROTATED_PHASE = "audit_rotated"
#: phase of the row recording that a torn (crash-interrupted) last line was removed
REPAIRED_PHASE = "audit_repaired"
#: fields the sink stamps; callers cannot set them
STAMPED = ("ts", "ts_epoch", "seq", "prev", "hash")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, compact separators, ASCII: the bytes a row's hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def row_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the row's canonical JSON without its own ``hash`` field (``prev`` included)."""
    return hashlib.sha256(canonical_json({k: v for k, v in row.items() if k != "hash"})).hexdigest()


def row_line(row: Mapping[str, Any]) -> bytes:
    """A stamped row as stored (the JSONL line without its newline; the same text in PostgreSQL):
    compact JSON in the row's own key order, UTF-8; a lone surrogate is escaped rather than lost.
    Its Merkle leaf is ``merkle.leaf_hash`` of exactly these bytes."""
    try:
        return json.dumps(row, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(row, separators=(",", ":")).encode("ascii")


def result_fingerprint(result: Any) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a tool result's answer text (``gateway.answer``): what the log
    keeps of it. ``result`` may be the ``Answer`` the caller was sent (its own fingerprint, made once
    for it and its copies: a mirror's kept answer is not hashed again per call), or its bytes."""
    if isinstance(result, Answer):
        return result.fingerprint()
    if isinstance(result, bytes | bytearray):
        data = bytes(result)
    else:
        try:
            data = answer_bytes(encode_json(result)[0])
        except (TypeError, ValueError):
            data = repr(result).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest(), len(data)


def prepare_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's event as it will be logged, before stamping: stamp fields dropped, ``result``
    replaced by its digest and size, everything else redacted and bounded (see ``bounded``)."""
    body = {k: v for k, v in event.items() if k not in STAMPED and k != "result"}
    if "result" in event:
        body["result_digest"], body["result_size"] = result_fingerprint(event["result"])
    prepared: dict[str, Any] = bounded(body)
    return prepared


def stamp(body: Mapping[str, Any], seq: int, prev: str, moment: datetime) -> dict[str, Any]:
    """The one row serializer's stamping, for every sink: ``ts`` and ``ts_epoch`` (one instant, cut to
    the millisecond, so the two always agree), ``seq``, then the prepared ``body``, ``prev`` and
    ``hash``."""
    row: dict[str, Any] = {"ts": format_ts(moment), "ts_epoch": epoch_seconds(moment), "seq": seq}
    row.update(body)
    row["prev"] = prev
    row["hash"] = row_hash(row)
    return row


def epoch_seconds(moment: datetime) -> float:
    """``moment`` as ``ts_epoch``: seconds since 1970-01-01 UTC, cut to the millisecond as ``ts`` is."""
    return ((moment - _EPOCH) // _MS) / 1000


def format_ts(moment: datetime) -> str:
    """ISO-8601 UTC with milliseconds and a ``Z``: ``2026-08-20T14:02:11.204Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_ts(text: Any) -> datetime | None:
    """A row's ``ts`` as an aware datetime, or None when missing or malformed."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)



def parse_row(raw: bytes) -> dict[str, Any] | None:
    """A stamped row from one line, or None when the line is not one."""
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(row, dict) and type(row.get("seq")) is int and isinstance(row.get("hash"), str)
            and isinstance(row.get("prev"), str)):
        return None
    return row
