"""Names one configuration file uses for what another defines: the pure check (a table of cases),
and the server's warning at load (the server keeps running)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.simulator import Simulator, complete_rules_text, write_targets

from gateway.config import NameKind, NameRef
from gateway.guard.names import KnownNames, unknown_names
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.vocabulary import Category

KNOWN = KnownNames(targets=("vc-1", "vc-2", "lab-01"),
                   tools={"list_vms": Category.READ, "power_off_vm": Category.WRITE,
                          "delete_vm": Category.DESTRUCTIVE},
                   roles=("reader", "admin", "vm-operator"))


def ref(kind: NameKind, value: str, *, glob: bool = True, fold: bool = True) -> NameRef:
    return NameRef(kind, value, "f.yaml:1:1", "p", glob=glob, fold_case=fold)


@pytest.mark.parametrize(("reference", "problem"), [
    (ref("target", "vc-1"), None),
    (ref("target", "VC-1"), None),  # rules.yaml compares case-insensitively
    (ref("target", "VC-1", fold=False), "no target is named 'VC-1'"),  # roles.yaml does not
    (ref("target", "vc2"), "no target is named 'vc2' in targets.yaml; did you mean 'vc-2'?"),
    (ref("target", "lab-*"), None),
    (ref("target", "prod-*"), "the glob 'prod-*' matches no target"),
    (ref("tool", "list_*"), None),
    (ref("tool", "delete_vmm"), "no tool is named 'delete_vmm' in this gateway; did you mean 'delete_vm'?"),
    (ref("role", "vm-operater"), "no role is named 'vm-operater'"),
    (ref("role", "vm-*"), None),
    (ref("write tool", "power_off_vm", glob=False, fold=False), None),
    (ref("write tool", "delete_vm", glob=False, fold=False),
     "'delete_vm' is a destructive tool, so p grants nothing; move it to allow_destructive"),
    (ref("destructive tool", "list_vms", glob=False, fold=False), "'list_vms' is a read tool"),
    (ref("destructive tool", "delete_*", glob=False, fold=False), "no tool is named 'delete_*'"),
])
def test_unknown_names(reference: NameRef, problem: str | None) -> None:
    found = unknown_names([reference], KNOWN)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0].message
        assert str(found[0]).startswith("f.yaml:1:1: p: ")


def test_target_names_are_not_checked_while_targets_yaml_is_unreadable() -> None:
    unknown_targets = KnownNames(None, KNOWN.tools, KNOWN.roles)
    assert unknown_names([ref("target", "nowhere")], unknown_targets) == []
    assert len(unknown_names([ref("tool", "nothing")], unknown_targets)) == 1


def test_the_same_place_is_reported_once() -> None:
    assert len(unknown_names([ref("target", "vc9"), ref("target", "vc9")], KNOWN)) == 1


def test_the_server_warns_at_load_and_keeps_running(
    sim_vc1: Simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = write_targets(tmp_path / "targets.yaml", {"vc-2": sim_vc1})
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "rules.yaml").write_text(complete_rules_text(
        "defaults: {destructive: allow}\n"
        "targets:\n  vc2: {require_web_approval: true}\n"
        "rules:\n  - {name: hosts-by-vm, action: deny, match: {tools: [list_hosts], vm_patterns: [x]}}\n"))
    settings = Settings.from_env(env, home=str(home), targets=str(tmp_path / "targets.yaml"))
    with caplog.at_level(logging.WARNING, logger="gateway.guard.names"):
        gateway = Gateway.build(settings)
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"{home / 'rules.yaml'}:3:3: targets.vc2: no target is named 'vc2'" in w
                   and "did you mean 'vc-2'?" in w for w in warnings), warnings
        assert any(f"{home / 'rules.yaml'}:5:5: rules[0].match.vm_patterns: can never apply: list_hosts "
                   "shows no VM" in w for w in warnings), warnings
        assert gateway.policy.current().targets[0].pattern == "vc2"  # the file is in force, not refused
    finally:
        gateway.store.close()
