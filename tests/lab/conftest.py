"""The lab suite's gateway: ``gateway serve --read-only`` over the targets of ``LAB_TARGETS_FILE``, their
credentials from the usual ``<PREFIX>_USER``/``<PREFIX>_PASSWORD`` variables, in a private temporary
home with one admin token. Without ``LAB_TARGETS_FILE`` nothing here is collected (``make lab-test``
says what to set); the main suite runs this folder against two simulators (tests/test_lab_suite.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.lab_client import Lab
from support.httpserver import FAST_HASH, Command, https_argv, run_serve

from gateway.auth.tokens import create_token
from gateway.config import load_targets
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore

LAB_FILE = os.environ.get("LAB_TARGETS_FILE")
if not LAB_FILE:
    collect_ignore_glob = ["test_*.py"]


def lab_environment(home: Path, targets_file: Path) -> dict[str, str]:
    """What the lab's ``gateway serve`` gets: the home, the targets file, read-only, the credentials."""
    passed = {k: v for k, v in os.environ.items()
              if k.endswith(("_USER", "_PASSWORD")) and not k.startswith("GATEWAY_")}
    return {**passed, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GATEWAY_HOME": str(home),
            "GATEWAY_TARGETS_FILE": str(targets_file), "GATEWAY_READ_ONLY": "true"}


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    assert LAB_FILE, "set LAB_TARGETS_FILE"
    targets_file = Path(LAB_FILE).expanduser().resolve()
    names = [t.name for t in load_targets(targets_file)]
    tmp = tmp_path_factory.mktemp("lab")
    home = tmp / "home"
    home.mkdir(mode=0o700)
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "lab", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"])
    env = lab_environment(home, targets_file)
    command: Command = run_serve(tmp, env, "--read-only", *https_argv(cert))
    try:
        yield Lab(command.base(), cert.cert, token, names, env, command)
    finally:
        command.stop()
