"""The 2026-07-28 confirmation rounds: a sealed ``requestState``, and the retry that brings the answer.

On the 2026-07-28 revision a call that needs its person answers ``input_required`` with an elicitation
and an opaque ``requestState``; the client retries the same call with the person's answer and that
state. The state (``RoundState``) names the proposal, the caller's stable key, the tool, a digest of the
call's arguments as sent, the elicitation's mode, its expiry (the proposal's) and, where the person's
answer may hand the agent its token, the token. The client can neither read nor change it: it is
sealed with AES-256-GCM under a key derived (HKDF-SHA256) from the secret the state store keeps for every
replica (``gateway.store.request_states``), so any replica opens what another sealed. The operator's own
secret (``pepper``: GATEWAY_REQUEST_STATE_SECRET or its _FILE, ``Settings.request_state_secret``) is
mixed in as HKDF's salt, so reading the store is not enough to seal one; a state sealed under another
pepper (a replica set otherwise) is refused as changed (``request_state_invalid``). The pepper lives in
the process only: never in the store, a row, a log line, an answer or an error.

``open_state`` and ``check_state`` refuse with typed errors (``confirmation_invalid`` or
``confirmation_expired``, and a ``reason_code``): a state that is not one of ours or was changed
(``request_state_invalid``), another caller's (``request_state_not_yours``), another call's
(``request_state_mismatch``), past its proposal's expiry (``request_state_expired``); ``Rounds`` spends
it once in the store (``request_state_spent`` on any replica after), then hands the person's answer to
``InBand.follow``: the same confirm path, rows and ``elicited`` row as an answer given within the call.
Every refusal is one audit row (the gate's), and the state itself is never written anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Final, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.answer import Answer
from gateway.auth.fair_share import queue_for
from gateway.auth.tokens import Principal
from gateway.errors import ConfirmationExpired, ConfirmationInvalid, GatewayError
from gateway.guard.approvals import ApprovalRule
from gateway.guard.callers import key_of, same
from gateway.guard.policy.model import Decision
from gateway.proposals import Proposal
from gateway.server.base.context import CallContext, ProgressSink, off_loop, unknown_tool
from gateway.server.base.facts import FactsNow
from gateway.server.call.gate import Gate
from gateway.server.proposals.elicitation import (
    Ask,
    Confirmer,
    InBand,
    card_url,
    person_action,
    without_token,
)
from gateway.server.proposals.views import pending_answer
from gateway.settings import REQUEST_STATE_SECRET_BYTES
from gateway.store.base import StateStore
from gateway.store.request_states import RequestStates

#: the wire form's version, bound under the tag with the key's id (a state never names its algorithm)
PREFIX: Final = "gw1."
_INFO: Final = b"vsphere-mcp-gateway/request-state/v1/aes-256-gcm"
_KID_LEN, _NONCE_LEN, _TAG_LEN = 4, 12, 16
#: the claims' layout version inside the seal
_VERSION: Final = 1
#: how many spent states pass between two sweeps of those past their expiry
SWEEP_EVERY: Final = 256
#: what a refused state's message says (the reason is the ``reason_code``; the state itself is never shown)
_AGAIN: Final = "call the tool again without a requestState to make a fresh proposal"


@dataclass(frozen=True)
class RoundState:
    """What one round's ``requestState`` holds, sealed."""

    #: random, 128 bits: the spent row's key
    id: str
    #: the caller's stable key (``Principal.key`` as text)
    caller: str
    proposal_id: str
    tool: str
    #: ``wire_digest`` of the call's arguments as the client sent them
    args_digest: str
    #: the elicitation asked: ``form`` (confirm in-band) or ``url`` (the proposal's card)
    mode: str
    expires_at: float
    confirm_by: str
    #: the confirmation token, where the person's answer may hand it to the agent (else None)
    token: str | None = None
    dry_run: bool = False


def new_state_id() -> str:
    return secrets.token_hex(16)


