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


#: assignments to another object's attribute that wire nothing, by (module, object), each with its reason
_LIBRARY = "a library object configured the way its library asks, before it is used"
_RECORD = "a plain record filled or counted by the code that owns it"
NOT_WIRING: dict[tuple[str, str], str] = {
    ("gateway/audit/syslog_forward.py", "context"): _LIBRARY + " (ssl.SSLContext)",
    ("gateway/server/edge/tls.py", "context"): _LIBRARY + " (ssl.SSLContext)",
    ("gateway/vsphere/pool.py", "context"): _LIBRARY + " (ssl.SSLContext)",
    ("gateway/server/edge/gc_tuning.py", "libc.mallinfo2"): _LIBRARY + " (ctypes signatures)",
    ("gateway/server/edge/gc_tuning.py", "libc.malloc_trim"): _LIBRARY + " (ctypes signatures)",
    ("gateway/server/edge/gc_tuning.py", "libc.mallopt"): _LIBRARY + " (ctypes signatures)",
    ("gateway/guard/patterns.py", "options"): _LIBRARY + " (re2.Options)",
    ("gateway/store/sqlite.py", "conn"): _LIBRARY + " (sqlite3 row factory)",
    ("gateway/store/sqlite.py", "self._local"): "a thread-local slot holding this thread's connection",
    ("gateway/vsphere/soap_scan.py", "parser"): _LIBRARY + " (expat handlers)",
    ("gateway/vsphere/lane.py", "timer"): _LIBRARY + " (threading.Timer.daemon)",
    ("gateway/vsphere/actions/hardware.py", "spec"): _LIBRARY + " (pyVmomi data objects)",
    ("gateway/vsphere/actions/hardware.py", "device"): _LIBRARY + " (pyVmomi data objects)",
    ("gateway/vsphere/actions/hardware.py", "change"): _LIBRARY + " (pyVmomi data objects)",
    ("gateway/vsphere/actions/placement.py", "location"): _LIBRARY + " (pyVmomi data objects)",
    ("gateway/vsphere/history.py", "spec"): _LIBRARY + " (pyVmomi filter specs)",
    ("gateway/vsphere/pool.py", "session"): "the vSphere session's key, learnt at login",
    ("gateway/vsphere/collector.py", "self.stub"): "the session cookie the SOAP stub sends, learnt at login",
    ("gateway/tracing.py", "stub"): "a traced wrapper around a library stub's method (no hook to pass it in)",
    ("gateway/server/edge/app.py", "app.state"): "Starlette's per-application state (no constructor for it)",
    ("gateway/web/app.py", "app.state"): "Starlette's per-application state (no constructor for it)",
    ("gateway/server/edge/app.py", "self.gateway"): "stopping marks the gateway draining (readiness)",
    ("gateway/cli/audit_reading.py", "failed"): _RECORD + " (a cell the callbacks set)",
    ("gateway/cli/check.py", "report"): _RECORD + " (the check's report)",
    ("gateway/config.py", "loader"): _RECORD + " (the YAML loader's per-file marks)",
    ("gateway/config.py", "out"): _RECORD + " (a loaded node's marks)",
    ("gateway/guard/limits.py", "state"): _RECORD + " (a breaker's state)",
    ("gateway/notify.py", "delivery"): _RECORD + " (a delivery's body)",
    ("gateway/server/call/busy_audit.py", "burst"): _RECORD + " (a burst's count)",
    ("gateway/vsphere/fair_order.py", "caller"): _RECORD + " (a caller's credit)",
    ("gateway/vsphere/fair_order.py", "found"): _RECORD + " (a caller's weight)",
    ("gateway/vsphere/history.py", "result"): _RECORD + " (a scan's result)",
    ("gateway/vsphere/mirror.py", "applied"): _RECORD + " (an applied update)",
    ("gateway/vsphere/mirror.py", "shaped"): _RECORD + " (a cached answer)",
    ("gateway/vsphere/mirror.py", "self._marker"): _RECORD + " (the sync marker)",
    ("gateway/web/session.py", "session"): _RECORD + " (a web session's last use)",
}


def attribute_wiring(root: Path) -> list[str]:
    """Each assignment (``=``, annotated, augmented) to an attribute of an object other than ``self`` or
    ``cls`` in ``root/gateway``, as ``path:line: target``, unless ``NOT_WIRING`` names it."""
    import ast

    found = []
    for path in sorted((root / "gateway").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            else:
                continue
            while targets:
                target = targets.pop()
                if isinstance(target, (ast.Tuple, ast.List)):
                    targets.extend(target.elts)
                elif isinstance(target, ast.Starred):
                    targets.append(target.value)
                elif isinstance(target, ast.Attribute):
                    owner = target.value
                    if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                        continue
                    if (relative, ast.unparse(owner)) not in NOT_WIRING:
                        found.append(f"{relative}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_no_collaborator_is_wired_in_after_construction() -> None:
    """Collaborators are handed over in constructors (the composition root: ``gateway.server.runtime``
    and ``call_path``), never assigned onto an object afterwards (``writes.proposer = ...``)."""
    assert attribute_wiring(REPO) == []


def test_attribute_wiring_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"gateway/root.py": "def compose(writes, flow):\n    writes.proposer = flow\n"
                                               "    writes.hooks += [flow]\n"
                                               "class A:\n    def __init__(self, b):\n"
                                               "        self.b = b\n        self.b.back = self\n"})
    assert attribute_wiring(root) == ["gateway/root.py:2: writes.proposer", "gateway/root.py:3: writes.hooks",
                                      "gateway/root.py:7: self.b.back"]


def test_every_allowed_assignment_still_exists() -> None:
    """An entry of ``NOT_WIRING`` whose assignment is gone is removed, so the list stays the exceptions."""
    import ast

    present = set()
    for module, owner in NOT_WIRING:
        for node in ast.walk(ast.parse((REPO / module).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and ast.unparse(node.value) == owner:
                present.add((module, owner))
    assert sorted(set(NOT_WIRING) - present) == []
