"""Confirmation by the person at the MCP client (MCP elicitation), in-band, for a fresh proposal.

``InBand.settle`` follows ``guard.elicitation.confirm_route``: a form the person accepts (the proposal
runs through the same confirm path as ``confirm_action``), declines (cancelled) or leaves (the token
stays, unless ``confirm_by: elicitation``); a URL to the proposal's card; or the token alone. Every
answer of the person is one ``elicited`` row, written before anything follows from it.

How the person is asked is decided per request. On the handshake revisions (2025-11-25 and before) the
question is a request to the client on the call's own stream, answered within the call. The 2026-07-28
revision has no such request: the question (an ``Ask``) is left in the call's ``RoundSlot``, the edge
answers ``input_required`` with it and a sealed ``requestState``, and the client's retry carries the
person's answer (``gateway.server.proposals.request_state.Rounds``), which ``InBand.follow`` takes on
exactly as it takes an answer given within the call."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
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

#: the key of the one input request of a 2026-07-28 confirmation round (``inputRequests``)
ROUND_KEY: Final = "confirm"
#: the person's actions an elicitation result may carry
ACTIONS: Final = frozenset({"accept", "decline", "cancel"})

FormAsk = Callable[[str, dict[str, Any]], Awaitable[str]]
UrlAsk = Callable[[str, str, str], Awaitable[str]]
#: the answer the agent gets when the person's answer leaves the proposal pending (built when needed)
Shown = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Ask:
    """The question a 2026-07-28 call leaves for its client to put to the person (``input_required``)."""

    proposal: Proposal
    #: ``form`` (confirm it here) or ``url`` (open the proposal's card)
    mode: str
    message: str
    schema: dict[str, Any] | None = None
    url: str | None = None
    #: the confirmation token, where the person's answer may hand it to the agent (else None)
    token: str | None = None
    confirm_by: str = "tool"
    dry_run: bool = False


@dataclass
class RoundSlot:
    """Where ``InBand.settle`` leaves the ``Ask`` of a call on a revision without server-to-client
    requests; the edge, finding it filled, answers ``input_required`` instead of the call's answer."""

    asked: Ask | None = None

    def leave(self, asked: Ask) -> None:
        self.asked = asked


@dataclass(frozen=True)
class Asker:
    """How to ask the person at this call's MCP client: what it declared, and how to ask. On the
    handshake revisions ``form`` and ``url`` ask within the call and return the person's action
    (accept, decline or cancel); on 2026-07-28 ``rounds`` takes the question instead."""

    asks: ClientAsks
    form: FormAsk | None = None
    url: UrlAsk | None = None
    #: where the approval page is, as this client reached the gateway (``https://host:port``)
    base_url: str = ""
    #: a 2026-07-28 call's slot for its question (None: ask within the call)
    rounds: RoundSlot | None = None


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
        dry_run = bool(answer.get("dry_run"))
        if route.route is Route.LINK:
            return {**answer, "card_url": url}
        if route.route is Route.ASK_URL:
            message = _url_message(proposal)
            if asker.rounds is not None:
                asked = Ask(proposal, "url", message, url=url, token=answer.get("token"),
                            confirm_by=confirm_by, dry_run=dry_run)
                return _defer(asker.rounds, asked, {**answer, "card_url": url})
            ask_url = asker.url
            assert ask_url is not None  # asking within the call: ``asker_of`` gave both ways
            action = await self._ask(ctx, proposal, "url", lambda: ask_url(message, url, uuid.uuid4().hex))
            return await self.follow(flow, ctx, proposal, "url", action, confirm_by, progress,
                                     lambda: {**answer, "card_url": url})
        message, schema = _form(proposal)
        if asker.rounds is not None:
            token = answer.get("token") if ConfirmBy(confirm_by) is ConfirmBy.EITHER else None
            asked = Ask(proposal, "form", message, schema, token=token, confirm_by=confirm_by,
                        dry_run=dry_run)
            return _defer(asker.rounds, asked, without_token(answer))
        ask_form = asker.form
        assert ask_form is not None
        action = await self._ask(ctx, proposal, "form", lambda: ask_form(message, schema))
        return await self.follow(flow, ctx, proposal, "form", action, confirm_by, progress, lambda: answer)

    async def follow(self, flow: Confirmer, ctx: CallContext, proposal: Proposal, mode: str, action: str,
                     confirm_by: str, progress: ProgressSink | None, shown: Shown) -> dict[str, Any] | Answer:
        """What the person's ``action`` (already audited) does, however it came: an accepted form runs the
        proposal through the confirm path; a declined one (or any other answer but ``either``'s cancel)
        withdraws it; otherwise the proposal stays and the agent gets ``shown()``. An answer to a URL
        is no approval: the proposal stays as it is."""
        if mode == "url":
            return {**shown(), "person_asked": action}
        if action == "accept":
            return await flow.execute_proposal(proposal, ctx.principal, progress=progress,
                                               correlation_id=ctx.correlation_id, client=ctx.client)
        if action == "decline" or ConfirmBy(confirm_by) is not ConfirmBy.EITHER:
            await flow.withdraw(ctx, proposal, f"{action} by the person at the MCP client")
            return {"state": "cancelled", "proposal_id": proposal.id, "target": proposal.target,
                    "person_answer": action, "note": "Nothing was changed: the person at the client did not "
                    "confirm this proposal."}
        return {**shown(), "person_answer": action}

    async def answered(self, ctx: CallContext, proposal: Proposal, mode: str, action: str) -> None:
        """The ``elicited`` row of the person's answer, written before anything follows from it."""
        await self.trail.record(ctx.row("elicited", target=proposal.target, proposal_id=proposal.id,
                                        mode=mode, answer=action))

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
        await self.answered(ctx, proposal, mode, action)
        return action


