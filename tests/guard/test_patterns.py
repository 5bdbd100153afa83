"""User-supplied regular expressions (list_vms ``regex``, get_events/get_tasks ``entity_name``,
bulk_vm_action ``name_regex``) run on a linear-time engine with a length bound: a pattern built to
backtrack forever finishes, and while it runs against the real HTTPS server /healthz keeps answering.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import FAST_HASH
from support.simulator import Simulator, wait_until, write_targets

from gateway.auth.tokens import create_token
from gateway.errors import InvalidArgument
from gateway.server.edge.tls import create_certificate
from gateway.store.sqlite import SqliteStore
from gateway.tools.read import parse_regex
from gateway.vsphere.actions.bulk import compile_name_regex

#: exponential for a backtracking engine on names like the simulator's (DC0_C0_RP0_VM0)
PATHOLOGICAL = "^DC(((.*)*)*)*x"
#: generous: a linear-time engine needs milliseconds; a backtracking one needs years
DEADLINE = 60.0
#: a probe of /healthz that takes longer means the process is frozen
PROBE_SECONDS = 15.0
REPO = Path(__file__).resolve().parents[2]


#: each site's compile, as source for a child process (a backtracking match holds the interpreter
#: lock, so only a separate process can be given a deadline)
READ = "from gateway.tools.read import parse_regex; "
SITES = {
    "regex": READ + "pattern = parse_regex('regex', PATTERN)",
    "entity_name": READ + "pattern = parse_regex('entity_name', PATTERN)",
    "name_regex": "from gateway.vsphere.actions.bulk import compile_name_regex as c; pattern = c(PATTERN)",
}
MATCH_ALL = """
PATTERN = {pattern!r}
{site}
names = [f"DC{{i % 7}}_C0_RP{{i % 3}}_VM{{i}}_{{'long-name-part' * 2}}" for i in range(20_000)]
print(sum(1 for name in names if pattern.search(name)))
"""


@pytest.mark.parametrize("field", SITES)
def test_a_pathological_pattern_over_many_names_finishes(field: str) -> None:
    code = MATCH_ALL.format(pattern=PATHOLOGICAL, site=SITES[field])
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                              timeout=DEADLINE, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{field}: matching {PATHOLOGICAL!r} over 20000 names did not finish in {DEADLINE}s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


@pytest.mark.parametrize("field, compile_", [
    ("regex", lambda p: parse_regex("regex", p)),
    ("entity_name", lambda p: parse_regex("entity_name", p)),
    ("name_regex", compile_name_regex),
])
@pytest.mark.parametrize("pattern, why", [
    ("web-(", "missing )"),
    ("(?<=a)b", "lookbehind"),
    ("(a)\\1", "backreference"),
    ("x" * 201, "at most 200 characters"),
])
def test_invalid_or_unbounded_patterns_name_the_parameter(
    field: str, compile_: Callable[[str], Any], pattern: str, why: str,
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        compile_(pattern)
    assert caught.value.code == "invalid_argument"
    assert caught.value.details["field"] == field
    assert caught.value.message.startswith(f"{field}: ")
    if why.startswith("at most"):
        assert why in caught.value.message


@pytest.mark.parametrize("pattern, name, search, whole", [
    ("web", "old-web-1", True, False),
    ("^web-\\d+$", "web-12", True, True),
    ("web-\\d+", "web-12x", True, False),
    ("(?i)WEB", "web", True, True),
    ("db", "web", False, False),
])
def test_matching_meaning_is_kept(pattern: str, name: str, search: bool, whole: bool) -> None:
    assert bool(parse_regex("regex", pattern).search(name)) is search  # type: ignore[union-attr]
    assert bool(compile_name_regex(pattern).fullmatch(name)) is whole


# ---------------------------------------------------------------------------- the real server


@pytest.fixture
def server(sim_vc1: Simulator, tmp_path: Path) -> Iterator[tuple[str, str, ssl.SSLContext]]:
    """``gateway serve`` over HTTPS in its own process (a frozen interpreter cannot hide the failure
    from the test), and a reader token: (base URL, token, TLS context)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp_path / "targets.yaml", {"vc1": sim_vc1})
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp_path / "targets.yaml"),
                "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "")})
    with SqliteStore(home / "state.db") as store:
        token, _ = create_token(store, "rita", "reader", expires_in=None, now=time.time(), hasher=FAST_HASH)
    cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
    log = tmp_path / "serve.log"
    argv = ["--transport", "https", "--cert", str(cert.cert), "--key", str(cert.key), "--public-name",
            "localhost", "--host", "127.0.0.1", "--port", "0"]
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", *argv], cwd=REPO, env=env,
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    try:
        found = wait_until(lambda: process.poll() is not None or
                           re.search(r"running on https://127\.0\.0\.1:(\d+)", log.read_text()),
                           timeout=60, what="gateway serve to listen")
        assert isinstance(found, re.Match), log.read_text()
        yield f"https://localhost:{found.group(1)}", token, ssl.create_default_context(cafile=str(cert.cert))
    finally:
        process.kill()  # this test's own child; a frozen one would not heed SIGTERM
        process.wait(30)


@pytest.mark.anyio
async def test_healthz_answers_while_a_pathological_list_vms_runs(
    server: tuple[str, str, ssl.SSLContext],
) -> None:
    base, token, tls = server
    results: dict[str, Any] = {}

    async def pathological() -> None:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=DEADLINE, verify=tls)
        transport = streamable_http_client(f"{base}/mcp", http_client=http)
        async with http, Client(transport, mode="legacy") as client:
            results["list"] = await client.call_tool("list_vms", {"target": "vc1", "regex": PATHOLOGICAL})

    probes = 0
    with anyio.fail_after(DEADLINE * 2):
        async with anyio.create_task_group() as group, httpx2.AsyncClient(verify=tls) as probe:
            group.start_soon(pathological)
            while "list" not in results:
                # each probe must answer within the deadline, for as long as the call runs
                health = await probe.get(f"{base}/healthz", timeout=PROBE_SECONDS)
                assert health.status_code == 200
                probes += 1
    assert probes >= 1
    answer = results["list"]
    assert not answer.is_error, answer.content
    assert "VM0" not in json.dumps(answer_of(answer))
