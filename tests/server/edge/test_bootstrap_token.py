"""GATEWAY_BOOTSTRAP_TOKEN_FILE: the first token of a fresh state (gateway/server/edge/bootstrap_token.py),
for a container volume or a pod where no shell runs ``gateway token create`` first."""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.httpserver import FAST_HASH, GATEWAY_MAIN, https_argv, run_serve
from support.simulator import Simulator, wait_until, write_targets

from gateway.audit.query import read_rows
from gateway.auth.tokens import create_token
from gateway.errors import ConfigError
from gateway.server.edge import bootstrap_token
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore

REPO = Path(__file__).resolve().parents[3]


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
    path.chmod(0o600)
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
    path.chmod(0o600)
    with SqliteStore(tmp_path / "state.db") as store, pytest.raises(ConfigError) as caught:
        adopt(store, path, [])
    assert "gateway bootstrap-token" in caught.value.message and "changeme" not in caught.value.message



def test_a_kubernetes_style_link_to_an_owner_only_file_is_adopted(tmp_path: Path) -> None:
    """A Secret mounts as links (token -> ..data/token -> ..2026_x/token): followed to a 0600 file."""
    data = tmp_path / "..2026_x"
    data.mkdir()
    (data / "token").write_text(printed_token() + "\n")
    (data / "token").chmod(0o400)
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "token").symlink_to("..data/token")
    rows: list[dict[str, Any]] = []
    with SqliteStore(tmp_path / "state.db") as store:
        rec = adopt(store, tmp_path / "token", rows)
    assert rec is not None and rows[0]["written"] is False


def _unsafe(kind: str, path: Path) -> str:
    """Make ``path`` the unsafe file ``kind``; the words the refusal's line must hold."""
    if kind == "dangling_link":
        path.symlink_to(path.parent / "gone")
        return "symbolic link to nothing"
    if kind == "link_loop":
        path.symlink_to(path.parent / "other")
        (path.parent / "other").symlink_to(path)
        return "loop of symbolic links"
    if kind == "mode_0644_admin_token":
        path.write_text(printed_token() + "\n")
        path.chmod(0o644)
        return "chmod 600"
    assert kind == "directory"
    path.mkdir(mode=0o700)
    return "not a regular file"


@pytest.mark.parametrize("kind", ["dangling_link", "link_loop", "mode_0644_admin_token", "directory"])
def test_an_unsafe_bootstrap_file_stops_serve_with_one_line(sim_vc1: Simulator, tmp_path: Path,
                                                            kind: str) -> None:
    """The real `gateway serve`: exit 1, one line naming the file and the fix, no traceback, nothing
    adopted (a dangling link used to recurse into a RecursionError; a 0644 file was adopted silently)."""
    home = tmp_path / "home"
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    (tmp_path / "secret").mkdir()
    token_file = tmp_path / "secret" / "token"
    words = _unsafe(kind, token_file)
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "GATEWAY_BOOTSTRAP_TOKEN_FILE": str(token_file)})
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    command = run_serve(tmp_path, env, *https_argv(cert))
    try:
        wait_until(lambda: command.process.poll() is not None or
                   re.search(r"running on https://", command.output()), timeout=60,
                   what="gateway serve to stop or listen")
    finally:
        code = command.stop()
    output = command.output()
    assert code == 1, output
    assert "Traceback" not in output and "RecursionError" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("gateway: ")]
    assert len(errors) == 1, output[-3000:]
    assert str(token_file) in errors[0] and "fix:" in errors[0] and words in errors[0], errors[0]
    if kind == "mode_0644_admin_token":
        assert token_file.read_text().strip() not in output
    audit = home / "audit.jsonl"
    assert not audit.exists() or not read_rows(audit, phase="token_created"), "a token was adopted"
    assert os.path.lexists(token_file)  # nothing was written over it


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    """Owner-only means the gateway's own user: a 0600 file someone else owns is not trusted."""
    if os.geteuid() != 0:
        pytest.skip("only root can make a file owned by another user here")
    path = tmp_path / "token"
    path.write_text(printed_token() + "\n")
    path.chmod(0o600)
    os.chown(path, 12345, 12345)
    with SqliteStore(tmp_path / "state.db") as store, pytest.raises(ConfigError) as caught:
        adopt(store, path, [])
    assert "belongs to uid 12345" in caught.value.message and "chown" in caught.value.message
