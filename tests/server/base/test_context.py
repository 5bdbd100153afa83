"""The call's context (``server.base.context``): what each audit row of a call names, and the bounded,
redacted values rows carry."""

from __future__ import annotations

import pytest
from support.server_parts import AGENT, Parts

from gateway.guard.decision import Entry
from gateway.server.base.context import (
    AUDIT_VALUE_CHARS,
    entry_of,
    off_loop,
    redact_args,
    target_label,
    truncate,
    unknown_tool,
)


def test_a_row_names_the_tool_the_caller_and_the_correlation(parts: Parts) -> None:
    ctx = parts.ctx(AGENT, "power_off_vm")
    ctx.client = "probe/1.0"
    row = ctx.row("executed", outcome="ok")
    named = ("phase", "tool", "caller", "role", "correlation_id", "client", "outcome")
    assert {k: row[k] for k in named} == {
        "phase": "executed", "tool": "power_off_vm", "caller": "agent-1", "role": "admin",
        "correlation_id": "corr-1", "client": "probe/1.0", "outcome": "ok"}


def test_truncate_keeps_short_text_and_says_how_long_the_rest_was() -> None:
    assert truncate("short") == "short"
    assert truncate("x" * 200, 10) == "xxxxxxxxxx... (200 chars)"


def test_a_target_label_is_the_target_or_a_bounded_list() -> None:
    assert (target_label({"target": "vc1"}), target_label({}), target_label(None)) == ("vc1", None, None)
    assert target_label({"target": ["a", "b"]}) == "a,b"
    assert len(target_label({"target": "t" * 1000}) or "") < AUDIT_VALUE_CHARS + 30


def test_sensitive_arguments_are_starred(parts: Parts) -> None:
    spec = parts.registry.get("power_off_vm")
    assert spec is not None
    secret = next(iter(spec.sensitive_params), "idempotency_key")
    assert redact_args(spec, {"target": "vc1", secret: "s3cret"}) == {"target": "vc1", secret: "***"}


def test_an_unknown_tool_is_named_bounded_and_a_read_is_a_read_entry(parts: Parts) -> None:
    assert unknown_tool("y" * 300).name.endswith("(300 chars)")
    read, write = parts.registry.get("list_vms"), parts.registry.get("power_off_vm")
    assert read is not None and write is not None
    assert (entry_of(read), entry_of(write)) == (Entry.READ, Entry.WRITE)


@pytest.mark.anyio
async def test_off_loop_runs_in_a_worker_and_returns_its_value() -> None:
    assert await off_loop(lambda a, b=0: a + b, 2, b=3) == 5
