"""``gateway policy show`` and ``gateway check`` over real files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.simulator import complete_rules_text

from gateway.cli import main


def _files(tmp_path: Path, rules: str, *, complete: bool = True) -> list[str]:
    (tmp_path / "targets.yaml").write_text(
        "targets:\n  - {name: vc1, host: h, credential_env_prefix: VC1, tags: [env:prod]}\n"
    )
    (tmp_path / "rules.yaml").write_text(complete_rules_text(rules) if complete else rules)
    return ["--home", str(tmp_path)]


def test_policy_show_prints_effective_settings_per_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _files(
        tmp_path, "defaults: {destructive: allow}\ntargets:\n  vc1: {require_web_approval: true}\n"
    )
    assert main(["policy", "show", "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    text = json.dumps(report)
    assert "vc1" in text and "require_web_approval" in text


def test_policy_show_exits_1_and_names_the_parse_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _files(tmp_path, "defaults: {write: allow\n")
    assert main(["policy", "show", *flags]) == 1
    out = capsys.readouterr().out
    assert "error" in out and "denied until it is fixed" in out


def test_check_reports_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _files(tmp_path, "defaults: {colour: blue}\n")
    monkeypatch.delenv("VC1_USER", raising=False)
    assert main(["check", *flags]) == 1
    err = capsys.readouterr().err
    assert "VC1_USER" in err and "colour" in err


def test_check_passes_on_good_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _files(tmp_path, "defaults: {destructive: deny}\n")
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    assert main(["check", *flags]) == 0
    assert "targets: 1" in capsys.readouterr().out


# --------------------------------------------------------------------------- names across files

TWO_TARGETS = ("targets:\n  - {name: vc-1, host: h1, credential_env_prefix: VC1}\n"
               "  - {name: vc-2, host: h2, credential_env_prefix: VC2, tags: [env:prod]}\n")


def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rules: str | None = None,
          roles: str | None = None, targets: str = TWO_TARGETS) -> list[str]:
    for prefix in ("VC1", "VC2"):
        monkeypatch.setenv(f"{prefix}_USER", "u")
        monkeypatch.setenv(f"{prefix}_PASSWORD", "p")
    monkeypatch.delenv("GATEWAY_LOG_LEVEL", raising=False)
    monkeypatch.delenv("GATEWAY_LOG_FORMAT", raising=False)
    (tmp_path / "targets.yaml").write_text(targets)
    if rules is not None:
        (tmp_path / "rules.yaml").write_text(complete_rules_text(rules))
    if roles is not None:
        (tmp_path / "roles.yaml").write_text(roles)
        (tmp_path / "roles.yaml").chmod(0o600)
    return ["--home", str(tmp_path)]


MISSPELT_GATE = "defaults: {destructive: allow}\ntargets:\n  vc2:\n    require_web_approval: true\n"


def test_check_refuses_a_misspelt_target_that_would_lift_a_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _home(tmp_path, monkeypatch, rules=MISSPELT_GATE)
    assert main(["check", *flags]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'rules.yaml'}:3:3: targets.vc2: no target is named 'vc2'" in err
    assert "did you mean 'vc-2'?" in err


@pytest.mark.parametrize(("rules", "roles", "expected"), [
    ("rules:\n  - name: r\n    action: deny\n    match: {tools: [delete_vmm]}\n", None,
     ["rules.yaml:4:21: rules[0].match.tools[0]: no tool is named 'delete_vmm'",
      "did you mean 'delete_vm'?"]),
    ("rules:\n  - name: r\n    action: deny\n    match: {roles: [vm-operater]}\n",
     "roles:\n  vm-operator: {tools: read, allow_write: [], allow_destructive: [], targets: \"*\", "
     "approve: none}\n",
     ["rules.yaml:4:21: rules[0].match.roles[0]: no role is named 'vm-operater'", "'vm-operator'"]),
    ("protected:\n  - {name: p, vm_patterns: [db-*], targets: [\"prod-*\"]}\n", None,
     ["rules.yaml:2:46: protected[0].targets[0]: the glob 'prod-*' matches no target"]),
    (None, "roles:\n  ops:\n    tools: read\n    allow_write: [delete_vm, power_of_vm]\n"
           "    allow_destructive: []\n    targets: [vc-3]\n    approve: none\n",
     ["roles.yaml:4:19: roles.ops.allow_write[0]: 'delete_vm' is a destructive tool, so allow_write grants "
      "nothing; move it to allow_destructive",
      "roles.yaml:4:30: roles.ops.allow_write[1]: no tool is named 'power_of_vm' in this gateway; did you "
      "mean 'power_off_vm'?",
      "roles.yaml:6:15: roles.ops.targets[0]: no target is named 'vc-3'"]),
])
def test_check_refuses_names_that_match_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    rules: str | None, roles: str | None, expected: list[str],
) -> None:
    flags = _home(tmp_path, monkeypatch, rules=rules, roles=roles)
    assert main(["check", *flags]) == 1
    err = capsys.readouterr().err
    for fragment in expected:
        assert fragment in err


def test_check_reports_each_problem_once_with_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = "defaults: {destructive: allow}\nrules:\n  - {name: x, colour: 1}\n"
    targets = TWO_TARGETS.replace("tags: [env:prod]", "colour: red")
    flags = _home(tmp_path, monkeypatch, rules=rules, targets=targets)
    monkeypatch.delenv("VC1_PASSWORD")
    assert main(["check", *flags]) == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    problems = [line for line in lines if ": " in line and line.split(":")[0].endswith(".yaml")]
    assert len(problems) == len(set(problems)) == 3, lines
    assert all(re.match(r"^\S+\.yaml:\d+:\d+: ", p) for p in problems), problems
    assert sum("VC1_PASSWORD" in line for line in lines) == 1  # a warning: no secrets needed to lint
    assert all(p.count(str(tmp_path)) == 1 for p in problems)
    assert all("target 'vc-1': target 'vc-1'" not in p for p in problems)
    assert "<unicode string>" not in captured.err + captured.out


def test_check_names_the_file_of_a_yaml_syntax_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _home(tmp_path, monkeypatch, rules="defaults: {write: allow\n")
    assert main(["check", *flags]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'rules.yaml'}:2:1: not valid YAML" in err and "<unicode string>" not in err


@pytest.mark.parametrize("argv", [["check"], ["policy", "show"], ["roles", "list"], ["roles", "check"]])
def test_cli_commands_log_nothing_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    flags = _home(tmp_path, monkeypatch, rules=MISSPELT_GATE.replace("vc2", "vc-2"))
    main([*argv, *flags])
    quiet = capsys.readouterr()
    log_line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ", re.M)
    assert not log_line.search(quiet.out) and not log_line.search(quiet.err), quiet
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "DEBUG")
    main([*argv, *flags])
    asked = capsys.readouterr()
    assert not log_line.search(asked.out)


def test_policy_show_marks_entries_that_match_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _home(tmp_path, monkeypatch, rules=MISSPELT_GATE + "rules:\n  - {name: r, action: deny, "
                                                               "match: {targets: [vc-9]}}\n")
    assert main(["policy", "show", "--json", *flags]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target_entries"]["vc2"]["matches"] == []
    assert "no target is named 'vc2'" in report["target_entries"]["vc2"]["warning"]
    assert "no target is named 'vc-9'" in report["rules"][0]["warnings"][0]
    assert any("vc2" in w for w in report["warnings"]) and any("vc-9" in w for w in report["warnings"])
    assert report["targets"]["vc-2"]["require_web_approval"] is False


def test_roles_list_shows_that_admin_may_write_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = _home(tmp_path, monkeypatch)
    assert main(["roles", "list", *flags]) == 0
    out = capsys.readouterr().out
    admin = out.split("admin  (built-in)")[1].split("(built-in)")[0]
    assert "allow_write: *" in admin and "allow_destructive: *" in admin and "audit: all" in admin


def test_the_three_example_files_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Path(__file__).resolve().parents[2]
    for name in ("targets", "rules", "roles"):
        (tmp_path / f"{name}.yaml").write_text((repo / f"{name}.example.yaml").read_text())
    (tmp_path / "ca.pem").write_text("")  # the example's ca_file, which check requires to exist
    targets = tmp_path / "targets.yaml"
    targets.write_text(targets.read_text().replace("/etc/gateway/ca/prod.pem", str(tmp_path / "ca.pem")))
    (tmp_path / "roles.yaml").chmod(0o600)
    for prefix in ("VC_PROD", "VC_DEV", "ESX_EDGE", "VC_LAB"):
        monkeypatch.setenv(f"{prefix}_USER", "u")
        monkeypatch.setenv(f"{prefix}_PASSWORD", "p")
    code = main(["check", "--home", str(tmp_path)])
    assert code == 0, capsys.readouterr().err


def test_roles_check_refuses_a_target_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    roles = ("roles:\n  ops: {tools: read, allow_write: [], allow_destructive: [], targets: [vc-3], "
             "approve: none}\n")
    flags = _home(tmp_path, monkeypatch, roles=roles)
    assert main(["roles", "check", *flags]) == 1
    assert "roles.yaml:2:72: roles.ops.targets[0]: no target is named 'vc-3'" in capsys.readouterr().out


COMPLETE_RULES = """\
# every section present: a cut anywhere between them loses one
defaults:
  destructive: allow
