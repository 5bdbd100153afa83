"""A tool's answer, encoded once: the JSON text the caller receives is the text the audit fingerprints.

Nothing re-encodes an answer on the way, so anyone holding it can check it against its audit row with
``sha256sum``. Plain values go through ``orjson``, whose text matches the standard library's except
for exponents and NaN (written ``null``); anything else (a date, a lone surrogate, a big integer) takes
the standard library's way and is re-read from the text, so ``value`` and ``text`` never disagree.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    #: what is derived from ``text`` alone, made once and shared by the copies of this answer (a mirror's
    #: kept answer is sent many times): its fingerprint, its encoding as a JSON string
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

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
        """The same answer with a shallow copy of its value (the text is immutable, and what is derived
        from it shared)."""
        return Answer(dict(self.value), self.text, self.derived)

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

    def fingerprint(self) -> tuple[str, int]:
        """(sha256 hex, size in bytes) of ``data``, what an audit row keeps of this answer; computed once."""
        found: tuple[str, int] | None = self.derived.get("fingerprint")
        if found is None:
            data = self.data
            found = self.derived["fingerprint"] = (hashlib.sha256(data).hexdigest(), len(data))
        return found

    def json_string(self) -> bytes | None:
        """``text`` as a JSON string (its quotes included, UTF-8), as a JSON message carrying this answer
        as a text holds it; computed once. None for a text orjson cannot encode (a lone surrogate)."""
        if "json_string" not in self.derived:
            try:
                self.derived["json_string"] = orjson.dumps(self.text)
            except TypeError:  # orjson.JSONEncodeError
                self.derived["json_string"] = None
        encoded: bytes | None = self.derived["json_string"]
        return encoded
