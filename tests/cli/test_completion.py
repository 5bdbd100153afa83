"""Bare ``gateway`` shows the help; bash and zsh completion (``gateway completion``) and the man page
(``make man``) are generated from the same parser and name every command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.httpserver import GATEWAY_MAIN

from gateway.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return list(sub.choices or ())  # type: ignore[arg-type]


def gateway(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", GATEWAY_MAIN, *argv], capture_output=True, text=True,
                          timeout=60, cwd=REPO, check=False)


def test_bare_gateway_prints_the_help_and_exits_0() -> None:
    done = gateway()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gateway") and all(name in done.stdout for name in commands())


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_name_every_command(shell: str) -> None:
    done = gateway("completion", shell)
    assert done.returncode == 0, done.stderr
    assert {"serve", "check", "doctor", "token", "completion"} <= set(commands())
    for name in commands():
        assert name in done.stdout, name
    assert "--transport" in done.stdout  # flags of the commands too
    if shell == "bash":
        syntax = subprocess.run(["bash", "-n"], input=done.stdout, capture_output=True, text=True,
                                check=False)
        assert syntax.returncode == 0, syntax.stderr


@pytest.mark.slow
def test_make_man_generates_the_man_page_from_the_parser(tmp_path: Path) -> None:
    page = tmp_path / "gateway.1"
    # -o: the venv and the bootstrap count as done (this test runs inside the venv they made)
    done = subprocess.run(["make", "-s", "-o", "bootstrap", "-o", ".venv/bin/gateway", "man",
                           f"MANPAGE={page}", f"BIN={Path(sys.executable).parent}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    text = page.read_text()
    assert text.startswith(".TH GATEWAY") or ".TH GATEWAY" in text[:400]
    plain = text.replace("\\-", "-").replace("\\fI\\,", "").replace("\\/\\fR", "")
    for name in commands():
        assert f"'gateway {name}'" in plain, name
