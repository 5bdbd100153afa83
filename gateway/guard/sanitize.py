"""Text from vSphere made safe to hand to a model.

Names, annotations, event messages and guest-reported strings are written by whoever controls the
inventory, so they may carry characters a reader cannot see: control characters, bidirectional
overrides that reorder what is displayed, zero-width characters, Unicode tag characters that spell
out hidden instructions, and runs of variation selectors that smuggle bytes.

Contract of ``clean_text``:
- Every such character is replaced by a *visible* escape (``\\u202e``, ``\\U000e0041``) rather than
  deleted. Deleting would make ``"web\\u200b1"`` read as ``"web1"``, the name of a different VM the
  model might then act on; an escape keeps distinct names distinct and shows that something was there.
- ``\\n`` and ``\\t`` are kept; ``\\r\\n`` becomes ``\\n``.
- No Unicode normalisation: NFKC would turn a VM named with full-width letters into the ASCII name of
  another VM. Printable text passes through unchanged.
- The result is at most ``max_len`` characters; longer text is cut and ends with a marker giving its full
  length.
- Printable ASCII (almost every inventory string) costs two C-level scans and no copy.

``clean`` applies ``clean_text`` to every string in nested dicts, lists and tuples, keys included.
"""

from __future__ import annotations

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

    Dicts, lists and tuples are rebuilt; any other value is returned as it is.
    """
    if isinstance(value, str):
        return clean_text(value, max_len)
    if isinstance(value, dict):
        return {clean(k, max_len): clean(v, max_len) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v, max_len) for v in value]
    if isinstance(value, tuple):
        return tuple(clean(v, max_len) for v in value)
    return value
