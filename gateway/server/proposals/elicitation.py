"""Confirmation by the person at the MCP client (MCP elicitation), in-band, for a fresh proposal.

``InBand.settle`` follows ``guard.elicitation.confirm_route``: a form the person accepts (the proposal
runs through the same confirm path as ``confirm_action``), declines (cancelled) or leaves (the token
stays, unless ``confirm_by: elicitation``); a URL to the proposal's card; or the token alone. Every
answer of the person is one ``elicited`` row, written before anything follows from it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from gateway.answer import Answer
from gateway.errors import PolicyDenied
from gateway.guard.elicitation import ClientAsks, ConfirmRoute, Route, confirm_route
from gateway.guard.policy.model import ConfirmBy, Decision
from gateway.proposals import Proposal
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import CallContext, ProgressSink, truncate

log = logging.getLogger(__name__)

#: how long the person at the client has to answer a confirmation form
ELICIT_TIMEOUT_SECONDS: Final = 300.0
#: the first revision without server-to-client requests on a tool call's stream
STATELESS_REVISION: Final = "2026-07-28"
#: affected objects listed in the form's message (the proposal's answer lists them all)
SHOWN_OBJECTS: Final = 20

FormAsk = Callable[[str, dict[str, Any]], Awaitable[str]]
UrlAsk = Callable[[str, str, str], Awaitable[str]]


@dataclass(frozen=True)
class Asker:
    """How to ask the person at this call's MCP client: what it declared, and the two ways to ask.
    ``form`` and ``url`` return the person's action: accept, decline or cancel."""

    asks: ClientAsks
    form: FormAsk
    url: UrlAsk
    #: where the approval page is, as this client reached the gateway (``https://host:port``)
    base_url: str = ""


#: the asker of the tool call in progress (None: a client that cannot ask, stdio, the page, the CLI)
asker_var: contextvars.ContextVar[Asker | None] = contextvars.ContextVar("gateway_asker", default=None)


def card_url(base_url: str, proposal_id: str) -> str:
    return f"{base_url.rstrip('/')}/ui#proposal={proposal_id}"


class Confirmer(Protocol):
    """Confirms or withdraws a fresh proposal (``gateway.server.proposals.actions.ProposalActions``)."""

    async def execute_proposal(self, proposal: Proposal, actor: Any, *, progress: ProgressSink | None = None,
                               correlation_id: str | None = None, approved: bool = False,
                               client: str | None = None) -> Answer: ...

    async def withdraw(self, ctx: CallContext, proposal: Proposal, reason: str) -> None: ...


