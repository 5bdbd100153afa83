"""Strict loading of targets.yaml."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateway import config
from gateway.config import ConfigProblems, Target, load_targets, load_yaml, located, parse_targets

ENV = {"VC1_USER": "u", "VC1_PASSWORD": "p", "VC2_USER": "u", "VC2_PASSWORD": "p"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "targets.yaml"
    path.write_text(text)
    return path


def test_loads_targets_with_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
targets:
  - name: vc1
    host: vc1.example.com
    credential_env_prefix: VC1
    tags: [env:prod]
  - {name: esx1, host: 10.0.0.5, port: 8443, credential_env_prefix: VC2, insecure: true,
     standalone_host: true, pool_size: 4, timeout_seconds: 5}
""",
    )
    vc1, esx1 = load_targets(path, ENV)
    assert vc1 == Target(name="vc1", host="vc1.example.com", credential_env_prefix="VC1", tags=("env:prod",))
    assert vc1.pool_size == 2 and vc1.insecure is False and vc1.address == "vc1.example.com"
    assert esx1.address == "10.0.0.5:8443" and esx1.pool_size == 4 and esx1.standalone_host
    assert vc1.max_queued_per_caller == 32  # the default bound of calls one caller may have waiting
    assert esx1.credentials(ENV).user == "u"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("- {name: a, host: h, credential_env_prefix: VC1, colour: red}", "target 'a': unknown key 'colour'"),
        (
            "- {name: a, host: h, credential_env_prefix: VC1}\n"
            "- {name: a, host: h2, credential_env_prefix: VC1}",
            "target 'a': duplicate name",
        ),
        ("- {name: a, host: h, credential_env_prefix: NOPE}", "set NOPE_USER and NOPE_PASSWORD"),
        ("- {name: a, credential_env_prefix: VC1}", "missing required key 'host'"),
        ("- {name: a, host: h, credential_env_prefix: VC1, port: '443'}", "'port' must be int"),
        ("- {name: a, host: h, credential_env_prefix: VC1, pool_size: 0}", "'pool_size' must be between"),
        ("- {name: a, host: h, credential_env_prefix: VC1, max_queued_per_caller: 0}",
         "'max_queued_per_caller' must be between 1 and 10000"),
        ("- {name: a, host: h, credential_env_prefix: VC1, max_queued_per_caller: 2.5}",
         "'max_queued_per_caller' must be int"),
        ("- {name: a, host: h, credential_env_prefix: VC1, insecure: true, ca_file: /x}", "not both"),
        ("- {name: all, host: h, credential_env_prefix: VC1}", "'all' is reserved"),
        ("- {name: a, host: h, credential_env_prefix: VC1, insecure: 'yes'}", "'insecure' must be bool"),
    ],
)
def test_each_problem_names_file_target_and_fix(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, "targets:\n" + "\n".join("  " + line for line in body.splitlines()))
    with pytest.raises(ConfigProblems) as info:
        load_targets(path, ENV)
    assert any(expected in p and str(path) in p for p in info.value.problems), info.value.problems


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
targets:
  - {name: a, host: h, credential_env_prefix: VC1, bogus: 1}
  - {name: b, host: h, credential_env_prefix: MISSING}
