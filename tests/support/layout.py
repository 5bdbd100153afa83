"""The package's shape, measured with ``ast``: sizes, own imports, cycles and imports running up a floor.

    python tests/support/layout.py          # what exceeds a limit, the most importing modules, cycles
    python tests/support/layout.py --json   # the same as one JSON object

Exit 1 when a limit is exceeded (``tests/test_layout.py`` asserts each one).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "gateway"
MAX_MODULE_LINES = 900
MAX_CLASS_LINES = 600
MAX_OWN_IMPORTS = 16
#: how many of the modules importing the most of the package the report names (the figure to watch)
TOP_IMPORTERS = 5
#: at most this many modules directly in ``gateway/server/`` (the rest live in its wings)
MAX_SERVER_MODULES = 12

#: the floor of every module, by the longest matching dotted prefix: a module may import its own floor
#: and the floors below it, never above
FLOORS: dict[str, int] = {
    # 0, the ground: plain values and settings every floor reads
    "gateway": 0, "gateway.vocabulary": 0, "gateway.errors": 0, "gateway.proposals": 0, "gateway.role": 0,
    "gateway.answer": 0, "gateway.sanitize": 0, "gateway.ids": 0, "gateway.config": 0,
    "gateway.settings": 0, "gateway.private_files": 0, "gateway.tracing": 0,
    "gateway.guard": 1,  # pure decisions
    "gateway.store": 2,  # state, limits and slots on SQLite or PostgreSQL
    "gateway.audit": 3,  # the audit log (its PostgreSQL sink writes through the store's connections)
    "gateway.backends": 4,  # the engines opened once: store, audit sink and reader
    "gateway.vsphere": 5,
    "gateway.auth": 6, "gateway.identity": 6, "gateway.notify": 6, "gateway.tools": 6, "gateway.logs": 6,
    "gateway.server.base": 7, "gateway.server.call": 8, "gateway.server.proposals": 9,
    "gateway.server": 10,  # the composition root
    "gateway.server.edge": 11,
    "gateway.web": 12, "gateway.cli": 12, "gateway.dev": 12, "gateway.__main__": 12,
}


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    classes: dict[str, int] = field(default_factory=dict)
    imports: set[str] = field(default_factory=set)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(tree: ast.AST, current: str, is_package: bool, known: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(current, is_package, node)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != current and name.startswith(PACKAGE):
                found.add(name)
    # "from gateway.x import y" names both gateway.x and gateway.x.y; keep the deepest real module only.
    return {name for name in found if not any(other.startswith(name + ".") for other in found)} or found


def load(root: Path) -> dict[str, Module]:
    paths = sorted((root / PACKAGE).rglob("*.py"))
    known = {module_name(root, path) for path in paths}
    modules: dict[str, Module] = {}
    for path in paths:
        name = module_name(root, path)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        module = Module(name, path, text.count("\n") + 1)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                module.classes[node.name] = node.end_lineno - node.lineno + 1
        module.imports = _imports(tree, name, path.name == "__init__.py", known)
        modules[name] = module
    return modules


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(modules[name].imports):
            if other not in modules or _is_ancestor(other, name):
                continue
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for name in sorted(modules):
        if name not in index:
            visit(name)
    return found


def _is_ancestor(package: str, name: str) -> bool:
    """A module importing its own package's ``__init__`` is not a cycle worth reporting."""
    return name.startswith(package + ".")


def floor(name: str) -> int | None:
    """The floor of module ``name`` (longest prefix in ``FLOORS``), None when it has none."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        found = FLOORS.get(".".join(parts[:end]))
        if found is not None and (end > 1 or name == PACKAGE):
            return found
    return None


def upward_imports(modules: dict[str, Module]) -> list[str]:
    """Every import of a module on a higher floor than the importer's, as ``a (floor) -> b (floor)``."""
    found = []
    for name, module in sorted(modules.items()):
        here = floor(name)
        for other in sorted(module.imports):
            there = floor(other)
            if here is not None and there is not None and there > here:
                found.append(f"{name} ({here}) -> {other} ({there})")
    return found


def server_modules(modules: dict[str, Module]) -> list[str]:
    """The modules directly in ``gateway/server/`` (not in a wing, its ``__init__`` not counted)."""
    inside = f"{PACKAGE}.server."
    return sorted(n for n, m in modules.items()
                  if n.startswith(inside) and n.count(".") == 2 and m.path.name != "__init__.py")


def report(modules: dict[str, Module]) -> dict[str, object]:
    return {
        "modules": len(modules),
        "modules_over_lines": {m.name: m.lines for m in modules.values() if m.lines > MAX_MODULE_LINES},
        "classes_over_lines": {f"{m.name}.{c}": n for m in modules.values() for c, n in m.classes.items()
                               if n > MAX_CLASS_LINES},
        "modules_over_imports": {m.name: len(m.imports) for m in modules.values()
                                 if len(m.imports) > MAX_OWN_IMPORTS},
        "most_own_imports": dict(sorted(((m.name, len(m.imports)) for m in modules.values()),
                                        key=lambda item: (-item[1], item[0]))[:TOP_IMPORTERS]),
        "cycles": cycles(modules),
        "upward_imports": upward_imports(modules),
        "unplaced": sorted(name for name in modules if floor(name) is None),
        "server_modules": server_modules(modules),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args(argv)
    result = report(load(args.root))
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"{result['modules']} modules under {PACKAGE}/")
        for key, limit in (("modules_over_lines", MAX_MODULE_LINES), ("classes_over_lines", MAX_CLASS_LINES),
                           ("modules_over_imports", MAX_OWN_IMPORTS)):
            rows = result[key]
            assert isinstance(rows, dict)
            print(f"\n{key} (limit {limit}): {len(rows)}")
            for name, value in sorted(rows.items(), key=lambda item: -int(item[1])):
                print(f"  {value:6d}  {name}")
        most = result["most_own_imports"]
        assert isinstance(most, dict)
        print(f"\nmost own imports (limit {MAX_OWN_IMPORTS}):")
        for name, value in most.items():
            print(f"  {value:6d}  {name}")
        found = result["cycles"]
        assert isinstance(found, list)
        print(f"\nimport cycles: {len(found)}")
        for component in found:
            print("  " + " <-> ".join(component))
        for key in ("upward_imports", "unplaced"):
            rows = result[key]
            assert isinstance(rows, list)
            print(f"\n{key.replace('_', ' ')}: {len(rows)}")
            for row in rows:
                print(f"  {row}")
        server = result["server_modules"]
        assert isinstance(server, list)
        print(f"\nmodules directly in {PACKAGE}/server/ (limit {MAX_SERVER_MODULES}): {len(server)}")
    over = any(result[key] for key in ("modules_over_lines", "classes_over_lines", "modules_over_imports",
                                         "cycles", "upward_imports", "unplaced"))
    over = over or len(result["server_modules"]) > MAX_SERVER_MODULES  # type: ignore[arg-type]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