protected:
  - name: keep-db
    vm_patterns: ["db-*"]
rules:
  - name: deletes-need-a-human
    match: {tools: [delete_vm]}
    action: require_approval
targets:
  vc1:
    require_web_approval: true
maintenance_windows: []
"""


def section_cuts(text: str) -> list[int]:
    """Offsets where a file cut at a section boundary ends: before each top-level key, and right
    after each one's ``key:`` line (the section cut off before its first entry)."""
    cuts: list[int] = []
    offset = 0
    for line in text.splitlines(keepends=True):
        if re.match(r"^[a-z_]+:", line):
            cuts.append(offset)
            if line.rstrip().endswith(":"):
                cuts.append(offset + len(line))
        offset += len(line)
    return cuts


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")


@pytest.mark.usefixtures("credentials")
def test_check_accepts_the_complete_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *_files(tmp_path, COMPLETE_RULES)]) == 0, capsys.readouterr().err


@pytest.mark.usefixtures("credentials")
@pytest.mark.parametrize("cut", section_cuts(COMPLETE_RULES))
def test_check_refuses_a_rules_file_cut_at_a_section_boundary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cut: int
) -> None:
    flags = _files(tmp_path, COMPLETE_RULES[:cut], complete=False)
    assert main(["check", *flags]) == 1
    err = capsys.readouterr().err
    assert "missing section" in err or "has no value" in err or "holds no section" in err


@pytest.mark.usefixtures("credentials")
def test_check_refuses_a_rule_that_can_never_apply_to_the_tools_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = ("rules:\n  - name: hide-db-hosts\n    action: deny\n"
             "    match: {roles: [reader], tools: [list_hosts], vm_patterns: [\"db-*\"]}\n")
    assert main(["check", *_files(tmp_path, rules)]) == 1
    err = capsys.readouterr().err
    assert (f"{tmp_path / 'rules.yaml'}:2:5: rules[0].match.vm_patterns: can never apply: list_hosts shows "
            "no VM") in err


def test_policy_show_marks_a_rule_that_can_never_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = "rules:\n  - {name: r, action: deny, match: {tools: [list_datastores], folders: [x]}}\n"
    assert main(["policy", "show", "--json", *_home(tmp_path, monkeypatch, rules=rules)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "can never apply" in report["rules"][0]["warnings"][0]
    assert any("rules[0].match.folders" in w for w in report["warnings"])
