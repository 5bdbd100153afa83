"""Reading a tools/call result as the gateway sends it: one text block holding the answer's JSON."""

from __future__ import annotations

import json
from typing import Any


def answer_of(result: Any) -> dict[str, Any]:
    """The JSON object in ``result``'s one text block (a success's value, or ``{"error": ...}``)."""
    assert getattr(result, "structured_content", None) is None, "the gateway sends no structured block"
    (block,) = result.content
    assert block.type == "text"
    value = json.loads(block.text)
    assert isinstance(value, dict)
    return value
