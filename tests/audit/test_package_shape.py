"""The audit trail's shape (``gateway.audit``), measured with ``tests/support/layout.py``: its modules and the
``gateway audit`` command within the house limits, and the decision package (``gateway.guard``) holding
none of its I/O. (Cycles and floors for the whole package: ``tests/test_layout.py``.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import gateway

ROOT = Path(gateway.__file__).resolve().parents[1]
#: what the audit trail is made of: each module one concern (its docstring's first line says which)
AUDIT_MODULES = ("redact", "bounds", "chain", "signing", "files", "file_sink", "pg_sink", "pg_reader",
                 "verify", "query", "readers", "metrics", "merkle", "note", "tree_file", "tree_check",
                 "witness", "proofs", "pg_tree", "pg_retention")


def _layout_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("support_layout", ROOT / "tests" / "support" / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def layout() -> tuple[ModuleType, dict[str, Any]]:
    script = _layout_script()
    return script, script.load(ROOT)


@pytest.mark.parametrize("name", [f"gateway.audit.{m}" for m in AUDIT_MODULES]
                         + ["gateway.cli.audit", "gateway.cli.audit_proofs", "gateway.cli.audit_reading"])
def test_module_is_within_the_house_limits(layout: tuple[ModuleType, dict[str, Any]], name: str) -> None:
    script, modules = layout
    assert name in modules, f"{name} is missing"
    module = modules[name]
    assert module.lines <= script.MAX_MODULE_LINES, f"{name}: {module.lines} lines"
    assert max(module.classes.values(), default=0) <= script.MAX_CLASS_LINES, f"{name}: {module.classes}"
    assert len(module.imports) <= script.MAX_OWN_IMPORTS, f"{name}: {sorted(module.imports)}"


def test_the_decision_package_holds_no_audit_io(layout: tuple[ModuleType, dict[str, Any]]) -> None:
    _, modules = layout
    guard = {name: module for name, module in modules.items() if name.startswith("gateway.guard")}
    assert not {"gateway.guard.audit", "gateway.guard.redact", "gateway.guard.audit_metrics"} & set(guard)
    assert {name: sorted(m.imports) for name, m in guard.items()
            if any(i.startswith("gateway.audit") for i in m.imports)} == {}
