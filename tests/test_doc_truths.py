"""What the docs and the example files say about behaviour the code settles elsewhere."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

from gateway import errors
from gateway.cli import build_parser
from gateway.server.base import reloads

REPO = Path(__file__).resolve().parent.parent
#: the README and every docs/ page
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def page(name: str) -> str:
    """A docs/ page (or the README) with its whitespace folded."""
    path = REPO / name if name == "README.md" else REPO / "docs" / name
    return " ".join(path.read_text().split())


def test_the_approvals_page_keeps_web_sessions_in_the_state_store() -> None:
    for path in PAGES:
        text = " ".join(path.read_text().split())
        assert "sessions live in memory" not in text and "restart signs everyone out" not in text, path
    said = page("approvals.md")
    assert "sessions are kept in the state store" in said and "survive a restart" in said


def test_the_operations_page_says_the_discovery_paths_answer_404_only_without_identity_yaml() -> None:
    text = page("operations.md")
    said = [text[max(0, m.start() - 40):m.end()] for m in re.finditer("discovery paths answer 404", text)]
    assert said and all("Without identity.yaml" in s for s in said), said
    assert "RFC 9728 metadata" in text


def test_roles_example_names_the_audit_phase_that_exists() -> None:
    text = (REPO / "roles.example.yaml").read_text()
    phases = set(re.findall(r"\b([a-z]+_reload)\b", text))
    assert phases == {reloads.PHASE}, phases


def test_no_doc_promises_the_last_good_rules() -> None:
    for path in (*PAGES, REPO / "rules.example.yaml"):
        text = " ".join(path.read_text().split())
        assert "last good" not in text and "keeps the last" not in text, path


def test_the_configuration_page_names_every_variable_the_package_reads() -> None:
    read = set()
    for module in (REPO / "gateway").rglob("*.py"):
        read |= set(re.findall(r'"(GATEWAY_[A-Z_]+)"', module.read_text()))
    assert len(read) > 20, read
    missing = sorted(name for name in read if name not in page("configuration.md"))
    assert not missing, missing


def test_the_operations_page_names_every_gateway_command() -> None:
    commands = set()
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands |= set(action.choices)
    table = page("operations.md").split("## The `gateway` command", 1)[1]
    missing = sorted(command for command in commands if f"`gateway {command}" not in table)
    assert len(commands) >= 10 and not missing, missing


def test_every_error_code_the_tools_page_lists_is_a_code_the_gateway_sends() -> None:
    codes = {cls.code for _, cls in inspect.getmembers(errors, inspect.isclass)
             if issubclass(cls, errors.GatewayError)}
    listed = page("tools.md").split("The codes are stable:", 1)[1].split(", and more", 1)[0]
    named = re.findall(r"`([a-z_]+)`", listed)
    assert len(named) >= 10 and set(named) <= codes, sorted(set(named) - codes)
