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
        tail = f",{encode_json({key: item})[0][1:]}"
        # what is derived from the new text is derived from this answer's (its hash before the closing
        # brace, its JSON string) and the short tail: a kept answer is hashed and encoded once however
        # many answers are made of it
        return Answer({**self.value, key: item}, f"{self.text[:-1]}{tail}", {_HEAD: self, _TAIL: tail})

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
        """(sha256 hex, size in bytes) of ``data``, what an audit row keeps of this answer; computed once
        (for an answer ``with_field`` made, from its head's hash and its tail)."""
        found: tuple[str, int] | None = self.derived.get("fingerprint")
        if found is None:
            head: Answer | None = self.derived.get(_HEAD)
            if head is not None:
                digest, size = head._open_digest()
                tail = answer_bytes(self.derived[_TAIL])
                digest.update(tail)
                found = (digest.hexdigest(), size + len(tail))
            elif self.text.endswith("}"):
                digest, size = self._open_digest()
                digest.update(b"}")
                found = (digest.hexdigest(), size + 1)
            else:
                data = self.data
                found = (hashlib.sha256(data).hexdigest(), len(data))
            self.derived["fingerprint"] = found
        return found

    def _open_digest(self) -> tuple[Any, int]:
        """A sha256 of ``data`` without its closing brace, left open (a copy: the one kept is hashed
        once), and that byte count. Only for a text ending in ``}``."""
        found: tuple[Any, int] | None = self.derived.get(_OPEN)
        if found is None:
            data = memoryview(self.data)[:-1]
            found = self.derived[_OPEN] = (hashlib.sha256(data), len(data))
        return found[0].copy(), found[1]

    def json_string(self) -> bytes | None:
        """``text`` as a JSON string (its quotes included, UTF-8), as a JSON message carrying this answer
        as a text holds it; computed once. None for a text orjson cannot encode (a lone surrogate).

        For an answer ``with_field`` made: its head's JSON string without the closing brace and quote,
        then its tail's (a JSON string escapes each character on its own, so the pieces' escapes are
        the whole's)."""
        if "json_string" not in self.derived:
            head: Answer | None = self.derived.get(_HEAD)
            encoded: bytes | None = None
            try:
                if head is None:
                    encoded = orjson.dumps(self.text)
                else:
                    start = head.json_string()
                    if start is not None:  # one copy of the head's bytes, not a slice and a copy
                        tail = orjson.dumps(self.derived[_TAIL])
                        encoded = b"".join((memoryview(start)[:-2], memoryview(tail)[1:]))
            except TypeError:  # orjson.JSONEncodeError
                encoded = None
            self.derived["json_string"] = encoded
        found: bytes | None = self.derived["json_string"]
        return found


#: ``derived`` keys of an answer ``with_field`` made: the answer it extends and the text it appended
_HEAD: Final = "head"
_TAIL: Final = "tail"
#: ``derived`` key of a text's open digest (``Answer._open_digest``)
_OPEN: Final = "open_digest"
