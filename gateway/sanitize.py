"""Text from vSphere made safe to hand to a model: hidden characters become visible escapes.

Inventory strings are written by whoever controls the inventory, so control, bidi, zero-width, tag
and variation-selector characters are escaped, never deleted (a zero-width space must not make a name
read as another VM's), and nothing is normalised (NFKC could turn one VM's name into another's).
Long text is cut with a marker giving its full length.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from typing import Any

DEFAULT_MAX_LEN = 1024
_KEPT_CONTROLS = frozenset("\n\t")
#: categories a reader cannot see: controls, format (zero-width, bidi, tags), surrogates, separators
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_ASCII_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
#: variation selectors: the supplement block is never needed in names; FE00-FE0F only singly
_SMUGGLED = re.compile(r"[\U000e0100-\U000e01ef]|(?<=[\ufe00-\ufe0f])[\ufe00-\ufe0f]")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _is_hidden(ch: str) -> bool:
    return ch not in _KEPT_CONTROLS and unicodedata.category(ch) in _HIDDEN_CATEGORIES


def _escape_hidden(value: str) -> str:
    value = value.replace("\r\n", "\n")
    if value.isascii():
        return _ASCII_UNSAFE.sub(lambda m: _escape(m.group()), value)
    value = _SMUGGLED.sub(lambda m: _escape(m.group()), value)
    if value.isprintable():
        return value
    return "".join(_escape(ch) if _is_hidden(ch) else ch for ch in value)


def _bound(value: str, max_len: int) -> str:
    if len(value) <= max_len:
        return value
    marker = f"…[truncated, {len(value)} chars]"
    if len(marker) * 2 > max_len:
        marker = "…"
    return (value[: max(max_len - len(marker), 0)] + marker)[:max_len]


def clean_text(value: str, max_len: int = DEFAULT_MAX_LEN) -> str:
    """``value`` with hidden characters escaped visibly and its length bounded (see the module doc)."""
    if value.isascii() and _ASCII_UNSAFE.search(value) is None:
        return value if len(value) <= max_len else _bound(value, max_len)
    return _bound(_escape_hidden(value), max_len)


def clean(value: Any, max_len: int = DEFAULT_MAX_LEN) -> Any:
    """``value`` with every string inside (dict keys too) passed through ``clean_text``.

    Dicts, lists and tuples are rebuilt, unless no string inside them would change: then ``value``
    itself is returned (so a result of thousands of plain rows costs one JSON encoding in C instead
    of a Python call per string). Any other value is returned as it is.
    """
    if isinstance(value, dict | list | tuple) and _nothing_to_clean(value, max_len):
        return value
    return _clean(value, max_len)


def _clean(value: Any, max_len: int) -> Any:
    if isinstance(value, str):
        return clean_text(value, max_len)
    if isinstance(value, dict):
        return {_clean(k, max_len): _clean(v, max_len) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, max_len) for v in value]
    if isinstance(value, tuple):
        return tuple(_clean(v, max_len) for v in value)
    return value


def _nothing_to_clean(value: dict[Any, Any] | list[Any] | tuple[Any, ...], max_len: int) -> bool:
    """True when no string in ``value`` would change, judged from its JSON encoding.

    The encoder writes every string (keys too) between quotes and escapes quotes, backslashes and
    control characters with a backslash, so an ASCII encoding without a backslash or DEL holds only
    printable ASCII strings, which ``clean_text`` returns as they are unless longer than ``max_len``:
    such a string shows as a run of more than ``max_len`` characters after a quote. Values ``clean``
    does not enter (numbers, dates, sets...) are encoded as null. False whenever unsure.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, default=_not_entered)
    except (TypeError, ValueError, RecursionError):  # keys of other types, cycles
        return False
    return encoded_is_clean(text, max_len)


def encoded_is_clean(text: str, max_len: int = DEFAULT_MAX_LEN) -> bool:
    """True when ``text``, a JSON encoding made with ``ensure_ascii=False``, holds no string that
    ``clean_text`` would change (see ``_nothing_to_clean``); False whenever unsure. A few C-level scans
    over the text: how a large answer already encoded is checked without a walk."""
    return (text.isascii() and "\\" not in text and "\x7f" not in text
            and not _may_hold_long_run(text, max_len))


def _may_hold_long_run(text: str, max_len: int) -> bool:
    """Whether ``text`` may hold more than ``max_len`` characters in a row without a quote (a string
    longer than ``max_len``): exactly, by a regular expression, unless every whole tile of ``text``
    cut at multiples of ``(max_len + 1) // 2`` holds a quote. Such a run covers at least one whole
    tile, so then there is none; one ``str.find`` per tile stops at its first quote (a listing's
    strings are short), far cheaper than the expression on a listing."""
    tile = max((max_len + 1) // 2, 1)
    find = text.find
    whole = len(text) - tile + 1
    if all(find('"', start, start + tile) >= 0 for start in range(0, max(whole, 0), tile)):
        return False
    return _long_run(max_len).search(text) is not None


def _not_entered(_value: object) -> None:
    return None


@functools.lru_cache(maxsize=8)
def _long_run(max_len: int) -> re.Pattern[str]:
    return re.compile(f'"[^"]{{{max_len + 1}}}')
