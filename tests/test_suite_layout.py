"""The test suite's shape: tests mirror the package (``gateway/server/call/gate.py`` ->
``tests/server/call/test_gate.py``), shared helpers live in tests/support/, every marker is declared, and
the fast tier leaves out exactly the parts (tests/support/tier.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from support import tier

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
#: folders with their own rules: the lab suite, the Go interop checker, the Node OpenID provider
EXEMPT = ("lab", "interop_go", "oidc", "conformance")
MIRRORED_SHARE = 0.8
MARK = re.compile(r"\bpytest\.mark\.([A-Za-z_]\w*)")
NEEDS = re.compile(r"@needs\(([^)]*)\)")


def module_files() -> list[Path]:
    """Every module of the package that should have a test module (not ``__init__``, not ``__main__``)."""
    return sorted(p for p in (REPO / "gateway").rglob("*.py") if p.name not in {"__init__.py", "__main__.py"})


def mirror_of(module: Path) -> Path:
    """``gateway/a/b.py`` -> ``tests/a/test_b.py``."""
    relative = module.relative_to(REPO / "gateway")
    return TESTS / relative.parent / f"test_{relative.name}"


def suite_files() -> list[Path]:
    """Every .py under tests/ outside the exempt folders."""
    return sorted(p for p in TESTS.rglob("*.py") if p.relative_to(TESTS).parts[0] not in EXEMPT)


def test_most_modules_have_a_test_module_of_the_same_name() -> None:
    modules = module_files()
    missing = [str(m.relative_to(REPO)) for m in modules if not mirror_of(m).is_file()]
    share = 1 - len(missing) / len(modules)
    assert share >= MIRRORED_SHARE, (
        f"{len(modules) - len(missing)} of {len(modules)} modules ({share:.0%}) have "
        f"tests/<path>/test_<name>.py; at least {MIRRORED_SHARE:.0%} should. Missing:\n" + "\n".join(missing))


def test_mirror_of_follows_the_package_path() -> None:
    gate = REPO / "gateway" / "server" / "call" / "gate.py"
    assert mirror_of(gate) == TESTS / "server" / "call" / "test_gate.py"
    assert mirror_of(REPO / "gateway" / "errors.py") == TESTS / "test_errors.py"


def test_shared_helpers_live_in_tests_support() -> None:
    strays = [str(p.relative_to(REPO)) for p in suite_files()
              if not p.name.startswith("test_") and p.name not in {"conftest.py", "__init__.py"}
              and p.relative_to(TESTS).parts[0] != "support"]
    assert strays == [], f"helpers outside tests/support/ (move them, import as support.<name>): {strays}"


def test_no_test_module_sits_in_tests_support() -> None:
    inside = [str(p.relative_to(REPO)) for p in (TESTS / "support").rglob("test_*.py")]
    assert inside == [], f"tests/support/ holds helpers only: {inside}"


def used_markers() -> dict[str, set[str]]:
    """marker -> the files using it, as ``pytest.mark.<name>`` or ``@needs("<name>")``."""
    used: dict[str, set[str]] = {}
    for path in [*suite_files(), *(TESTS / name / "conftest.py" for name in EXEMPT)]:
        if not path.is_file():
            continue
        text = path.read_text()
        names = set(MARK.findall(text))
        for arguments in NEEDS.findall(text):
            names.update(re.findall(r"[\"'](\w+)[\"']", arguments))
        for name in names:
            used.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return used


def test_every_marker_used_is_declared(pytestconfig: pytest.Config) -> None:
    """Declared: pyproject.toml's markers and those pytest and its plugins register (parametrize, anyio)."""
    declared = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in pytestconfig.getini("markers")}
    undeclared = {name: sorted(files) for name, files in used_markers().items() if name not in declared}
    assert undeclared == {}, f"markers used but not declared in pyproject.toml: {undeclared}"


def test_the_parts_are_the_projects_markers_and_what_the_fast_tier_leaves_out() -> None:
    settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {line.split(":", 1)[0].strip() for line in settings["markers"]}
    assert set(tier.PARTS) <= declared
    selection = re.search(r"^FAST_TIER := (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert selection is not None, "the Makefile's FAST_TIER line is gone"
    assert set(re.findall(r"not (\w+)", selection.group(1))) == set(tier.PARTS)
