"""gateway.guard.policy.describe: ``gateway policy show`` as plain values, unknown names marked."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Target
from gateway.guard.names import KnownNames
from gateway.guard.policy.describe import describe
from gateway.guard.policy.store import PolicyStore
from gateway.vocabulary import Category

RULES = """\
defaults: {}
protected:
- {name: p, vm_patterns: [db-*], targets: [prod-*]}
rules:
- {name: r1, action: deny, match: {targets: [prod-*], tools: [nosuch]}}
- {name: r2, action: allow, match: {target_tags: [lab], roles: [ghost]}}
targets:
  prod-*: {dry_run: true}
  nowhere: {write: deny}
maintenance_windows:
- {name: w, start: '01:00', end: '02:00', targets: [dev]}
"""
TARGETS = (Target("prod-1", "vc1.example", "VC1"), Target("dev", "vc2.example", "VC2", tags=("lab",)))
KNOWN = KnownNames(("prod-1", "dev"),
                   {"delete_vm": Category.DESTRUCTIVE, "list_vms": Category.READ, "list_hosts": Category.READ,
                    "power_on_vm": Category.WRITE},
                   ("reader", "admin"))


def shown(tmp_path: Path, text: str | None, known: KnownNames | None = KNOWN) -> dict[str, Any]:
    path = tmp_path / "rules.yaml"
    if text is not None:
        path.write_text(text)
    return describe(PolicyStore(path), TARGETS, known)


@pytest.fixture
def full(tmp_path: Path) -> dict[str, Any]:
    return shown(tmp_path, RULES)


def test_status_and_file(tmp_path: Path, full: dict[str, Any]) -> None:
    assert full["status"] == "ok"
    assert full["file"] == str(tmp_path / "rules.yaml")
    assert "note" not in full


def test_defaults_are_the_default_settings(full: dict[str, Any]) -> None:
    assert full["defaults"]["destructive"] == "deny"
    assert set(full["defaults"]["set_by"].values()) == {"defaults"}


def test_each_target_lists_what_applies_to_it(full: dict[str, Any]) -> None:
    prod, dev = full["targets"]["prod-1"], full["targets"]["dev"]
    assert prod["dry_run"] is True and prod["set_by"]["dry_run"] == "targets:prod-*"
    keys = ("tags", "rules", "protected", "maintenance_windows")
    assert [prod[k] for k in keys] == [[], ["r1"], ["p"], []]
    assert [dev[k] for k in keys] == [["lab"], ["r2"], [], ["w"]]


def test_target_entries_show_what_they_match(full: dict[str, Any]) -> None:
    entries = full["target_entries"]
    assert entries["prod-*"] == {"matches": ["prod-1"], "settings": {"dry_run": True}}
    assert entries["nowhere"]["matches"] == []
    assert entries["nowhere"]["settings"] == {"write": "deny"}
    assert entries["nowhere"]["warning"].startswith("no target is named 'nowhere' in targets.yaml")


def test_entries_naming_nothing_are_marked_where_they_stand(full: dict[str, Any]) -> None:
    r1, r2 = full["rules"]
    assert r1["warnings"] == ["no tool is named 'nosuch' in this gateway (there are: delete_vm, list_hosts, "
                              "list_vms, power_on_vm)"]
    assert r2["warnings"] == ["no role is named 'ghost' (built-in or in roles.yaml) (there are: admin, "
                              "reader)"]
    assert "warnings" not in full["protected"][0]
    assert "warnings" not in full["maintenance_windows"][0]


def test_the_top_level_warnings_carry_file_line_and_path(tmp_path: Path, full: dict[str, Any]) -> None:
    path = tmp_path / "rules.yaml"
    assert [w.split(": ")[1] for w in full["warnings"]] == [
        "rules[0].match.tools[0]", "rules[1].match.roles[0]", "targets.nowhere"]
    assert all(w.startswith(f"{path}:") for w in full["warnings"])


def test_without_known_names_nothing_is_marked(tmp_path: Path) -> None:
    out = shown(tmp_path, RULES, known=None)
    assert "warnings" not in out
    assert all("warnings" not in rule for rule in out["rules"])
    assert "warning" not in out["target_entries"]["nowhere"]


def test_a_rule_that_can_never_apply_is_marked(tmp_path: Path) -> None:
    text = RULES.replace("rules:\n", "rules:\n- {name: r0, action: deny, match: {tools: [list_hosts], "
                                     "vm_patterns: [web-*]}}\n")
    out = shown(tmp_path, text)
    (warning,) = out["rules"][0]["warnings"]
    assert ": rules[0].match.vm_patterns: can never apply: list_hosts shows no VM" in warning
    assert warning in out["warnings"]


def test_a_missing_file_is_the_builtin(tmp_path: Path) -> None:
    out = shown(tmp_path, None)
    assert out["status"] == "builtin"
    assert out["note"] == f"no rules file at {tmp_path / 'rules.yaml'}: the built-in strict defaults apply"
    assert out["rules"] == [] and out["target_entries"] == {}
    assert set(out["targets"]) == {"prod-1", "dev"}


def test_a_broken_file_says_since_when_why_and_what_it_does(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules: [")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    out = describe(PolicyStore(path), TARGETS, KNOWN)
    assert out["status"] == "error" and out["broken"] is True
    assert out["broken_since"] == datetime.fromtimestamp(1_700_000_000, UTC).isoformat(timespec="seconds")
    (error,) = out["errors"]
    assert error.startswith(f"{path}:1:9: not valid YAML: ")
    assert out["effect"] == ("every call the policy decides is denied until it is fixed; no earlier rules "
                             "stay in force")
    assert "targets" not in out


def test_no_targets(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    out = describe(PolicyStore(path), (), None)
    assert out["targets"] == {}
    assert out["target_entries"]["prod-*"]["matches"] == []
