"""A tool's answer, encoded once: the JSON text the caller receives is the text the audit fingerprints.

A listing of thousands of VMs is a megabyte of JSON. Encoding it is the largest cost of a read
served from the mirror, so it happens once, in a worker thread, next to sanitizing: the MCP surface
sends ``Answer.text`` as the result's one text block, and the audit row keeps the SHA-256 and size of
the same bytes (``Answer.data``). Whoever holds an answer can check it against the audit log with
``sha256sum``; nothing is re-encoded with different settings on the way.

Every result becomes an answer through ``Answer.cleaned``: sanitized for the model that reads it
(``gateway.sanitize``), then encoded. The encoding: compact separators, UTF-8 (no ``\\u``
escapes for non-ASCII), keys in the order the tool produced them; a value JSON has no type for (a
date, say) becomes its ``str``, and the value is then re-read from the text so that ``value`` and
``text`` never disagree.

Plain values (dicts with string keys, lists, strings, 64-bit integers, floats, booleans, None: every
listing) are encoded by ``orjson``, several times faster than the standard library on a listing of
30,000 VMs (60 ms there); its text is the standard library's for such values, but for exponents
(``1e-7`` where Python writes ``1e-07``) and for a float that is not a number, which it writes as
``null`` (JSON has no NaN). Anything else (a date, a set, a lone surrogate from a vSphere string,
an integer past 64 bits, a key that is not a string) goes the standard library's way above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.sanitize import clean, encoded_is_clean

#: what orjson would encode its own way (dates, dataclasses, subclasses of str, int, dict and list)
#: is handed to ``default``; there is none, so such a value raises and takes the standard library's way
_PLAIN_ONLY: Final = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | \
    orjson.OPT_PASSTHROUGH_SUBCLASS


def encode_json(value: Any) -> tuple[str, bool]:
    """``value`` as the gateway's answer text, and whether something had to be turned into text."""
    try:
        return orjson.dumps(value, option=_PLAIN_ONLY).decode("utf-8"), False
    except TypeError:  # orjson.JSONEncodeError: not plain values only (see the module's docstring)
        pass
    converted = False

    def as_text(item: object) -> str:
        nonlocal converted
        converted = True
        return str(item)

    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=as_text)
    return text, converted


def answer_bytes(text: str) -> bytes:
    """The UTF-8 bytes of an answer text (lone surrogates from vSphere strings kept, never an error)."""
    return text.encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class Answer:
    """A tool's result as plain JSON values (``value``) and as the text sent to the caller (``text``)."""

    value: dict[str, Any]
    text: str

    @classmethod
    def of(cls, value: dict[str, Any]) -> Answer:
        """Encode ``value`` (blocking for a large value: call from a worker thread)."""
        text, converted = encode_json(value)
        return cls(json.loads(text) if converted else value, text)

    @classmethod
    def cleaned(cls, value: dict[str, Any]) -> Answer:
        """``value`` sanitized (``gateway.sanitize.clean``), then encoded: the one way a tool's
        result becomes what a caller reads. Blocking for a large value: call from a worker thread.

        The encoding is checked first: when it shows no string ``clean`` would change (plain ASCII
        inventory, the usual case) it is the answer as it is, so a large result is encoded once and
        never walked in Python."""
        answer = cls.of(value)
        if encoded_is_clean(answer.text):
            return answer
        return cls.of(clean(answer.value))

    def copy(self) -> Answer:
        """The same answer with a shallow copy of its value (the text is immutable)."""
        return Answer(dict(self.value), self.text)

    def with_field(self, key: str, item: Any) -> Answer:
        """This answer with one more top-level field, without encoding it again: the field's encoding is
        appended to the text. ``key`` and ``item`` are the gateway's own (a name, a number)."""
        if key in self.value or not self.value or not self.text.endswith("}"):
            return Answer.cleaned({**self.value, key: item})
        text, _ = encode_json({key: item})
        return Answer({**self.value, key: item}, f"{self.text[:-1]},{text[1:]}")

    @classmethod
    def composed(cls, fields: Mapping[str, Any]) -> Answer:
        """An object of ``fields`` whose ``Answer`` values keep their text as it is (no decode, no second
        encoding of a big answer); the other values (the gateway's own: names, counts) are encoded."""
        texts = [f"{encode_json(key)[0]}:{item.text if isinstance(item, Answer) else encode_json(item)[0]}"
                 for key, item in fields.items()]
        value = {key: item.value if isinstance(item, Answer) else item for key, item in fields.items()}
        return cls(value, "{" + ",".join(texts) + "}")

    @property
    def data(self) -> bytes:
        return answer_bytes(self.text)
