"""The package's shape (``tests/support/layout.py`` over ``gateway/``): no import cycle (lazy and
``TYPE_CHECKING`` imports included), no import of a higher floor (the floors: ``layout.FLOORS``), no
module over 900 lines, no class over 600, none importing more than 16 of the package's own modules, at
most 12 modules directly in ``gateway/server/``. A module on no floor fails: add it to ``FLOORS``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent

def _load_layout() -> ModuleType:
    spec = importlib.util.spec_from_file_location("support_layout", REPO / "tests" / "support" / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


layout = _load_layout()


floor = layout.floor


def upward_imports(root: Path) -> list[str]:
    found: list[str] = layout.upward_imports(layout.load(root))
    return found


def cycles(root: Path) -> list[list[str]]:
    found: list[list[str]] = layout.cycles(layout.load(root))
    return found


def test_every_module_has_a_floor() -> None:
    assert [name for name in sorted(layout.load(REPO)) if floor(name) is None] == []


def test_no_import_cycle() -> None:
    assert cycles(REPO) == []


def test_nothing_imports_upward() -> None:
    assert upward_imports(REPO) == []


def test_the_server_keeps_at_most_12_modules_outside_its_wings() -> None:
    assert len(layout.server_modules(layout.load(REPO))) <= layout.MAX_SERVER_MODULES == 12


def test_no_module_over_its_line_limit() -> None:
    assert layout.report(layout.load(REPO))["modules_over_lines"] == {}


def test_no_class_over_its_line_limit() -> None:
    assert layout.report(layout.load(REPO))["classes_over_lines"] == {}


def test_no_module_imports_more_than_16_of_the_package() -> None:
    assert layout.MAX_OWN_IMPORTS == 16
    assert layout.report(layout.load(REPO))["modules_over_imports"] == {}


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in {"gateway/__init__.py": "", **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.mark.parametrize(("files", "expected"), [
    ({"gateway/errors.py": "", "gateway/guard/__init__.py": "",
      "gateway/guard/confirm.py": "from gateway.errors import GatewayError\n"}, []),
    ({"gateway/store/__init__.py": "", "gateway/store/base.py": "", "gateway/guard/__init__.py": "",
      "gateway/guard/confirm.py": "from gateway.store.base import Proposal\n"},
     ["gateway.guard.confirm (1) -> gateway.store.base (2)"]),
    ({"gateway/tools/__init__.py": "", "gateway/tools/registry.py": "", "gateway/guard/__init__.py": "",
      "gateway/guard/names.py": "def watch():\n    from gateway.tools.registry import all_tools\n"},
     ["gateway.guard.names (1) -> gateway.tools.registry (6)"]),
    ({"gateway/auth/__init__.py": "", "gateway/auth/roles.py": "", "gateway/guard/__init__.py": "",
      "gateway/guard/names.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from gateway.auth.roles import RoleBook\n"},
     ["gateway.guard.names (1) -> gateway.auth.roles (6)"]),
], ids=["downward", "guard-to-store", "lazy-guard-to-tools", "type-checking-guard-to-auth"])
def test_an_upward_import_is_found(tmp_path: Path, files: dict[str, str], expected: list[str]) -> None:
    assert upward_imports(_tree(tmp_path, files)) == expected


def test_a_cycle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "gateway/guard/__init__.py": "",
        "gateway/guard/names.py": "def watch():\n    from gateway.guard.policy import Policy\n",
        "gateway/guard/policy.py": "from gateway.guard.names import KnownNames\n",
    })
    assert cycles(root) == [["gateway.guard.names", "gateway.guard.policy"]]


def test_own_imports_are_counted_once_per_module(tmp_path: Path) -> None:
    """``from gateway.x import a, b`` and a lazy ``import gateway.y`` are two of the package's modules;
    a package imported for one of its modules counts as that module only; the standard library none."""
    root = _tree(tmp_path, {
        "gateway/x.py": "", "gateway/y.py": "", "gateway/guard/__init__.py": "", "gateway/guard/z.py": "",
        "gateway/user.py": "import json\nfrom gateway.x import a, b\nfrom gateway.guard import z\n"
                           "def f():\n    import gateway.y\n",
    })
    modules = layout.load(root)
    assert modules["gateway.user"].imports == {"gateway.x", "gateway.y", "gateway.guard.z"}
    assert next(iter(layout.report(modules)["most_own_imports"].items())) == ("gateway.user", 3)


def test_floors_read_by_longest_prefix() -> None:
    assert [floor(n) for n in ("gateway", "gateway.role", "gateway.guard.policy.model", "gateway.cli.audit",
                               "gateway.audit.chain", "gateway.server.call.gate", "gateway.unplaced")] \
        == [0, 0, 1, 12, 3, 8, None]
