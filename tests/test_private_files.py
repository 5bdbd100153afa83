"""Files the gateway creates are 0600 and its directories 0700, whatever the umask and wherever they
live: the helpers in ``gateway.private_files``, each creation point in-process, and everything a real
``gateway serve`` (with the audit log outside ``GATEWAY_HOME``, rotated and checkpointed) and the CLI
(``gateway cert create``, ``gateway token create``) leave behind.
"""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.httpserver import GATEWAY_MAIN, REPO, https_argv, run_serve
from support.simulator import Simulator, write_targets

from gateway.audit.file_sink import AuditSink
from gateway.audit.signing import load_or_create_signing_key
from gateway.private_files import UnsafeFile, make_private_dirs, open_private, read_private, write_private
from gateway.server.edge.tls import CertificatePaths, create_certificate
from gateway.store.instance import Instance
from gateway.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: whatever is created here gets exactly the mode the code asked for."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_under(*roots: Path) -> dict[str, int]:
    """Every directory and file under ``roots`` (the roots included) -> its mode."""
    found = {}
    for root in roots:
        found[str(root)] = mode(root)
        for directory, dirs, files in os.walk(root):
            for name in dirs + files:
                found[os.path.join(directory, name)] = mode(Path(directory, name))
    return found


def not_private(found: dict[str, int], base: Path) -> list[str]:
    """``relative/path mode`` for each entry that is not 0700 (a directory) or 0600 (a file)."""
    return sorted(f"{os.path.relpath(path, base)} {m:o}" for path, m in found.items()
                  if m != (0o700 if Path(path).is_dir() else 0o600))


# ---------------------------------------------------------------------------- the helpers


def test_missing_parents_are_made_0700_and_existing_directories_kept(
    tmp_path: Path, open_umask: None,
) -> None:
    os.chmod(tmp_path, 0o755)
    make_private_dirs(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert mode(tmp_path) == 0o755, "a directory the gateway did not make keeps its mode"


def test_open_private_creates_0600_and_tightens_only_own_regular_files(
    tmp_path: Path, open_umask: None,
) -> None:
    os.close(open_private(tmp_path / "new", os.O_WRONLY))
    loose = tmp_path / "loose"
    loose.write_bytes(b"x")
    os.chmod(loose, 0o644)
    os.close(open_private(loose, os.O_RDONLY))
    devnull_before = mode(Path("/dev/null"))
    os.close(open_private(Path("/dev/null"), os.O_WRONLY))
    assert (mode(tmp_path / "new"), mode(loose)) == (0o600, 0o600)
    assert mode(Path("/dev/null")) == devnull_before, "a device is never chmod-ed"


def test_write_private_modes_and_replacing(tmp_path: Path, open_umask: None) -> None:
    write_private(tmp_path / "f", b"one")
    write_private(tmp_path / "script", b"#!/bin/sh\n", mode=0o700)
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "f", b"two", replace=False)
    os.chmod(tmp_path / "f", 0o666)
    write_private(tmp_path / "f", b"three")
    with pytest.raises(ValueError, match="owner-only"):
        write_private(tmp_path / "g", b"", mode=0o644)
    assert (tmp_path / "f").read_bytes() == b"three"
    assert (mode(tmp_path / "f"), mode(tmp_path / "script")) == (0o600, 0o700)
    assert not (tmp_path / "g").exists()


# ---------------------------------------------------------------------------- each creation point


def _secret_at(kind: str, path: Path) -> None:
    """Make ``path`` the thing ``kind`` names (for ``read_private``)."""
    if kind in ("file_0600", "file_0400", "file_0640", "file_0604", "too_big"):
        path.write_bytes(b"s" * (70_000 if kind == "too_big" else 6))
        path.chmod(0o600 if kind == "too_big" else int(kind[-4:], 8))
    elif kind == "link_to_0600":
        (path.parent / "real").write_bytes(b"secret")
        (path.parent / "real").chmod(0o600)
        path.symlink_to("real")
    elif kind == "dangling_link":
        path.symlink_to("nowhere")
    elif kind == "link_loop":
        path.symlink_to("loop")
        (path.parent / "loop").symlink_to(path.name)
    elif kind == "directory":
        path.mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        assert kind == "absent"


