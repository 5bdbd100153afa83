"""Text no storage engine can keep: found at the entry of a call, escaped wherever a row is written.

PostgreSQL refuses a NUL character in ``text`` and ``jsonb`` (``\\u0000`` cannot be converted to
text), and no engine that stores UTF-8 can encode a lone surrogate (``\\ud800``: JSON can carry one
escaped, UTF-8 cannot). A caller who puts either in a tool name, a target or any argument would
otherwise make the call's audit row impossible to write on one engine and not on the other.

So:

- ``unstorable_field(name, args)`` finds the first such character in a call (the tool name, every
  argument key and every string value, nested), so the pipeline refuses it as an invalid argument
  before anything else looks at the call;
- ``storable_text(text)`` escapes every such character visibly (``\\u0000``, ``\\udc80``, the escape
  style of ``gateway.sanitize``), and the audit's bounding step applies it to every key and string of
  every row, so the refusal itself is written on both engines alike.

Pure: imports nothing from the gateway.
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
