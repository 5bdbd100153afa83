"""Tools that manage two-phase proposals. The pipeline serves them itself (no vSphere handler)."""

from __future__ import annotations

from gateway.tools.spec import Param, ToolSpec
from gateway.vocabulary import Category, Risk

_TOKEN = Param("token", "string", "The confirmation token returned by the proposal.", required=True)

LIST_PENDING = ToolSpec(
    name="list_pending_actions",
    description="List proposals awaiting confirmation that this caller may see: target, summary, "
                "affected objects, expiry and whether a human must approve them.",
    category=Category.READ, risk=Risk.LOW, target_mode="none",
)
CONFIRM = ToolSpec(
    name="confirm_action",
    description="Execute a pending proposal. Re-read the proposal's target and affected objects first: "
                "the token is single use, bound to you, and expires. Policy is checked again and the objects "
                "re-resolved; a changed object makes the proposal stale.",
    category=Category.DESTRUCTIVE, risk=Risk.HIGH, params=(_TOKEN,), target_mode="none",
)
CANCEL = ToolSpec(
    name="cancel_action",
    description="Cancel a pending proposal so its token can never execute.",
    category=Category.WRITE, risk=Risk.LOW, params=(_TOKEN,), target_mode="none",
)
PENDING_TOOLS = (LIST_PENDING, CONFIRM, CANCEL)
