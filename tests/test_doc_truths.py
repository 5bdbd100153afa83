"""What the README and the example files say about behaviour the code settles elsewhere (issue 34):
the approval page's sessions, the OAuth discovery paths, the roles.yaml reload row, the lab suite."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.server.base import reloads

REPO = Path(__file__).resolve().parent.parent
README = " ".join((REPO / "README.md").read_text().split())


def test_the_readme_keeps_web_sessions_in_the_state_store() -> None:
    assert "sessions live in memory" not in README and "restart signs everyone out" not in README
    assert "sessions are kept in the state store" in README and "survive a restart" in README


def test_the_readme_says_the_discovery_paths_answer_404_only_without_identity_yaml() -> None:
    said = [README[max(0, m.start() - 40):m.end()] for m in re.finditer("discovery paths answer 404", README)]
    assert said and all("Without identity.yaml" in s for s in said), said
    assert "RFC 9728 metadata" in README


def test_roles_example_names_the_audit_phase_that_exists() -> None:
    text = (REPO / "roles.example.yaml").read_text()
    phases = set(re.findall(r"\b([a-z]+_reload)\b", text))
    assert phases == {reloads.PHASE}, phases


def test_no_doc_promises_the_last_good_rules() -> None:
    for name in ("README.md", "rules.example.yaml"):
        text = " ".join((REPO / name).read_text().split())
        assert "last good" not in text and "keeps the last" not in text, name
