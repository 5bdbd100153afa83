"""Processes share the SQLite state store safely: a real ``gateway serve`` over HTTPS answering MCP calls
while CLI processes (token create/list/revoke, pending list/approve, audit log) run beside it on the
same ``GATEWAY_HOME``. Nobody dies of a signal (SIGBUS was the symptom when a process opened and closed
SQLite's ``-wal``/``-shm`` files behind its back, dropping its own POSIX locks), and every answer is a
success or a documented one (a busy store, an unknown proposal).
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import FAST_HASH, GATEWAY_MAIN, REPO, https_argv, run_serve
from support.simulator import Simulator, write_targets

from gateway.auth.tokens import create_token
from gateway.server.edge.tls import create_certificate
from gateway.store import SqliteStore

pytestmark = pytest.mark.anyio

#: how long the server is kept busy (the CLI goes on past it until ``CLI_PROCESSES`` have run)
STRESS_SECONDS: Final = 25.0
#: CLI processes in all, and how many run at once
CLI_PROCESSES: Final = 50
CLI_AT_ONCE: Final = 10
#: MCP callers, each opening sessions and calling tools in a loop
MCP_CALLERS: Final = 4
#: a busy store is a documented answer (exit 1, code state_unavailable, "retry")
BUSY: Final = re.compile(r"^gateway: state_unavailable: the state store cannot .* right now; retry", re.M)
MADE_UP_PROPOSAL: Final = "p" * 12


#: the byte of ``-shm`` that SQLite's unix VFS keeps read-locked while a process uses the shared-memory
#: index (os_unix.c ``UNIX_SHM_DMS``); a process that can write-lock it rebuilds (truncates) the index
SHM_DMS_BYTE: Final = 128
_TRY_DMS: Final = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]))
except OSError:
    sys.exit(1)
"""


def index_free_for_another_process(db: Path) -> bool:
    """Whether another process could take ``db``'s shared-memory index as unused and rebuild it."""
    done = subprocess.run([sys.executable, "-c", _TRY_DMS, f"{db}-shm", str(SHM_DMS_BYTE)], timeout=60,
                          check=False)
    return done.returncode == 0


def test_opening_the_store_again_in_a_process_keeps_its_locks(tmp_path: Path) -> None:
    db = tmp_path / "home" / "state.db"
    with SqliteStore(db) as first:
        first.token_generation()
        assert not index_free_for_another_process(db), "opening the store dropped this process's locks"
        with SqliteStore(db) as second:  # the CLI and the server each do this; tests do it many times
            second.token_generation()
            assert not index_free_for_another_process(db), "opening the store dropped this process's locks"
        first.token_generation()


@dataclass(frozen=True)
class Ran:
    argv: tuple[str, ...]
    code: int
    stderr: str
    #: an unknown name or id is the documented answer (a made-up proposal; a token whose create was busy)
    may_be_missing: bool = False

    def problem(self) -> str | None:
        """Why this run is not a documented answer, or None."""
        if self.code < 0:
            return f"killed by signal {-self.code}"
        if "Traceback" in self.stderr or "Fatal Python error" in self.stderr:
            return "crashed"
        if self.code == 0 or BUSY.search(self.stderr):
            return None
        if self.may_be_missing and "gateway: not_found:" in self.stderr:
            return None
        return f"exit {self.code}"


def cli_argv(lane: int, turn: int) -> tuple[str, ...]:
    name = f"stress-{lane}-{turn // 6}"
    return [("token", "create", name, "--role", "reader"), ("token", "list"), ("pending", "list"),
            ("token", "revoke", name), ("audit", "log", "--last", "5"),
            ("pending", "approve", MADE_UP_PROPOSAL)][turn % 6]


async def test_a_server_and_50_cli_processes_share_one_home(sim_vc1: Simulator, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml")})
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "ops", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    server = run_serve(tmp_path, env, *https_argv(cert))
    child_env = {**env, "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", ""), "USER": "stress"}
    runs: list[Ran] = []
    answers: list[str] = []
    try:
        base = await anyio.to_thread.run_sync(server.base)
        until = time.monotonic() + STRESS_SECONDS

        def going() -> bool:
            return server.process.poll() is None and (time.monotonic() < until or len(runs) < CLI_PROCESSES)

        async def cli_lane(lane: int) -> None:
            turn = 0
            created: set[str] = set()
            while going():
                argv = cli_argv(lane, turn)
                turn += 1
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", GATEWAY_MAIN, *argv, cwd=REPO, env=child_env,
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE)
                _, err = await process.communicate()
                assert process.returncode is not None
                if argv[:2] == ("token", "create") and process.returncode == 0:
                    created.add(argv[2])
                missing = argv[:2] == ("pending", "approve") or (argv[:2] == ("token", "revoke")
                                                                 and argv[2] not in created)
                runs.append(Ran(argv, process.returncode, err.decode(errors="replace"), missing))

        async def mcp_caller() -> None:
            while going():
                http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                          verify=ssl.create_default_context(cafile=str(cert.cert)))
                transport = streamable_http_client(f"{base}/mcp", http_client=http)
                try:
                    async with http, Client(transport, mode="legacy") as client:
                        for tool, args in (("list_vms", {"target": "vc1"}),) * 3:
                            result = await client.call_tool(tool, args)
                            answers.append(answer_of(result).get("error", {}).get("code", "ok")
                                           if result.is_error else "ok")
                except Exception:
                    if server.process.poll() is None:
                        raise
                    answers.append("the server died")

        with anyio.fail_after(STRESS_SECONDS * 8):
            async with anyio.create_task_group() as tg:
                for lane in range(CLI_AT_ONCE):
                    tg.start_soon(cli_lane, lane)
                for _ in range(MCP_CALLERS):
                    tg.start_soon(mcp_caller)
        alive_at_end = server.process.poll() is None
    finally:
        code = server.stop()
    output = server.output()
    problems = [f"{' '.join(r.argv)}: {r.problem()}: {r.stderr[-400:]}" for r in runs if r.problem()]
    assert alive_at_end and code == 0, (f"gateway serve ended with {code} ({len(problems)} of {len(runs)} "
                                        f"CLI processes failed):\n{output[-3000:]}")
    assert "Bus error" not in output and "Fatal Python error" not in output
    assert not problems, f"{len(problems)} of {len(runs)} CLI processes failed:\n" + "\n".join(problems[:5])
    assert len(runs) >= CLI_PROCESSES
    assert answers and set(answers) <= {"ok", "state_unavailable"}, sorted(set(answers))
    assert answers.count("ok") >= len(answers) * 0.9, f"{answers.count('ok')} of {len(answers)} answered"
