"""Regular expressions that callers supply, on a linear-time engine (RE2).

No pattern can hold a worker thread or the interpreter lock: RE2 never backtracks. Patterns are
bounded in length and program size; backreferences and lookaround are refused as ``invalid_argument``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import re2  # type: ignore[import-untyped]

from gateway.errors import InvalidArgument

MAX_PATTERN_CHARS: Final = 200
#: RE2's memory budget for one compiled pattern (its default is 8 MiB)
MAX_PROGRAM_BYTES: Final = 8 << 20


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the error goes to the caller, not to the process's stderr
    options.max_mem = MAX_PROGRAM_BYTES
    return options


@dataclass(frozen=True)
class UserRegex:
    """A compiled user pattern. ``search`` finds it anywhere in a text, ``match`` at the start and
    ``fullmatch`` over the whole text; each returns a bool."""

    pattern: str
    _compiled: Any

    def search(self, text: str) -> bool:
        return self._compiled.search(text) is not None

    def match(self, text: str) -> bool:
        return self._compiled.match(text) is not None

    def fullmatch(self, text: str) -> bool:
        return self._compiled.fullmatch(text) is not None


def compile_user_regex(field: str, pattern: str) -> UserRegex:
    """Compile ``pattern`` given as parameter ``field``; ``InvalidArgument`` naming ``field`` if it is
    too long or not a pattern RE2 accepts."""
    if not isinstance(pattern, str):
        raise InvalidArgument(field, "must be a string holding a regular expression")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidArgument(field, f"must be at most {MAX_PATTERN_CHARS} characters, got {len(pattern)}")
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as exc:
        raise InvalidArgument(field, f"not a valid regular expression ({_reason(exc)}); the syntax is "
                                     "RE2's: no backreferences or lookaround") from None
    return UserRegex(pattern, compiled)


def _reason(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
