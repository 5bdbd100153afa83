"""The audit row's size bounds: ``bounded``, the redacting walk that also cuts long strings and deep nesting.

A long string keeps a prefix with its size and digest, so no caller can write a big row.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.audit.redact import Walk

#: audit rows keep strings up to this many characters whole
MAX_STRING_CHARS = 1024
#: of a longer string, this many leading characters are kept (with its size and digest)
CUT_KEEP_CHARS = 96
#: items kept of one list or mapping in an audit row
MAX_ITEMS = 100
#: nesting kept in an audit row (the row itself is level 0)
MAX_BOUNDED_DEPTH = 12
#: characters of text kept across one row, all strings together
MAX_ROW_CHARS = 16 * 1024


def bounded(value: Any) -> Any:
    """``redact(value)`` bounded in size, as audit rows store values.

    A string longer than ``MAX_STRING_CHARS`` (after redaction) becomes ``{"cut": <its first
    CUT_KEEP_CHARS characters>, "size": <UTF-8 bytes>, "sha256": <hex digest of the redacted text>}``;
    a list or mapping keeps its first ``MAX_ITEMS`` items and ends with ``{"more_items": n}`` (a list)
    or a ``"more_items"`` key (a mapping); nesting deeper than ``MAX_BOUNDED_DEPTH`` becomes
    ``"<nested too deep>"``; and once ``MAX_ROW_CHARS`` characters of text have been kept in one value,
    every further string is cut to its size and digest alone. So no caller can make a row large.
    Every key and string has its NUL characters and lone surrogates escaped first
    (``guard.inputs.storable_text``), so every engine can store the row.
    """
    return _BoundedWalk(MAX_ROW_CHARS).value(value, 0)


def _bounded_key(key: str) -> str:
    """A mapping key kept short: a long one keeps its start and a digest (distinct keys stay distinct)."""
    if len(key) <= CUT_KEEP_CHARS:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{key[:CUT_KEEP_CHARS]}...sha256:{digest}"


class _BoundedWalk(Walk):
    """The redacting walk with the audit row's bounds, spending one budget of characters of text."""

    max_depth = MAX_BOUNDED_DEPTH
    max_items = MAX_ITEMS

    def __init__(self, chars: int) -> None:
        super().__init__()
        self.chars = chars

    def text(self, text: str) -> Any:
        if len(text) <= min(MAX_STRING_CHARS, self.chars):
            self.chars -= len(text)
            return text
        keep = max(0, min(CUT_KEEP_CHARS, self.chars))
        self.chars -= keep
        data = text.encode("utf-8", "surrogatepass")
        return {"cut": text[:keep], "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def key(self, key: Any) -> str:
        return _bounded_key(super().key(key))
