"""Traces: the spans of one MCP call over HTTPS (real SDK client, the simulator) checked with the SDK's
in-memory exporter: names, parent and child, the trace id of ``traceparent`` in every audit row of the
call, and no secret in any attribute; the exporter choice from OTEL_TRACES_EXPORTER."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support.answers import answer_of
from support.httpserver import Served, audit_rows, build_gateway, mcp_client, serve
from support.simulator import MakeSimulator, Simulator

from gateway import tracing
from gateway.errors import ConfigError

pytestmark = pytest.mark.anyio

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider, recording into memory (installed once: the API allows one); the
    exporter keeps nothing of the tests that run after this module."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    yield _EXPORTER
    _EXPORTER.clear()
    _EXPORTER.shutdown()


@pytest.fixture
def served(make_simulator: MakeSimulator, tmp_path: Path) -> Iterator[tuple[Served, Simulator]]:
    sim = make_simulator()
    running = serve(tmp_path, build_gateway(tmp_path, sim))
    try:
        yield running, sim
    finally:
        running.stop()


@contextmanager
def traced_client(trace_id: str, parent_id: str) -> Iterator[None]:
    """The test's client runs inside trace ``trace_id`` (the SDK client, in this process, then injects
    that trace into each request's ``_meta`` as a traced client does)."""
    remote = SpanContext(int(trace_id, 16), int(parent_id, 16), is_remote=True, trace_flags=TraceFlags(1))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        yield
    finally:
        otel_context.detach(token)


def _ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names, parent = [], span.parent
    while parent is not None and parent.span_id in by_id:
        found = by_id[parent.span_id]
        names.append(found.name)
        parent = found.parent
    return names


async def test_one_call_is_one_trace_from_the_edge_to_vsphere(
    spans: InMemorySpanExporter, served: tuple[Served, Simulator]
) -> None:
    running, sim = served
    spans.clear()
    trace_id, remote_parent = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{trace_id}-{remote_parent}-01"}
    vm = sim.vm_names()[0]
    # the client's own trace (in _meta) differs from the header's: the header wins
    with traced_client(secrets.token_hex(16), secrets.token_hex(8)):
        async with mcp_client(running, running.tokens["alice"], "legacy", headers=headers) as client:
            result = await client.call_tool("power_off_vm", {"target": "vc1", "vm": vm})
    assert not result.is_error, answer_of(result)

    mine = [s for s in spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    by_id = {s.context.span_id: s for s in mine}
    (call,) = [s for s in mine if s.name == "tools/call power_off_vm"]
    root = by_id[call.parent.span_id] if call.parent else None
    assert root is not None and root.name == "mcp POST /mcp"
    assert root.parent is not None and format(root.parent.span_id, "016x") == remote_parent
    under_root = {s.name for s in mine if s.parent and s.parent.span_id == root.context.span_id}
    assert {"gateway.authenticate", "tools/call power_off_vm"} <= under_root

    inside = [s for s in mine if "tools/call power_off_vm" in _ancestors(s, by_id)]
    names = [s.name for s in inside]
    assert names.count("gateway.decision") >= 2  # the gate, then the decision on the resolved objects
    assert "gateway.queue_wait" in names
    appends = [s for s in inside if s.name == "gateway.audit_append"]
    assert {s.attributes["audit.phase"] for s in appends if s.attributes} >= {"executing", "executed"}
    soap = [s for s in inside if s.name.startswith("vsphere ")]
    assert "PowerOffVM_Task" in {s.attributes["vsphere.method"] for s in soap if s.attributes}
    assert all(s.attributes and s.attributes["vsphere.target"] == "vc1" for s in soap)
    assert all(by_id[s.parent.span_id].name != "mcp POST /mcp" for s in soap if s.parent)

    rows = [r for r in audit_rows(running.gateway) if r.get("tool") == "power_off_vm"]
    assert rows and {r["trace_id"] for r in rows} == {trace_id}

    attributes = json.dumps([dict(s.attributes or {}) for s in spans.get_finished_spans()], default=str)
    for secret in (running.tokens["alice"], sim.password):
        assert secret not in attributes


async def test_a_trace_in_meta_also_reaches_the_audit_rows(
    spans: InMemorySpanExporter, served: tuple[Served, Simulator]
) -> None:
    running, _sim = served
    trace_id = secrets.token_hex(16)
    spans.clear()
    with traced_client(trace_id, secrets.token_hex(8)):
        async with mcp_client(running, running.tokens["alice"], "legacy") as client:
            result = await client.call_tool("list_targets", {})
    assert not result.is_error
    (call,) = [s for s in spans.get_finished_spans() if s.name == "tools/call list_targets"]
    assert format(call.context.trace_id, "032x") == trace_id
    rows = [r for r in audit_rows(running.gateway) if r.get("tool") == "list_targets"]
    assert rows and rows[-1]["trace_id"] == trace_id


@pytest.mark.parametrize(("value", "expected"), [
    (None, ()), ("", ()), ("none", ()), ("otlp", ("otlp",)), ("console", ("console",)),
    ("otlp, console", ("otlp", "console")), ("OTLP", ("otlp",)),
])
def test_exporters_of(value: str | None, expected: tuple[str, ...]) -> None:
    assert tracing.exporters_of(value) == expected


def test_an_unknown_exporter_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        tracing.exporters_of("jaeger")
    assert "jaeger" in caught.value.message and "otlp, console or none" in caught.value.message


# ---------------------------------------------------------------------------- a fresh process each (the API
# takes one tracer provider per process)

_PROBE = """
import sys
from opentelemetry.propagate import extract
from gateway import tracing
installed = tracing.configure(sys.argv[1])
parent = extract({"traceparent": sys.argv[2]})
with tracing.TRACER.start_as_current_span("probe", context=parent):
    with tracing.span("gateway.audit_append", **{"audit.phase": "probe"}):
        print("ROW", tracing.with_trace_id({"phase": "probe"}).get("trace_id"), flush=True)
if installed:
    from opentelemetry import trace
    trace.get_tracer_provider().force_flush()
print("INSTALLED", installed, flush=True)
"""


def _probe(exporter: str, traceparent: str, **env: str) -> str:
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _PROBE, exporter, traceparent], capture_output=True,
                         text=True, timeout=60, env={**os.environ, **env}, check=True)
    return run.stdout