class InBand:
    """Routes a fresh proposal to its confirmer (see the module doc)."""

    def __init__(self, trail: AuditTrail, *, timeout_seconds: float = ELICIT_TIMEOUT_SECONDS) -> None:
        self.trail = trail
        self.timeout_seconds = timeout_seconds

    def route(self, decision: Decision) -> ConfirmRoute:
        asker = asker_var.get()
        return confirm_route(decision.confirm_by, decision.require_approval,
                             asker.asks if asker else ClientAsks())

    def refusal(self, route: ConfirmRoute, decision: Decision) -> PolicyDenied | None:
        """The refusal of a call whose proposal nobody could confirm (``Route.REFUSE``), else None."""
        if route.route is not Route.REFUSE:
            return None
        shown = {**decision.to_dict(), "allowed": False, "reason": route.reason}
        return PolicyDenied(route.reason, decision=shown, reason_code="elicitation_unavailable")

    async def settle(self, flow: Confirmer, ctx: CallContext, proposal: Proposal, answer: dict[str, Any],
                     route: ConfirmRoute, confirm_by: str,
                     progress: ProgressSink | None) -> dict[str, Any] | Answer:
        """The answer to the call that made ``proposal`` (``answer``: today's, with its token)."""
        asker = asker_var.get()
        if route.route is Route.TOKEN or asker is None:
            return answer
        url = card_url(asker.base_url, proposal.id)
        if route.route is Route.LINK:
            return {**answer, "card_url": url}
        if route.route is Route.ASK_URL:
            action = await self._ask(ctx, proposal, "url", lambda: asker.url(
                f"Proposal {proposal.id} on {proposal.target} ({proposal.target_host}) needs a human's "
                f"approval: {truncate(proposal.plan_summary, 300)}. Open its card to review it.",
                url, uuid.uuid4().hex))
            return {**answer, "card_url": url, "person_asked": action}
        message, schema = _form(proposal)
        action = await self._ask(ctx, proposal, "form", lambda: asker.form(message, schema))
        if action == "accept":
            return await flow.execute_proposal(proposal, ctx.principal, progress=progress,
                                               correlation_id=ctx.correlation_id, client=ctx.client)
        if action == "decline" or ConfirmBy(confirm_by) is not ConfirmBy.EITHER:
            await flow.withdraw(ctx, proposal, f"{action} by the person at the MCP client")
            return {"state": "cancelled", "proposal_id": proposal.id, "target": proposal.target,
                    "person_answer": action, "note": "Nothing was changed: the person at the client did not "
                    "confirm this proposal."}
        return {**answer, "person_answer": action}

    async def _ask(self, ctx: CallContext, proposal: Proposal, mode: str,
                   ask: Callable[[], Awaitable[str]]) -> str:
        try:
            action = await asyncio.wait_for(ask(), self.timeout_seconds)
        except TimeoutError:
            action = "timeout"
        except Exception:  # the client failed to ask (went away, refused the request): nobody answered
            log.info("elicitation for proposal %s failed (correlation id %s)", proposal.id,
                     ctx.correlation_id, exc_info=True)
            action = "failed"
        await self.trail.record(ctx.row("elicited", target=proposal.target, proposal_id=proposal.id,
                                        mode=mode, answer=action))
        return action


def _form(proposal: Proposal) -> tuple[str, dict[str, Any]]:
    objects = [f"{a.get('type')} '{a.get('name')}' ({a.get('moid')})" for a in proposal.affected]
    listed = "; ".join(objects[:SHOWN_OBJECTS]) + (
        f"; and {len(objects) - SHOWN_OBJECTS} more" if len(objects) > SHOWN_OBJECTS else "")
    message = (f"Confirm on target '{proposal.target}' ({proposal.target_host}): "
               f"{proposal.plan_summary}. Affected: {listed or 'none'}. "
               f"Proposal {proposal.id}, asked by {proposal.caller}. "
               "Accept to run it now, decline to drop it.")
    schema = {"type": "object", "properties": {}}
    return message, schema


def asker_of(request_context: Any) -> Asker | None:
    """The ``Asker`` of an MCP request (the SDK's ``ServerRequestContext``): None when the client declared
    no elicitation, or speaks a revision without server-to-client requests (2026-07-28: no back-channel;
    its input-required rounds are not used yet, so such a client confirms with its token). An empty
    ``elicitation`` capability means form mode (as the protocol says)."""
    if str(getattr(request_context, "protocol_version", "")) >= STATELESS_REVISION:
        return None
    session = request_context.session
    capabilities = getattr(session, "client_capabilities", None)
    declared = getattr(capabilities, "elicitation", None)
    if declared is None:
        return None
    url = declared.url is not None
    form = declared.form is not None or not url
    request = request_context.request
    base = str(getattr(request, "base_url", "") or "")
    related = request_context.request_id

    async def ask_form(message: str, schema: dict[str, Any]) -> str:
        result = await session.elicit_form(message, schema, related_request_id=related)
        return str(result.action)

    async def ask_url(message: str, url: str, elicitation_id: str) -> str:
        result = await session.elicit_url(message, url, elicitation_id, related_request_id=related)
        return str(result.action)

    return Asker(ClientAsks(form=form, url=url), ask_form, ask_url, base)