def wire_digest(tool: str, arguments: Mapping[str, Any] | None) -> str:
    """A digest of a call as sent (its tool and arguments, canonical JSON): the retry must send the same."""
    text = json.dumps({"tool": tool, "arguments": dict(arguments or {})}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def invalid(message: str, reason_code: str, **details: Any) -> ConfirmationInvalid:
    return ConfirmationInvalid(f"{message}; {_AGAIN}", reason_code=reason_code, **details)


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _b64u_decode(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64u(raw) != text:  # only the canonical form: no second spelling of one state
        raise ValueError("not canonical base64url")
    return raw


class Sealer:
    """Seals and opens ``RoundState``s under one key (AES-256-GCM, a fresh 96-bit nonce each)."""

    def __init__(self, secret: bytes, *, pepper: bytes | None = None) -> None:
        if len(secret) < 32:
            raise ValueError("the request-state secret must be at least 32 bytes")
        if pepper is not None and len(pepper) < REQUEST_STATE_SECRET_BYTES:  # ``Settings`` refuses it first
            raise ValueError(f"the operator's request-state secret must be at least "
                             f"{REQUEST_STATE_SECRET_BYTES} bytes")
        key = HKDF(algorithm=SHA256(), length=32, salt=pepper, info=_INFO).derive(secret)
        self._kid = hashlib.sha256(b"kid:" + key).digest()[:_KID_LEN]
        self._aead = AESGCM(key)

    def seal(self, state: RoundState) -> str:
        payload = json.dumps({"v": _VERSION, **asdict(state)}, separators=(",", ":")).encode()
        nonce = os.urandom(_NONCE_LEN)
        sealed = self._aead.encrypt(nonce, payload, PREFIX.encode() + self._kid)
        return PREFIX + _b64u(self._kid + nonce + sealed)

    def open(self, wire: object) -> RoundState:
        """The state ``wire`` seals; ``ConfirmationInvalid`` (``request_state_invalid``) for anything this
        key did not seal exactly so."""
        refused = invalid("this requestState is not one this gateway issued, or it was changed",
                          "request_state_invalid")
        if not isinstance(wire, str) or not wire.startswith(PREFIX) or len(wire) > 16384:
            raise refused
        try:
            raw = _b64u_decode(wire[len(PREFIX):])
        except ValueError:
            raise refused from None
        kid, nonce = raw[:_KID_LEN], raw[_KID_LEN:_KID_LEN + _NONCE_LEN]
        if len(raw) < _KID_LEN + _NONCE_LEN + _TAG_LEN or not hmac.compare_digest(kid, self._kid):
            raise refused
        try:
            claims = json.loads(self._aead.decrypt(nonce, raw[_KID_LEN + _NONCE_LEN:], PREFIX.encode() + kid))
        except (InvalidTag, ValueError):
            raise refused from None
        if not isinstance(claims, dict) or claims.pop("v", None) != _VERSION:
            raise refused
        try:
            return RoundState(**claims)
        except TypeError:
            raise refused from None


def check_state(state: RoundState, *, caller: str, tool: str, args_digest: str, now: float) -> None:
    """Refuse (typed) a state presented by another caller, for another call, or past its expiry."""
    if not hmac.compare_digest(state.caller.encode(), caller.encode()):
        raise invalid("this requestState was issued to another caller", "request_state_not_yours")
    if state.tool != tool or not hmac.compare_digest(state.args_digest, args_digest):
        raise invalid("this requestState belongs to another call (another tool or other arguments); "
                      "retry with the call exactly as first made", "request_state_mismatch",
                      proposal_id=state.proposal_id)
    if not now < state.expires_at:
        raise ConfirmationExpired(f"the proposal this requestState confirms has expired; {_AGAIN}",
                                  reason_code="request_state_expired", proposal_id=state.proposal_id)


def spent_refusal(state: RoundState) -> GatewayError:
    return invalid("this requestState was already answered (each is used once)", "request_state_spent",
                   proposal_id=state.proposal_id)


class RoundFlow(Protocol):
    """The parts of the proposal flow a round's retry goes through (``ProposalFlow``)."""

    @property
    def gate(self) -> Gate: ...

    @property
    def store(self) -> StateStore: ...

    @property
    def actions(self) -> Confirmer: ...

    @property
    def in_band(self) -> InBand: ...


class Rounds:
    """Seals a 2026-07-28 call's question into its ``requestState`` and answers the call's retry."""

    def __init__(self, states: RequestStates, *, flow: RoundFlow, facts: FactsNow,
                 pepper: bytes | None = None, clock: Callable[[], float] | None = None) -> None:
        self.states = states
        self.flow = flow
        self.facts = facts
        #: the operator's secret mixed into the key (``Settings.request_state_secret``; None: the store's
        #: secret alone); kept out of ``repr`` and never written anywhere
        self._pepper = pepper
        #: the proposals' clock: a state expires with its proposal
        self.clock = clock or facts.clock
        self._sealer: Sealer | None = None
        self._spent = 0

    async def sealer(self) -> Sealer:
        """The sealer under the store's shared secret (read once, off the loop)."""
        if self._sealer is None:
            secret = await off_loop(self.states.secret, self.clock())
            self._sealer = Sealer(secret, pepper=self._pepper)
        return self._sealer

    async def seal(self, principal: Principal, tool: str, arguments: Mapping[str, Any] | None,
                   asked: Ask) -> str:
        """The ``requestState`` of ``asked``: bound to this caller, this call as sent and its proposal."""
        state = RoundState(new_state_id(), key_of(principal), asked.proposal.id, tool,
                           wire_digest(tool, arguments), asked.mode, asked.proposal.expires_at,
                           asked.confirm_by, asked.token, asked.dry_run)
        return (await self.sealer()).seal(state)

    async def peek(self, principal: Principal, tool: str, arguments: Mapping[str, Any] | None,
                   wire: object) -> RoundState | None:
        """The state a retry carries, opened and checked as ``answer`` checks it but neither spent nor
        audited (the edge decides from it whether the answer becomes a task); None for any state
        ``answer`` would refuse, which it then refuses and audits."""
        try:
            state = (await self.sealer()).open(wire)
            check_state(state, caller=key_of(principal), tool=tool, args_digest=wire_digest(tool, arguments),
                        now=self.clock())
        except GatewayError:
            return None
        return state

    async def answer(self, principal: Principal, tool: str, arguments: Mapping[str, Any] | None,
                     wire: str | None, responses: Mapping[str, Any] | None, *, correlation_id: str | None,
                     client: str | None, progress: ProgressSink | None = None,
                     base_url: str = "") -> dict[str, Any] | Answer:
        """The retry of a round: the state opened, checked and spent (each refusal audited), the person's
        answer audited (``elicited``), then what it does (``InBand.follow``)."""
        spec = self.facts.registry.get(tool) or unknown_tool(tool)
        party = await off_loop(self.facts.party, principal)
        principal = replace(principal, kind=party.kind)
        ctx = CallContext(principal, party, spec, correlation_id, client)
        args = dict(arguments or {})
        gate = self.flow.gate
        now = self.clock()
        try:
            if wire is None:
                raise invalid("this call carries inputResponses without the requestState they answer",
                              "request_state_missing")
            state = (await self.sealer()).open(wire)
            check_state(state, caller=key_of(principal), tool=tool, args_digest=wire_digest(tool, arguments),
                        now=now)
        except GatewayError as exc:
            await gate.refused(ctx, args, exc, proposal_id=exc.details.get("proposal_id"))
        if not await off_loop(self.states.spend, state.id, state.caller, state.proposal_id, now,
                              state.expires_at):
            await gate.refused(ctx, args, spent_refusal(state), proposal_id=state.proposal_id)
        await self._sweep(now)
        proposal = await off_loop(self.flow.store.get_proposal, state.proposal_id)
        if proposal is None or not same(proposal.caller_key, state.caller):
            await gate.refused(ctx, args, invalid("the proposal this requestState answers is gone",
                                                  "request_state_invalid"), proposal_id=state.proposal_id)
        assert proposal is not None
        action = person_action(responses)
        in_band = self.flow.in_band
        await in_band.answered(ctx, proposal, state.mode, action)

        def shown() -> dict[str, Any]:
            again = pending_again(proposal, state, self.clock())
            return {**again, "card_url": card_url(base_url, proposal.id)} if state.mode == "url" else again

        with queue_for(principal, party.role):  # its vSphere calls queue as this caller's, as a call's do
            return await in_band.follow(self.flow.actions, ctx, proposal, state.mode, action,
                                        state.confirm_by, progress, shown)

    async def _sweep(self, now: float) -> None:
        self._spent += 1
        if self._spent % SWEEP_EVERY == 0:
            await off_loop(self.states.sweep, now)


def pending_again(proposal: Proposal, state: RoundState, now: float) -> dict[str, Any]:
    """The answer of the call that made ``proposal``, as the first round would have given it now (the
    token only where the round kept it for the agent)."""
    rule = ApprovalRule.of(proposal.approval_rule)
    decision = Decision(True, "", None, require_approval=proposal.require_web_approval, dry_run=state.dry_run,
                        approvals_required=rule.required, approver_roles=rule.roles,
                        reason_required=rule.reason_required, confirm_by=state.confirm_by)
    answer = pending_answer(proposal, state.token or "", max(0.0, proposal.expires_at - now), rule, decision)
    return answer if state.token else without_token(answer)
