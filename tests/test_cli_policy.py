"""``gateway policy show`` and ``gateway check`` over real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main


def _files(tmp_path: Path, rules: str) -> list[str]:
    (tmp_path / "targets.yaml").write_text(
        "targets:\n  - {name: vc1, host: h, credential_env_prefix: VC1, tags: [env:prod]}\n"
    )
    (tmp_path / "rules.yaml").write_text(rules)
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
