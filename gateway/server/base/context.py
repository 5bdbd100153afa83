"""What one guarded call carries from step to step (``CallContext``).

Also the helpers that shape a call's audit fields, and ``off_loop`` for blocking store calls."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from gateway.answer import Answer
from gateway.auth.tokens import Principal, caller_fields
from gateway.errors import StateUnavailable
from gateway.guard.decision import Entry, Party
from gateway.role import Role
from gateway.sanitize import clean
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category
from gateway.vsphere.lane import queue_wait_ms

log = logging.getLogger(__name__)

T = TypeVar("T")
ProgressSink = Callable[[float, str], Coroutine[Any, Any, None]]
#: the MCP client's declared name/version for the call in progress (set by the MCP surface)
mcp_client_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("mcp_client", default=None)
ALL = "all"
#: how long one state-store call may take before the call is refused
STORE_DEADLINE_SECONDS: Final = 10.0
#: a target label longer than this is cut (the audit sink bounds every value of a row on its own)
AUDIT_VALUE_CHARS: Final = 256
#: the caller every row of the gateway's own moves names (expiry, settling, recovery)
GATEWAY_ACTOR: Final = Principal(name="gateway", role="-", surface="server")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (state store, audit) in a worker thread with a deadline."""
    # the executor's future awaited under a timeout scope: ``wait_for(to_thread(...))`` would make a
    # task for the coroutine and another for the wait on every hop; the context goes along as
    # ``to_thread`` takes it (the trace, ``reading``)
    future = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(contextvars.copy_context().run, fn, *args, **kwargs))
    try:
        async with asyncio.timeout(STORE_DEADLINE_SECONDS):
            return await future
    except TimeoutError:
        log.error("%s did not answer within %gs", getattr(fn, "__qualname__", fn), STORE_DEADLINE_SECONDS)
        raise StateUnavailable(
            f"the state store or audit did not answer within {STORE_DEADLINE_SECONDS:g}s; "
            "nothing was changed by this call; retry, and see the gateway log"
        ) from None


@dataclass
class CallContext:
    """Who is calling what, carried through one call for audit rows and decisions."""

    principal: Principal
    party: Party
    spec: ToolSpec
    correlation_id: str | None
    client: str | None = None
    #: the tool that acts on a proposal (confirm_action, approve, ...) when rows name the change itself
    via: str | None = None
    #: the call's idempotency key (``gateway.server.call.idempotency``), named in each of its rows
    idempotency_key: str | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def role(self) -> Role:
        assert self.party.role is not None  # the gate refused callers without a role
        return self.party.role

    def row(self, phase: str, **fields: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "phase": phase,
            "tool": self.spec.name,
            "risk": self.spec.risk.value,
            **caller_fields(self.principal),
            "kind": self.party.kind.value,
            "role": self.party.role.name if self.party.role else self.principal.role,
            "surface": self.principal.surface,
            "client": self.client,
            "correlation_id": self.correlation_id,
            "via": self.via,
            "idempotency_key": self.idempotency_key,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 2),
        }
        waited = queue_wait_ms()
        if waited is not None:  # the time its vSphere calls waited in the fair queue (the Agents view)
            base["queue_wait_ms"] = waited
        base.update({k: v for k, v in fields.items() if v is not None})
        return base


#: what answers a tool call past the gate (a read, a write, a tool the gateway answers itself)
Handler = Callable[[CallContext, dict[str, Any], ProgressSink | None], Awaitable[dict[str, Any] | Answer]]


def client_of(request_context: Any) -> str | None:
    """The MCP client's declared ``name/version`` (from its initialize request), cleaned and bounded, for
    audit rows; None when the client declared none (the stateless revision makes it optional)."""
    params = getattr(getattr(request_context, "session", None), "client_params", None)
    info = getattr(params, "clientInfo", None) or getattr(params, "client_info", None)
    name = getattr(info, "name", None)
    if not isinstance(name, str):
        return None
    version = getattr(info, "version", None)
    label = f"{name}/{version}" if isinstance(version, str) and version else name
    return str(clean(truncate(label, 128)))


def entry_of(spec: ToolSpec) -> Entry:
    return Entry.READ if spec.kind is Category.READ else Entry.WRITE


def unknown_tool(name: str) -> ToolSpec:
    """A stand-in spec naming an unknown tool in its audit row (strictest category, never executed)."""
    return ToolSpec(name=truncate(name, 128), description="unknown tool", target_mode="none")


def truncate(text: str, limit: int = 128) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def target_label(args: Mapping[str, Any] | None) -> str | None:
    ref = (args or {}).get("target")
    if isinstance(ref, list):
        return truncate(",".join(str(r) for r in ref[:20]), AUDIT_VALUE_CHARS)
    return truncate(ref, AUDIT_VALUE_CHARS) if isinstance(ref, str) else None


def redact_args(spec: ToolSpec, args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if k in spec.sensitive_params else v) for k, v in args.items()}