def test_with_no_exporter_the_no_op_tracer_still_puts_the_requests_trace_in_rows() -> None:
    trace_id = secrets.token_hex(16)
    out = _probe("none", f"00-{trace_id}-{secrets.token_hex(8)}-01")
    assert f"ROW {trace_id}" in out and "INSTALLED False" in out


def test_console_exports_the_spans() -> None:
    trace_id = secrets.token_hex(16)
    out = _probe("console", f"00-{trace_id}-{secrets.token_hex(8)}-01")
    assert "INSTALLED True" in out and '"name": "gateway.audit_append"' in out and trace_id in out


def test_otlp_exports_to_the_endpoint_the_environment_names() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[tuple[str, bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.path, self.rfile.read(int(self.headers.get("content-length", "0")))))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        trace_id = secrets.token_hex(16)
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        out = _probe("otlp", f"00-{trace_id}-{secrets.token_hex(8)}-01",
                     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=endpoint)
    finally:
        server.shutdown()
        server.server_close()
    assert "INSTALLED True" in out
    assert received and received[0][0] == "/v1/traces"
    assert bytes.fromhex(trace_id) in b"".join(body for _path, body in received)  # the protobuf's trace id


_CALL_PROBE = """
import sys
from gateway import tracing
print("RECORDING", tracing.recording())
with tracing.call_span("tools/call", "list_vms", {"traceparent": sys.argv[1]}):
    print("META", tracing.with_trace_id({"phase": "call"}).get("trace_id"))
with tracing.call_span("tools/call", "list_vms", None), tracing.span("gateway.audit_append"):
    print("NONE", tracing.with_trace_id({"phase": "call"}).get("trace_id"))
"""


def test_with_no_provider_a_calls_trace_from_meta_still_reaches_its_rows_and_none_is_made_up() -> None:
    import os
    import subprocess
    import sys

    trace_id = secrets.token_hex(16)
    run = subprocess.run([sys.executable, "-c", _CALL_PROBE, f"00-{trace_id}-{secrets.token_hex(8)}-01"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ), check=True)
    assert run.stdout.split() == ["RECORDING", "False", "META", trace_id, "NONE", "None"]