""",
    )
    with pytest.raises(ConfigProblems) as info:
        load_targets(path, ENV)
    assert len(info.value.problems) == 2


def test_unreadable_and_unparseable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigProblems, match="cannot read targets file"):
        load_targets(tmp_path / "absent.yaml")
    with pytest.raises(ConfigProblems, match="not valid YAML"):
        load_targets(write(tmp_path, "targets: [unclosed"))
    with pytest.raises(ConfigProblems, match="top-level 'targets:' list"):
        parse_targets({"targets": {"a": 1}}, "x.yaml")


def test_password_never_in_repr() -> None:
    target = Target(name="a", host="h", credential_env_prefix="VC1")
    assert "p4ss" not in repr(target.credentials({"VC1_USER": "u", "VC1_PASSWORD": "p4ss"}))


@pytest.mark.parametrize(("body", "expected"), [
    ("- {name: a, host: h, credential_env_prefix: VC1, colour: red}",
     ":2:52: target 'a': unknown key 'colour'"),
    ("- {name: a, host: h, credential_env_prefix: VC1}\n- {name: a, host: h2, credential_env_prefix: VC1}",
     ":3:6: target 'a': duplicate name (also at "),
    ("- {name: a, host: h, credential_env_prefix: NOPE}",
     ":2:24: target 'a': credentials missing; set NOPE_USER"),
    ("- {name: a, host: h, credential_env_prefix: VC1, port: '443'}",
     ":2:52: target 'a': 'port' must be int"),
    ("- name: a\n  host: h\n  credential_env_prefix: VC1\n  host: h2",
     ":5:5: the key 'host' appears twice in one mapping (first at line 3, column 5); keep only one"),
])
def test_problems_carry_line_and_column(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, "targets:\n" + "\n".join("  " + line for line in body.splitlines()) + "\n")
    with pytest.raises(ConfigProblems) as info:
        load_targets(path, ENV)
    assert [p for p in info.value.problems if p.startswith(f"{path}{expected}")], info.value.problems
    assert all("target 'a': target 'a'" not in p for p in info.value.problems)


def test_yaml_errors_name_the_file_not_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, "targets:\n  - {name: a\n")
    with pytest.raises(ConfigProblems) as info:
        load_targets(path, ENV)
    assert info.value.problems[0].startswith(f"{path}:3:1: not valid YAML")
    assert "<unicode string>" not in info.value.message


@pytest.mark.parametrize(("text", "problem"), [
    ("a: &x {b: 1}\nc: {<<: *x}\n", "f.yaml:2:5: merge keys ('<<') are not supported here"),
    ("? [a]\n: 1\n", "f.yaml:1:3: a key must be a plain value"),
])
def test_the_loader_refuses_what_could_hide_a_key(text: str, problem: str) -> None:
    with pytest.raises(ConfigProblems) as info:
        load_yaml(text, "f.yaml")
    assert info.value.problems[0].startswith(problem)


def test_the_loader_keeps_positions() -> None:
    data = load_yaml("top:\n  - {a: 1}\n  - b\n", "f.yaml")
    assert located("f.yaml", data, "top") == "f.yaml:1:1"
    assert located("f.yaml", data["top"], 1) == "f.yaml:3:5"
    assert located("f.yaml", data["top"][0], "a") == "f.yaml:2:6"
    assert located("f.yaml", {"plain": 1}, "plain") == "f.yaml"


OPTIONAL = [spec for spec in dataclasses.fields(Target) if spec.default is not dataclasses.MISSING]
MINIMAL = "targets:\n  - name: a\n    host: h\n    credential_env_prefix: VC1\n"


@pytest.mark.parametrize("spec", OPTIONAL, ids=lambda spec: spec.name)
def test_a_minimal_entry_takes_each_default_from_target(tmp_path: Path, spec: dataclasses.Field[Any]) -> None:
    (target,) = load_targets(write(tmp_path, MINIMAL), ENV)
    assert getattr(target, spec.name) == spec.default
    assert target == Target(name="a", host="h", credential_env_prefix="VC1")


@pytest.mark.parametrize("spec", OPTIONAL, ids=lambda spec: spec.name)
def test_a_null_value_means_the_default(tmp_path: Path, spec: dataclasses.Field[Any]) -> None:
    (target,) = load_targets(write(tmp_path, f"{MINIMAL}    {spec.name}: null\n"), ENV)
    assert getattr(target, spec.name) == spec.default


def test_each_default_literal_is_written_once() -> None:
    """Outside a key's bounds and choices, each default's literal appears once in gateway/config.py."""
    tree = ast.parse(Path(config.__file__).read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        bounds = isinstance(node, ast.keyword) and node.arg in {"low", "high", "choices"}
        choices = isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MIRROR_MODES"
        if bounds or choices:
            skipped.update(id(inner) for inner in ast.walk(node))
    literals = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                and id(node) not in skipped and not isinstance(node.value, bool)]
    defaults = [spec.default for spec in OPTIONAL if spec.default not in (None, False, (), "")]
    assert len(defaults) >= 6
    for default in defaults:
        same = [v for v in literals if isinstance(v, str) == isinstance(default, str) and v == default]
        assert len(same) == 1, f"the default {default!r} is written {len(same)} times in gateway/config.py"


BLOCK = MINIMAL + "    {line}\n"


@pytest.mark.parametrize(("line", "problem"), [
    ("pool_size: 0", "'pool_size' must be between 1 and 32"),
    ("pool_size: 33", "'pool_size' must be between 1 and 32"),
    ("max_queued_per_caller: 10001", "'max_queued_per_caller' must be between 1 and 10000 (calls one caller "
     "may have waiting for this target; default 32)"),
    ("timeout_seconds: 0", "'timeout_seconds' must be positive"),
    ("proposal_ttl_seconds: 9", "'proposal_ttl_seconds' must be between 10 and 604800 (7 days); gated "
     "targets typically want 900-3600"),
    ("mirror: sometimes", "'mirror' must be one of off, lazy, eager"),
    ("max_staleness_seconds: -1", "'max_staleness_seconds' must be zero or positive"),
    ("mirror_check_seconds: 86401", "'mirror_check_seconds' must be between 1 and 86400 (how often the "
     "mirror compares itself with a live read; default 300)"),
    ("tags: [a, 1]", "'tags' must be a list of strings"),
    ("tags: a", "'tags' must be list, got str; write a list, e.g. tags: [a, b]"),
    ("pool_size: true", "'pool_size' must be int, got bool; write a whole number without quotes, e.g. "
     "pool_size: 4"),
    ("timeout_seconds: '5'", "'timeout_seconds' must be int or float, got str; write a number without "
     "quotes, e.g. timeout_seconds: 30"),
    ("dry_run: 'no'", "'dry_run' must be bool, got str; write true or false without quotes, e.g. "
     "dry_run: true"),
    ("pool_sise: 2", "unknown key 'pool_sise'; did you mean 'pool_size'?; allowed keys are ca_file, "
     "credential_env_prefix, dry_run, host, insecure, max_queued_per_caller, max_staleness_seconds, mirror, "
     "mirror_check_seconds, name, pool_size, port, proposal_ttl_seconds, standalone_host, tags, "
     "timeout_seconds"),
    ("insecure: true\n    ca_file: /x", "set either 'insecure: true' or 'ca_file', not both"),
    ("ca_file: /absent/ca.pem", "ca_file '/absent/ca.pem' does not exist (or is not a file); point it at the "
     "PEM bundle of the CA that signed the target's certificate (a relative path counts from the gateway's "
     "working directory)"),
])
def test_a_bad_value_is_one_problem_at_its_key(tmp_path: Path, line: str, problem: str) -> None:
    path = write(tmp_path, BLOCK.format(line=line))
    with pytest.raises(ConfigProblems) as info:
        load_targets(path, ENV)
    assert info.value.problems == [f"{path}:5:5: target 'a': {problem}"]


@pytest.mark.parametrize("line", [
    "pool_size: 1", "pool_size: 32", "max_queued_per_caller: 1", "max_queued_per_caller: 10000",
    "timeout_seconds: 0.5", "proposal_ttl_seconds: 10", "proposal_ttl_seconds: 604800", "mirror: 'off'",
    "mirror: eager", "max_staleness_seconds: 0", "mirror_check_seconds: 1", "mirror_check_seconds: 86400",
])
def test_the_bounds_themselves_are_accepted(tmp_path: Path, line: str) -> None:
    key, raw = line.split(": ")
    (target,) = load_targets(write(tmp_path, BLOCK.format(line=line)), ENV)
    assert getattr(target, key) == (raw.strip("'") if key == "mirror" else float(raw))


@pytest.mark.parametrize(("text", "problem"), [
    ("targets:\n  - name: a\n    credential_env_prefix: VC1\n",
     ":2:5: target 'a': missing required key 'host'"),
    ("targets:\n  - just-a-host\n",
     ":2:5: target #1: each target must be a mapping with at least name, host, credential_env_prefix"),
    ("targets:\n  - host: h\n    credential_env_prefix: VC1\n",
     ":2:5: target #1: missing required key 'name'"),
    (MINIMAL.replace("name: a", "name: '*'"), ":2:5: target '*': '*' is reserved (it means every target); "
     "pick another name"),
    ("targets:\n  a: 1\n", ":2:3: expected a top-level 'targets:' list of target entries"),
])
def test_entry_level_problems_point_at_the_entry(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigProblems) as info:
        load_targets(path, ENV)
    assert info.value.problems == [f"{path}{problem}"]
