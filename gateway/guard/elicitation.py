"""Who confirms a proposal (pure): the agent with its token, or the person at the MCP client asked in-band.

``confirm_route`` decides from the policy's ``confirm_by``, whether the target is gated and what the
client can ask. An accepted form is the proposer's own confirmation, never an approval: a gated
proposal is never confirmed in-band.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.guard.policy.model import ConfirmBy


class Route(StrEnum):
    TOKEN = "token"
    ASK_FORM = "ask_form"
    ASK_URL = "ask_url"
    LINK = "link"
    REFUSE = "refuse"


@dataclass(frozen=True)
class ClientAsks:
    """What the MCP client declared it can ask its person (its ``elicitation`` capability)."""

    form: bool = False
    url: bool = False

    @property
    def any(self) -> bool:
        return self.form or self.url


@dataclass(frozen=True)
class ConfirmRoute:
    route: Route
    #: whether the agent's answer may carry the confirmation token (``confirm_action``)
    token_for_agent: bool
    reason: str


def confirm_route(confirm_by: ConfirmBy | str, gated: bool, client: ClientAsks) -> ConfirmRoute:
    """How the proposal of one call is confirmed (see the module's table). Pure."""
    how = ConfirmBy(confirm_by)
    if how is ConfirmBy.TOOL or (gated and not client.any):
        return ConfirmRoute(Route.TOKEN, True, f"confirm_by {how.value}: the caller confirms with its token")
    if gated:
        if client.url:
            return ConfirmRoute(Route.ASK_URL, True, "a human must approve: the person is sent to the card")
        return ConfirmRoute(Route.LINK, True, "a human must approve: the answer links the card")
    if client.form:
        return ConfirmRoute(Route.ASK_FORM, False, f"confirm_by {how.value}: the person at the client "
                            "confirms in-band")
    if how is ConfirmBy.ELICITATION:
        return ConfirmRoute(Route.REFUSE, False, "this call's proposals must be confirmed by the person at "
                            "the MCP client (confirm_by: elicitation), and this client cannot ask its person "
                            "(it declared no form elicitation); use a client that supports MCP elicitation, "
                            "or ask the operator to set confirm_by: either in rules.yaml")
    return ConfirmRoute(Route.TOKEN, True, "confirm_by either: this client cannot ask its person; the "
                        "caller confirms with its token")


def may_confirm_with_token(confirm_by: ConfirmBy | str) -> bool:
    """Whether ``confirm_action`` with a token may confirm a proposal made under ``confirm_by``."""
    return ConfirmBy(confirm_by) is not ConfirmBy.ELICITATION
