"""Datastore paths (``[datastore] folder/file.iso``) in one canonical form, or refused.

``..`` walks out of a datastore (``[ds1] isos/../../ds2/x.iso`` is on ds2), so a prefix check alone can
be walked around. Every path is normalised when arguments are validated, before policy, audit or
vSphere see it; a double escape, a control character or an escape above the root is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

from gateway.errors import InvalidArgument

_SHAPE: Final = re.compile(r"^\[(?P<datastore>[^\[\]]+)\]\s*(?P<path>.*)$", re.DOTALL)
_ESCAPE: Final = re.compile(r"%[0-9A-Fa-f]{2}")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
EXAMPLE: Final = "'[datastore1] isos/image.iso'"


@dataclass(frozen=True)
class DatastorePath:
    """A datastore name and a path below its root (``/``-separated, no ``.``, ``..`` or empty parts)."""

    datastore: str
    path: str

    def __str__(self) -> str:
        return f"[{self.datastore}] {self.path}"


def normalize(text: str, field: str = "path") -> DatastorePath:
    """``text`` as a canonical datastore path; ``InvalidArgument(field)`` when it has no
    ``[datastore]`` prefix, escapes the datastore, is encoded twice or holds control characters."""
    if _CONTROL.search(text):
        raise InvalidArgument(field, "must not contain control characters")
    match = _SHAPE.match(text.strip())
    datastore = match.group("datastore").strip() if match else ""
    if match is None or not datastore:
        raise InvalidArgument(field, f"expected a datastore path like {EXAMPLE}")
    raw = match.group("path").replace("\\", "/")
    try:
        decoded = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument(field, "holds percent-escapes that are not UTF-8 text") from None
    if _ESCAPE.search(decoded):
        raise InvalidArgument(field, "is percent-encoded twice; give the path as plain text")
    if _CONTROL.search(decoded):
        raise InvalidArgument(field, "must not contain control characters (percent-encoded ones included)")
    return DatastorePath(datastore, _resolve(decoded.replace("\\", "/"), datastore, field))


def _resolve(path: str, datastore: str, field: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise InvalidArgument(
                    field, f"walks out of datastore '{datastore}' with '..'; name a file inside it "
                    f"(like {EXAMPLE})")
            parts.pop()
            continue
        parts.append(part)
    if not parts:
        raise InvalidArgument(field, f"names no file inside datastore '{datastore}' (like {EXAMPLE})")
    return "/".join(parts)


def iso_path(text: str, field: str = "iso_path") -> DatastorePath:
    """``normalize`` for an ISO image: the canonical path must end in ``.iso``."""
    found = normalize(text, field)
    if not found.path.lower().endswith(".iso"):
        raise InvalidArgument(field, f"expected an ISO image (a .iso file) like {EXAMPLE}")
    return found


def canonical_iso_path(text: str) -> str:
    """The canonical text of an ``iso_path`` argument (what validation keeps)."""
    return str(iso_path(text))
