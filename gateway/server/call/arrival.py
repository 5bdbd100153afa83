"""A tool call from its arrival to the handler that answers it.

Unstorable text first, then the caller now, the gate's decision, argument validation; every refusal is
audited by the gate, every call is a metric, every vSphere call queues in its caller's share."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from gateway.answer import Answer
from gateway.auth.fair_share import queue_for
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.errors import GatewayError, InvalidArgument, NotFound
from gateway.guard import inputs
from gateway.guard.decision import Entry, Party, TokenState
from gateway.server.base.audit_trail import reading
from gateway.server.base.context import (
    ALL,
    CallContext,
    Handler,
    ProgressSink,
    entry_of,
    mcp_client_var,
    off_loop,
    target_label,
    truncate,
    unknown_tool,
)
from gateway.server.base.facts import FactsNow
from gateway.server.base.metrics import Metrics
from gateway.server.call.gate import Gate
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category

#: refusals counted as ``denied`` in the call metric (anything else a caller did wrong is an ``error``)
_METRIC_DENIALS = frozenset({"policy_denied", "forbidden", "rate_limited"})


class Calls:
    """Runs tool calls: the caller now, the gate, validation, then the handler the tool is routed to."""

    def __init__(self, targets: Mapping[str, Target], *, facts: FactsNow, gate: Gate, metrics: Metrics,
                 read: Handler, write: Handler, local: Mapping[str, Handler],
                 around: Callable[[ToolSpec, Handler], Handler] | None = None) -> None:
        self.targets = targets
        self.facts = facts
        self.gate = gate
        self.metrics = metrics
        #: what answers a tool past the gate: the tools the gateway answers itself (by name), else the
        #: read or the write handler
        self.local = dict(local)
        self.read = read
        self.write = write
        #: what every handler is wrapped in (the idempotency keys of changes, ``server.call.idempotency``)
        self.around = around

    async def answer(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        client: str | None = None,
    ) -> Answer:
        """Run one tool call for ``principal``; raises GatewayError subclasses for expected failures.
        The answer is encoded once (``gateway.answer``): its text goes to the caller as is.

        ``client`` is the MCP client's declared ``name/version`` (from initialize), for audit rows."""
        client = client or mcp_client_var.get()
        await self._refuse_unstorable(principal, name, args, correlation_id, client)
        spec = self.facts.registry.get(name)
        edge_read = self.facts.party_known(principal)  # the edge read the token for this request
        actor = edge_read if edge_read is not None else await off_loop(self.facts.party, principal)
        if principal.kind is not actor.kind:
            principal = replace(principal, kind=actor.kind)  # rows name the kind the store has now
        if spec is None:
            ctx = CallContext(principal, actor, unknown_tool(name), correlation_id, client)
            await self.gate.refused(
                ctx,
                args,
                NotFound(f"unknown tool '{truncate(name)}'; call tools/list to see the tools available to "
                         "you"),
            )
        assert spec is not None
        ctx = CallContext(principal, actor, spec, correlation_id, client)
        # every vSphere call this tool call makes queues in this caller's share (its key, or with
        # ``fair_share: person`` the person it acts for), on every target it reaches
        with queue_for(principal, actor.role), self.observed(spec.name, args, ctx.started):
            # the gate, once: a change names its one target here (reads decide per target once resolved)
            ref = (args or {}).get("target")
            single = spec.kind is not Category.READ and isinstance(ref, str) and ref != ALL
            at_gate = self.facts.facts(
                Entry.LOCAL if spec.target_mode == "none" else entry_of(spec),
                actor,
                spec,
                args or {},
                target=ref if single else None,
                resolved=False,
            )
            verdict = self.gate.decide(at_gate, spec.name)
            if not verdict.allowed and single:
                await self.gate.count_refused_change(ctx, str(ref), args)
            await self.gate.enforce(ctx, verdict, at_gate, args)
            try:
                valid = spec.validate(args)
            except InvalidArgument as exc:
                await self.gate.refused(ctx, args, exc)
            # a read's own row is committed in a group (``audit_trail``): its answer waits for the
            # row to be in the log, not for the disk flush; a change's rows never are
            was_reading = reading.set(spec.kind is Category.READ)
            try:
                result = await self._handler_for(spec)(ctx, valid, progress)
            finally:
                reading.reset(was_reading)
            return result if isinstance(result, Answer) else Answer.cleaned(result)

    @contextlib.contextmanager
    def observed(self, tool: str, args: Mapping[str, Any] | None,
                 started: float | None = None) -> Iterator[None]:
        """Count what runs inside as one call of ``tool`` in the call metric: ``ok``, ``denied`` (a refusal
        by policy, role or rate) or ``error``, and how long it took (from ``started``, monotonic). The
        metric's labels come only from configured names: raw caller input never becomes a label value."""
        began = time.monotonic() if started is None else started
        outcome, target = "error", target_label(args)
        try:
            yield
            outcome = "ok"
        except GatewayError as exc:
            outcome = "denied" if exc.code in _METRIC_DENIALS else "error"
            raise
        finally:
            known = target in self.targets or target == ALL
            label = "-" if target is None else target if known else "unknown"
            self.metrics.observe_call(tool, label, outcome, time.monotonic() - began)

    async def call(self, principal: Principal, name: str, args: Mapping[str, Any] | None,
                   **options: Any) -> dict[str, Any]:
        """``answer`` as plain JSON values (the web page, the benchmarks and the tests read these)."""
        return (await self.answer(principal, name, args, **options)).value

    async def _refuse_unstorable(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        correlation_id: str | None,
        client: str | None,
    ) -> None:
        """Before anything else: a call holding text no engine can store (``guard.inputs``) is an
        invalid argument, audited with that text escaped (the audit's bounding step escapes it)."""
        where = inputs.unstorable_field(name, args)
        if where is None:
            return
        spec = self.facts.registry.get(name) if where != "tool" else None
        person = str(principal.person_key) if principal.person_key else None
        # the row names the principal's role
        party = Party(principal.name, TokenState.USABLE, None, key=str(principal.key), person_key=person)
        ctx = CallContext(principal, party, spec or unknown_tool(name), correlation_id, client)
        await self.gate.refused(ctx, args, InvalidArgument(where, inputs.UNSTORABLE_MESSAGE))

    def _handler_for(self, spec: ToolSpec) -> Handler:
        handler = self.local.get(spec.name) or (self.read if spec.kind is Category.READ else self.write)
        return self.around(spec, handler) if self.around is not None else handler
