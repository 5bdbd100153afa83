"""What the approval page reads from a request, bounded and checked before anything is decided.

A malformed value is an ``InvalidArgument`` (or ``NotFound``) naming what to send instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Final

from starlette.requests import Request

from gateway.errors import InvalidArgument, NotFound
from gateway.guard.approvals import MAX_REASON_CHARS

#: the longest gateway token a sign-in accepts (an identity provider's JWT: ``identity.verify``)
MAX_TOKEN_CHARS: Final = 256
#: the longest audit filter value
MAX_FILTER_CHARS: Final = 128
_PROPOSAL_ID: Final = re.compile(r"[a-z0-9]{12}")


def proposal_id(request: Request) -> str:
    pid = str(request.path_params["pid"])
    if not _PROPOSAL_ID.fullmatch(pid):
        raise NotFound(f"no proposal {pid[:40]!r}; proposal ids are 12 lowercase letters and digits")
    return pid


def query_text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    if len(value) > MAX_FILTER_CHARS:
        raise InvalidArgument(name, f"at most {MAX_FILTER_CHARS} characters")
    return value or None


def query_count(request: Request, name: str, default: int, maximum: int) -> int:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise InvalidArgument(name, f"a whole number from 1 to {maximum}")
    return int(raw)


def query_choice(request: Request, name: str, choices: Sequence[str], default: str) -> str:
    """One of ``choices`` from the query string (``default`` when absent); another value is refused."""
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise InvalidArgument(name, f"one of {', '.join(choices)}")
    return raw


async def reason_from(request: Request) -> str:
    """The reason of an approve or deny: ``{"reason": "..."}`` (an empty body: none given). Bounded
    here; the flow sanitizes and redacts it (``proposal_views.clean_reason``)."""
    raw = await request.body()
    if not raw.strip():
        return ""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    reason = body.get("reason", "") if isinstance(body, dict) else None
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS * 4:
        raise InvalidArgument("reason", f"send the reason as JSON: {{\"reason\": \"...\"}}, at most "
                              f"{MAX_REASON_CHARS} characters")
    return reason


async def token_from(request: Request, limit: int = MAX_TOKEN_CHARS) -> str:
    try:
        body = await request.json()
    except ValueError:
        body = None
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token.strip() or len(token) > limit:
        raise InvalidArgument("token", "send the token as JSON: {\"token\": \"gwt_...\"}")
    return token.strip()