#: what ``read_private`` makes of each: the bytes, None, or the words of its UnsafeFile
READ_PRIVATE = {
    "absent": None,
    "file_0600": b"ssssss",
    "file_0400": b"ssssss",
    "link_to_0600": b"secret",
    "file_0640": "readable by others (mode 640); fix: chmod 600",
    "file_0604": "readable by others (mode 604)",
    "dangling_link": "symbolic link to nothing (it points to nowhere); fix:",
    "link_loop": "loop of symbolic links",
    "directory": "not a regular file; fix:",
    "fifo": "not a regular file",
    "too_big": "larger than 65536 bytes",
}


@pytest.mark.parametrize("kind", sorted(READ_PRIVATE))
def test_read_private_takes_only_an_owner_only_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "secret"
    _secret_at(kind, path)
    expected = READ_PRIVATE[kind]
    if not isinstance(expected, str):
        assert read_private(path, "THE_SECRET") == expected
        return
    with pytest.raises(UnsafeFile) as caught:
        read_private(path, "THE_SECRET")
    assert expected in str(caught.value) and f"THE_SECRET {path} " in str(caught.value)


def test_every_creation_point_in_process_makes_private_files(tmp_path: Path, open_umask: None) -> None:
    outside = tmp_path / "var" / "log" / "gateway" / "audit.jsonl"
    home = tmp_path / "srv" / "home"
    with SqliteStore(home / "state.db") as store:
        store.token_generation()
    instance = Instance(home)
    instance.acquire()
    lock_modes = modes_under(home / "instances")
    instance.close()
    with AuditSink(outside, max_bytes=600, key_file=home / "audit-signing.key") as sink:
        for i in range(12):
            sink.write({"phase": "test", "caller": "modes", "n": i, "pad": "p" * 100})
        sink.checkpoint()
    load_or_create_signing_key(tmp_path / "keys" / "other.key")
    create_certificate(tmp_path / "tls" / "made", ["localhost"])
    for made in ("audit.jsonl.1", "audit.jsonl.checkpoints", "audit.jsonl.lock"):
        assert (outside.parent / made).exists(), made
    assert len(lock_modes) == 2
    found = {**modes_under(tmp_path / "var", tmp_path / "srv", tmp_path / "keys", tmp_path / "tls"),
             **lock_modes}
    assert not not_private(found, tmp_path), not_private(found, tmp_path)


# ---------------------------------------------------------------------------- the real commands


def cli(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", GATEWAY_MAIN, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False, umask=0,
                          env={**env, "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    return done.stdout


async def list_vms_until(base: str, token: str, cafile: Path, rotated: Path) -> int:
    calls = 0
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60,
                              verify=ssl.create_default_context(cafile=str(cafile)))
    async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http), mode="legacy") as client:
        while not rotated.exists() and calls < 200:
            result = await client.call_tool("list_vms", {"target": "vc1"})
            assert not result.is_error, result.content
            calls += 1
    return calls


async def test_a_real_serve_and_the_cli_leave_only_private_files(sim_vc1: Simulator, tmp_path: Path) -> None:
    home = tmp_path / "missing" / "home"  # made by the gateway, parent included
    logs = tmp_path / "logs" / "gateway"  # the audit log outside GATEWAY_HOME, its folders missing
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "GATEWAY_AUDIT_LOG": str(logs / "audit.jsonl"), "GATEWAY_AUDIT_MAX_BYTES": "4096"})
    cli(env, "cert", "create", "--out", str(tmp_path / "tls"), "--name", "localhost", "--ip", "127.0.0.1")
    cert = CertificatePaths(cert=tmp_path / "tls" / "cert.pem", key=tmp_path / "tls" / "key.pem")
    token = cli(env, "token", "create", "ops", "--role", "admin").strip()
    server = run_serve(tmp_path, env, *https_argv(cert), umask=0)
    try:
        base = await anyio.to_thread.run_sync(server.base)
        calls = await list_vms_until(base, token, cert.cert, logs / "audit.jsonl.1")
    finally:
        code = server.stop()
    assert code == 0, server.output()
    assert (logs / "audit.jsonl.1").exists(), f"no rotation after {calls} calls"
    found = modes_under(tmp_path / "missing", tmp_path / "logs", tmp_path / "tls")
    made = {Path(p).name for p in found}
    assert {"state.db", "audit-signing.key", "audit.jsonl", "audit.jsonl.1", "audit.jsonl.lock",
            "audit.jsonl.checkpoints", "cert.pem", "key.pem"} <= made, sorted(made)
    assert not not_private(found, tmp_path), not_private(found, tmp_path)
