"""Traces (OpenTelemetry): one span per MCP request, with children for each decision, wait and round trip.

Spans carry names, never arguments, tokens or credentials. Every audit row names its ``trace_id``,
also when no exporter is configured; export follows the standard ``OTEL_*`` variables.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, TypeVar

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ConfigError

T = TypeVar("T")
#: whether the HTTP request in progress carried a valid ``traceparent`` header (it then wins over ``_meta``)
header_traced: contextvars.ContextVar[bool] = contextvars.ContextVar("gateway_header_traced", default=False)
TRACER: Final = trace.get_tracer("vsphere-mcp-gateway")
EXPORTERS: Final = ("otlp", "console", "none")
_configured = threading.Lock()
_done: list[str] = []


def exporters_of(value: str | None) -> tuple[str, ...]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (``none`` and empty: none); ``ConfigError`` for others."""
    names = tuple(n.strip().lower() for n in (value or "").split(",") if n.strip())
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}; this gateway exports traces "
                          "with otlp, console or none (comma separated)")
    return tuple(n for n in names if n != "none")


def configure(value: str | None) -> bool:
    """Install the SDK's tracer provider for the exporters ``value`` names, once per process. False
    (nothing installed: the no-op tracer stays) when it names none."""
    names = exporters_of(value)
    if not names:
        return False
    with _configured:
        if _done:
            return True
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

        provider = TracerProvider()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them
        for name in names:
            exporter: SpanExporter
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter()
            else:
                exporter = ConsoleSpanExporter()
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _done.append(",".join(names))
    return True


def recording() -> bool:
    """Whether a tracer provider is installed in this process (``configure``, or the API's own
    ``set_tracer_provider``). Without one every span is the no-op tracer's, which carries its parent's
    context and records nothing, so the hot path makes none."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[trace.Span]:
    """A child span of the current one; attributes with None values are left out. Without a provider
    (``recording``) the current span itself: a no-op child would be the same context."""
    if not recording():
        yield trace.get_current_span()
        return
    with TRACER.start_as_current_span(
        name, attributes={k: v for k, v in attributes.items() if v is not None}
    ) as current:
        yield current


@contextmanager
def call_span(method: str, tool: str | None, meta: Mapping[str, Any] | None) -> Iterator[trace.Span]:
    """The span of one MCP call (``tools/call <tool>``): a child of the HTTP request's span; when the
    request carried no ``traceparent`` header, of the trace context in the call's ``_meta``."""
    parent = None
    if meta and not header_traced.get():
        carrier = {k: v for k in ("traceparent", "tracestate") if isinstance(v := meta.get(k), str)}
        found = extract(carrier) if carrier else None
        if found is not None and trace.get_current_span(found).get_span_context().is_valid:
            parent = found
    if parent is None and not recording():  # a no-op child of the current span: the same context
        yield trace.get_current_span()
        return
    attributes = {"mcp.method.name": method, **({"gen_ai.tool.name": tool} if tool else {})}
    with TRACER.start_as_current_span(f"{method} {tool}" if tool else method, context=parent,
                                      kind=SpanKind.SERVER, attributes=attributes) as current:
        yield current


def current_trace_id() -> str | None:
    """The 32-hex-digit W3C trace id of the current context (a propagated one too), None outside any."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def with_trace_id(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """``row`` naming the current trace (``trace_id``), unless it names one already or there is none."""
    if "trace_id" in row:
        return row
    trace_id = current_trace_id()
    return row if trace_id is None else {**row, "trace_id": trace_id}


def in_context(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` to run on another thread inside the caller's context (its span becomes the parent)."""
    context = contextvars.copy_context()
    return lambda: context.run(fn)


def trace_soap(stub: Any, target: str) -> None:
    """Make each SOAP call of a pyVmomi ``stub`` one span: the method name and the target, nothing of
    its arguments (a ``Login`` carries the password)."""
    invoke = stub.InvokeMethod

    def traced(mo: Any, info: Any, args: Any) -> Any:
        method = getattr(info, "wsdlName", None) or getattr(info, "name", "?")
        with TRACER.start_as_current_span(f"vsphere {method}", kind=SpanKind.CLIENT, attributes={
                "vsphere.method": str(method), "vsphere.target": target,
                "vsphere.object_type": type(mo).__name__}) as current:
            try:
                return invoke(mo, info, args)
            except Exception as exc:
                current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise

    stub.InvokeMethod = traced


class TraceContextMiddleware:
    """ASGI: each HTTP request to the MCP endpoint is one server span (``mcp <METHOD> <path>``), a child
    of the request's ``traceparent`` when it carries one; authentication and the MCP call nest in it."""

    def __init__(self, app: ASGIApp, paths: frozenset[str] = frozenset({"/mcp"})) -> None:
        self.app, self.paths = app, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") not in self.paths:
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        if not carrier and not recording():  # no trace to carry and none to record: no span to make
            await self.app(scope, receive, send)
            return
        parent = extract(carrier) if carrier else None
        if parent is not None and not trace.get_current_span(parent).get_span_context().is_valid:
            parent = None
        marked = header_traced.set(parent is not None)
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        with TRACER.start_as_current_span(f"mcp {scope['method']} {scope['path']}", context=parent,
                                          kind=SpanKind.SERVER, attributes=attributes):
            try:
                await self.app(scope, receive, send)
            finally:
                header_traced.reset(marked)
