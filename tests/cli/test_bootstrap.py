"""gateway.cli.bootstrap: ``gateway bootstrap-token`` prints a fresh token and stores nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway import cli
from gateway.cli import main

TOKEN = re.compile(r"gwt_[a-z0-9]{12}_[A-Za-z0-9_-]{43}")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GATEWAY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("bootstrap-token",))
    return tmp_path / "home"


def test_prints_one_token_on_stdout_and_the_next_step_on_stderr(home: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bootstrap-token"]) == 0
    out, err = capsys.readouterr()
    assert TOKEN.fullmatch(out.strip())
    assert out.count("\n") == 1
    assert err.strip() == ("put it in the file GATEWAY_BOOTSTRAP_TOKEN_FILE names (a Secret); serve adopts "
                           "it as the admin token 'bootstrap' on a fresh state")


def test_each_run_prints_a_new_token(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = set()
    for _ in range(3):
        main(["bootstrap-token"])
        tokens.add(capsys.readouterr().out.strip())
    assert len(tokens) == 3


def test_nothing_is_stored(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["bootstrap-token"])
    assert not home.exists()
