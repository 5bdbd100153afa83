"""GATEWAY_BOOTSTRAP_TOKEN_FILE: the first token of a fresh state (gateway/server/bootstrap_token.py),
for a container volume or a pod where no shell runs ``gateway token create`` first."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from httpserver import FAST_HASH, GATEWAY_MAIN, https_argv, run_serve
from simulator import Simulator, wait_until, write_targets

from gateway.audit.query import read_rows
from gateway.auth.tokens import create_token
from gateway.errors import ConfigError
from gateway.server import bootstrap_token
from gateway.server.tls import create_certificate
from gateway.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parent.parent


def printed_token() -> str:
    done = subprocess.run([sys.executable, "-c", GATEWAY_MAIN, "bootstrap-token"], capture_output=True,
                          text=True, timeout=60, cwd=REPO, check=True)
    return done.stdout.strip()


def test_serve_on_a_fresh_volume_writes_the_first_token_and_accepts_it(
    sim_vc1: Simulator, tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    token_file = tmp_path / "volume-token"
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "GATEWAY_BOOTSTRAP_TOKEN_FILE": str(token_file)})
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    try:
        base = command.base()
        token = token_file.read_text().strip()
        assert token.startswith("gwt_") and token_file.stat().st_mode & 0o077 == 0
        tls = ssl.create_default_context(cafile=str(cert.cert))
        answer = httpx2.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, verify=tls,
                            timeout=30)
        assert answer.status_code == 200, answer.text
        assert token not in command.output()
    finally:
        assert command.stop() == 0, command.output()
    rows = wait_until(lambda: read_rows(home / "audit.jsonl", phase="token_created"), what="the row")
    assert (rows[0]["token_name"], rows[0]["role"], rows[0]["source"], rows[0]["written"]) == (
        "bootstrap", "admin", "bootstrap_file", True)


def adopt(store: SqliteStore, path: Path, rows: list[dict[str, Any]]) -> Any:
    return bootstrap_token.adopt(store, path, rows.append)


def test_a_token_in_the_file_is_adopted_once_and_never_again_after_revocation(tmp_path: Path) -> None:
    path = tmp_path / "secret" / "token"
    path.parent.mkdir()
    path.write_text(printed_token() + "\n")
    rows: list[dict[str, Any]] = []
    with SqliteStore(tmp_path / "state.db") as store:
        rec = adopt(store, path, rows)
        assert rec is not None and rec.role == "admin" and rows[0]["written"] is False
        assert adopt(store, path, rows) is None  # a usable token exists: the file is ignored
        store.update_token("bootstrap", revoked=True)
        assert adopt(store, path, rows) is None, "a revoked bootstrap token came back"
        assert len(rows) == 1 and not [r for r in store.list_tokens() if r.usable(time.time())]


def test_the_file_is_ignored_while_a_usable_token_exists(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "state.db") as store:
        create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
        assert adopt(store, tmp_path / "absent", []) is None
    assert not (tmp_path / "absent").exists()


def test_a_file_that_is_not_a_token_stops_serve_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("changeme\n")
    with SqliteStore(tmp_path / "state.db") as store, pytest.raises(ConfigError) as caught:
        adopt(store, path, [])
    assert "gateway bootstrap-token" in caught.value.message and "changeme" not in caught.value.message

