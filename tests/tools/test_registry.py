"""The tool table: capability gating, read-only mode and its proof, classification."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gateway.auth.tokens import Principal
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.tools.registry import ReadOnlyGateError, all_tools, build_registry, verify_read_only
from gateway.vocabulary import Category


def test_destructive_tools_exist_only_when_enabled() -> None:
    off = build_registry(destructive=False, read_only=False)
    on = build_registry(destructive=True, read_only=False)
    destructive = {s.name for s in on if s.kind is Category.DESTRUCTIVE}
    assert {"delete_vm", "confirm_action", "bulk_vm_action"} <= destructive
    assert not destructive & set(off.tools)
    assert "list_pending_actions" in on.tools and "list_pending_actions" not in off.tools


def test_read_only_mode_keeps_only_reads_and_names_what_it_withheld() -> None:
    registry = build_registry(destructive=True, read_only=True)
    assert registry.tools and all(s.kind is Category.READ for s in registry)
    assert {"power_on_vm", "delete_vm", "confirm_action"} <= set(registry.withheld)


def test_read_only_proof_refuses_a_listing_with_a_change() -> None:
    reads = build_registry(destructive=False, read_only=True)
    verify_read_only(list(reads))  # the real listing passes
    write = next(s for s in all_tools(destructive=False) if s.kind is Category.WRITE)
    with pytest.raises(ReadOnlyGateError, match=write.name):
        verify_read_only([*reads, write])


def test_a_server_in_read_only_mode_offers_no_change(tmp_path: Path) -> None:
    (tmp_path / "targets.yaml").write_text("targets: []\n")
    settings = Settings.from_env({"GATEWAY_HOME": str(tmp_path)}, read_only=True, enable_destructive=True)
    gateway = Gateway.build(settings)
    offered = gateway.facts.tools_for(Principal(name="root", role="admin"))
    anyio.run(gateway.close)
    assert offered and all(s.kind is Category.READ for s in offered)


def test_every_change_accepts_override_and_every_tool_declares_a_category() -> None:
    for spec in all_tools(destructive=True):
        assert isinstance(spec.category, Category)
        if spec.kind is not Category.READ and spec.target_mode != "none":
            assert "override" in {p.name for p in spec.params}, spec.name
        if spec.target_mode != "none":
            assert spec.params[0].name == "target", spec.name
