"""Text no storage engine can keep: found at the entry of a call, escaped wherever a row is written.

PostgreSQL refuses NUL in text and no UTF-8 engine stores a lone surrogate, so such a call would be
auditable on one engine and not the other. The call is refused as an invalid argument, and every
row's strings are escaped visibly, so the refusal itself is written on both. Imports nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

#: NUL and every UTF-16 surrogate code point (a Python ``str`` holds a surrogate only when unpaired)
_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")
#: nesting looked into (deeper values are refused by argument validation anyway)
_MAX_DEPTH: Final = 32
UNSTORABLE_MESSAGE: Final = (
    "contains a NUL character or an unpaired UTF-16 surrogate, which cannot be stored or sent to "
    "vSphere; remove it (the audit row shows it escaped, as \\u0000 or \\udXXX)"
)


def has_unstorable(text: str) -> bool:
    return _UNSTORABLE.search(text) is not None


def storable_text(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by its visible escape (``\\u0000``)."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def unstorable_field(name: str, args: Mapping[str, Any] | None) -> str | None:
    """The first place of a call holding unstorable text: ``"tool"`` (the name), an argument's name,
    or a path such as ``"vms[2]"``; None when the call is clean."""
    if has_unstorable(name):
        return "tool"
    return _find(dict(args or {}), "", 0)


def _find(value: Any, path: str, depth: int) -> str | None:
    if isinstance(value, str):
        return (path or "arguments") if has_unstorable(value) else None
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            key_text = str(key)
            here = f"{path}.{key_text}" if path else key_text
            if has_unstorable(key_text):
                return storable_text(here)
            found = _find(item, here, depth + 1)
            if found is not None:
                return storable_text(found)
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _find(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
    return None