def _defer(slot: RoundSlot, asked: Ask, waiting: dict[str, Any]) -> dict[str, Any]:
    """Leave ``asked`` for the edge to send (``input_required``); the call's answer, which the client
    does not see while its person is asked, says so."""
    slot.leave(asked)
    return {**waiting, "person_asked": "input_required"}


def without_token(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` without its confirmation token (``confirm_with`` spells it out too)."""
    return {k: v for k, v in answer.items() if k not in ("token", "confirm_with")}


def person_action(responses: Mapping[str, Any] | None) -> str:
    """The person's action in a retry's ``inputResponses`` (``ROUND_KEY``); ``failed`` when it carries
    none this gateway asked for (a client that could not ask)."""
    given = (responses or {}).get(ROUND_KEY)
    action = given.get("action") if isinstance(given, Mapping) else getattr(given, "action", None)
    return action if isinstance(action, str) and action in ACTIONS else "failed"


def _form(proposal: Proposal) -> tuple[str, dict[str, Any]]:
    objects = [f"{a.get('type')} '{a.get('name')}' ({a.get('moid')})" for a in proposal.affected]
    listed = _listed(objects)
    blast = blast_text(proposal.blast_radius)
    message = (f"Confirm on target '{proposal.target}' ({proposal.target_host}): "
               f"{proposal.plan_summary}. Affected: {listed or 'none'}. "
               + (f"Blast radius: {blast}. " if blast else "")
               + f"Proposal {proposal.id}, asked by {proposal.caller}. "
               "Accept to run it now, decline to drop it.")
    schema = {"type": "object", "properties": {}}
    return message, schema


def _url_message(proposal: Proposal) -> str:
    return (f"Proposal {proposal.id} on {proposal.target} ({proposal.target_host}) needs a human's "
            f"approval: {truncate(proposal.plan_summary, 300)}. Open its card to review it.")


def _listed(items: list[str]) -> str:
    return "; ".join(items[:SHOWN_OBJECTS]) + (
        f"; and {len(items) - SHOWN_OBJECTS} more" if len(items) > SHOWN_OBJECTS else "")


def blast_text(blast: Mapping[str, Any] | None) -> str:
    """A proposal's blast radius in a line for the person: each object's power state, host, cluster,
    snapshots and disks (sizes and datastores), bounded; empty when the plan read none."""
    if not blast:
        return ""
    shown = []
    for obj in blast.get("objects") or ():
        if not isinstance(obj, Mapping):
            continue
        facts = [str(obj.get(k)) for k in ("power_state",) if obj.get(k)]
        facts += [f"{label} {obj.get(k)}" for k, label in (("host", "host"), ("cluster", "cluster"))
                  if obj.get(k)]
        if obj.get("snapshot_count") is not None:
            facts.append(f"{obj.get('snapshot_count')} snapshot(s)")
        disks = [f"{d.get('label')} {d.get('size')}"
                 + (f" on {d.get('datastore')}" if d.get("datastore") else "")
                 for d in obj.get("disks") or () if isinstance(d, Mapping)]
        if disks:
            facts.append("disks " + ", ".join(disks))
        shown.append(f"'{obj.get('name')}' ({', '.join(facts)})" if facts else f"'{obj.get('name')}'")
    count = blast.get("count")
    text = (f"{count} object(s): " if isinstance(count, int) and count != 1 else "") + _listed(shown)
    return truncate(text, 1200)


def is_stateless(request_context: Any) -> bool:
    """Whether an MCP request speaks a revision without server-to-client requests (2026-07-28 on)."""
    return str(getattr(request_context, "protocol_version", "") or "") >= STATELESS_REVISION


def asker_of(request_context: Any, *, rounds: bool = False) -> Asker | None:
    """The ``Asker`` of an MCP request (the SDK's ``ServerRequestContext``): None when the client declared
    no elicitation. On 2026-07-28 (no back-channel) the person is asked in rounds (``rounds``: the edge
    can answer ``input_required``); without them such a client confirms with its token. An empty
    ``elicitation`` capability means form mode (as the protocol says); on 2026-07-28 the capability is
    the request's own (its ``_meta``)."""
    stateless = is_stateless(request_context)
    if stateless and not rounds:
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
    if stateless:
        return Asker(ClientAsks(form=form, url=url), base_url=base, rounds=RoundSlot())
    related = request_context.request_id

    async def ask_form(message: str, schema: dict[str, Any]) -> str:
        result = await session.elicit_form(message, schema, related_request_id=related)
        return str(result.action)

    async def ask_url(message: str, url: str, elicitation_id: str) -> str:
        result = await session.elicit_url(message, url, elicitation_id, related_request_id=related)
        return str(result.action)

    return Asker(ClientAsks(form=form, url=url), ask_form, ask_url, base_url=base)
