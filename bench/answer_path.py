"""The answer path at the floor: the cheapest MCP call against a bare HTTPS JSON POST, and list_vms from
the mirror against the raw sweep, on both protocol revisions.

    python bench/answer_path.py [--calls 300] [--rounds 5] [--scale 3000,30000] [--runs 7] [--no-mirror]
                                [--no-calls] [--before REF]

Calls (one run, side by side, rounds interleaved with the order rotating, ``--calls`` sequential calls
per column per round, p50 of every sample): a bare HTTPS JSON POST (uvicorn and starlette returning a
small JSON body; the same TLS certificate, the same ``httpx2`` client the SDK uses, one kept-alive
connection), the MCP SDK's own no-op tool (``bench/mcp_floor.py``'s server) on the 2026-07-28 revision
(the SDK client's default ``mode="auto"``: ``server/discover``, then one POST per call) and on the legacy
handshake (``mode="legacy"``: ``initialize``, a session, the event-stream framing), and the gateway's
cheapest call, ``list_pending_actions`` with no proposal pending, on both. Ratios to the bare POST.
Beside them, the floor of the client: the SDK's client against a canned answer (``CANNED_SERVER``, no
server work at all), its own share of any MCP call.

list_vms from the mirror (per size of ``--scale``; its own simulator and ``gateway serve --transport
https``, as in ``bench/mirror.py``): the raw RetrievePropertiesEx floor (the gateway's request over the
session's kept view, the reply's bytes read and not decoded) against list_vms over HTTPS from a synced
mirror, fresh (the zero-wait poll first) and with ``max_staleness_seconds`` (no poll), on both
revisions; the simulator collects its garbage before each timed call (untimed).

With ``--before REF`` every gateway column is measured twice in the same rounds: on a server running
this checkout and on one running the package as it was at ``REF`` (``git archive``, as bench/sweep.py
does), so a change's before and after come from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH), str(REPO / "tests")]

import httpx2  # noqa: E402
import mcp_floor  # noqa: E402
import mirror as mirror_bench  # noqa: E402
import sweep as sweep_bench  # noqa: E402  (its checkout of an older package)
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from support.simulator import build_simulator, start_simulator, wait_until  # type: ignore[import-not-found]  # noqa: E402

from gateway.config import Credentials, Target  # noqa: E402
from gateway.vsphere.pool import SessionPool  # noqa: E402

#: the modes the SDK's client is given: its default (discover, then 2026-07-28) and the old handshake
REVISIONS = {"2026-07-28": "auto", "legacy": "legacy"}

BARE_SERVER = """
import logging
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

logging.disable(logging.INFO)


async def rpc(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"),
                         "result": {"content": [{"type": "text", "text": "{}"}]}})


app = Starlette(routes=[Route("/rpc", rpc, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            ssl_certfile=sys.argv[2], ssl_keyfile=sys.argv[3])
"""


#: an MCP server with no server in it: a raw ASGI app answering the three requests the SDK's client
#: sends on 2026-07-28 (discover, the call, one tools/list for the output schema) with fixed bytes, so
#: the column measures the client's own share (its SDK, TLS, HTTP) of any MCP call
CANNED_SERVER = """
import json
import logging
import sys

import uvicorn

logging.disable(logging.INFO)
META = {"io.modelcontextprotocol/serverInfo": {"name": "canned", "version": ""}}
RESULTS = {
    "server/discover": {"cacheScope": "private", "capabilities": {"tools": {}}, "resultType": "complete",
                        "supportedVersions": ["2026-07-28"], "ttlMs": 0, "_meta": META},
    "tools/list": {"cacheScope": "private", "resultType": "complete", "ttlMs": 0, "_meta": META,
                   "tools": [{"name": "noop", "description": "", "inputSchema": {"type": "object"}}]},
    "tools/call": {"content": [{"type": "text", "text": "{}"}], "isError": False, "resultType": "complete",
                   "_meta": META},
}
if len(sys.argv) > 4:  # tools/call's text from this file (a listing's bytes), else "{}"
    RESULTS["tools/call"]["content"][0]["text"] = open(sys.argv[4], encoding="utf-8").read()
ENCODED = {method: json.dumps(result, separators=(",", ":")).encode() for method, result in RESULTS.items()}
HEADERS = [(b"content-type", b"application/json")]


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body) if body else {}
    if "id" not in request:
        await send({"type": "http.response.start", "status": 202 if body else 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": b"{}" if not body else b""})
        return
    out = b'{"jsonrpc":"2.0","id":%s,"result":%s}' % (json.dumps(request["id"]).encode(),
                                                     ENCODED[request["method"]])
    await send({"type": "http.response.start", "status": 200,
                "headers": [*HEADERS, (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            ssl_certfile=sys.argv[2], ssl_keyfile=sys.argv[3])
"""


def serve_bare(stack: contextlib.ExitStack, cert: Path, server: str = BARE_SERVER, path: str = "/rpc",
               *more: str) -> str:
    """Start the bare JSON server (or ``server``, another script of the same arguments, then ``more``)
    with ``cert`` (stopped by ``stack``); its URL."""
    port = mirror_bench.free_port()
    argv = [sys.executable, "-c", server, str(port), str(cert), str(cert.with_name("key.pem")), *more]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    stack.callback(mirror_bench.stop_process, process)
    url = f"https://localhost:{port}{path}"
    context = ssl.create_default_context(cafile=str(cert))

    def listening() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the bare JSON server exited with {process.returncode}")
        with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=context) as http:
            return http.post(url, json={"id": 0, "method": "tools/call"}).status_code == 200
        return False

    wait_until(listening, timeout=60, interval=0.1, what=url)
    return url


@contextlib.asynccontextmanager
async def mcp_client(url: str, cert: Path, mode: str, token: str | None = None) -> AsyncIterator[Client]:
    """The SDK's client with its default settings in ``mode``, with a bearer token when given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, verify=ssl.create_default_context(cafile=str(cert)),
                              timeout=600)
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


Column = Callable[[], Awaitable[None]]


async def rounds(columns: dict[str, Column], calls: int, count: int) -> dict[str, list[float]]:
    """Seconds per call of each column: ``count`` rounds of ``calls`` sequential calls per column, the
    order rotating; 20 untimed calls of each first."""
    names = list(columns)
    for name in names:
        for _ in range(20):
            await columns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(count):
        for name in names[index % len(names):] + names[:index % len(names)]:
            call = columns[name]
            for _ in range(calls):
                started = time.perf_counter()
                await call()
                samples[name].append(time.perf_counter() - started)
    return samples


def _checked(result: Any, what: str) -> None:
    if result.is_error:
        raise SystemExit(f"{what} failed: {result.content}")


async def call_samples(bare: str, noop: str, gateways: dict[str, mirror_bench.Served], cert: Path,
                       calls: int, count: int,
                       canned: str | None = None) -> tuple[dict[str, list[float]], dict[str, str]]:
    """The call columns' samples, and the protocol version each MCP column spoke."""
    spoken: dict[str, str] = {}
    verify = ssl.create_default_context(cafile=str(cert))
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx2.AsyncClient(verify=verify, timeout=60))
        ids = iter(range(1, 1 << 62))

        async def post() -> None:
            answer = await http.post(bare, json={"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                                                 "params": {"name": "noop", "arguments": {}}})
            answer.json()

        columns: dict[str, Column] = {"bare": post}
        if canned is not None:
            client = await stack.enter_async_context(mcp_client(canned, cert, "auto"))
            spoken["canned"] = client.protocol_version

            async def canned_call(client: Client = client) -> None:
                _checked(await client.call_tool("noop", {}), "the canned answer")

            columns["canned"] = canned_call
        for revision, mode in REVISIONS.items():
            sdk = await stack.enter_async_context(mcp_client(noop, cert, mode))
            spoken[f"noop {revision}"] = sdk.protocol_version

            async def noop_call(sdk: Client = sdk, revision: str = revision) -> None:
                _checked(await sdk.call_tool("noop", {}), f"noop ({revision})")

            columns[f"noop {revision}"] = noop_call
            for which, served in gateways.items():
                gateway = await stack.enter_async_context(
                    mcp_client(f"https://localhost:{served.port}/mcp", served.cert, mode, served.token))
                name = f"gateway {revision}{which}"
                spoken[name] = gateway.protocol_version

                async def pending(gateway: Client = gateway, name: str = name) -> None:
                    _checked(await gateway.call_tool("list_pending_actions", {}), name)

                columns[name] = pending
        try:
            return await rounds(columns, calls, count), spoken
        except Exception as exc:  # say which call failed: the clients' task groups would bury it
            print(f"a call failed: {exc!r}", file=sys.stderr, flush=True)
            raise


#: the proposal tools (list_pending_actions among them) are offered with the destructive ones
PROPOSALS_ON = {"GATEWAY_ENABLE_DESTRUCTIVE": "1"}


def servers(stack: contextlib.ExitStack, tmp: Path, sim: Any, ports: dict[str, int],
            before: str | None) -> dict[str, mirror_bench.Served]:
    """``gateway serve`` of this checkout (``""``) and, with ``before``, of that commit (``" before"``)."""
    (tmp / "now").mkdir(parents=True)
    out = {"": mirror_bench.serve(stack, tmp / "now", sim, ports, extra_env=PROPOSALS_ON)}
    if before is not None:
        (tmp / "before-tree").mkdir()
        given = Path(before)
        tree = given if (given / "gateway").is_dir() else sweep_bench.checkout(before, tmp / "before-tree")
        (tmp / "before").mkdir()
        out[" before"] = mirror_bench.serve(stack, tmp / "before", sim, ports, repo=tree,
                                            extra_env=PROPOSALS_ON)
    return out


def call_rows(calls: int, count: int, before: str | None = None) -> list[tuple[str, str, str]]:
    """The call rows: p50 of each column and its ratio to the bare POST."""
    logging.disable(logging.INFO)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-answer-path-")))
        noop, cert = mcp_floor.serve(stack, tmp)
        bare = serve_bare(stack, cert)
        canned = serve_bare(stack, cert, CANNED_SERVER, "/mcp")
        sim = start_simulator(binary=build_simulator(), vms=2)
        stack.callback(sim.stop)
        gateways = servers(stack, tmp / "gateway", sim, {"sweep": sim.port}, before)
        samples, spoken = asyncio.run(call_samples(bare, noop, gateways, cert, calls, count, canned))
    p50 = {name: statistics.median(values) for name, values in samples.items()}
    n = len(samples["bare"])
    out = [(f"answer path: bare HTTPS JSON POST (uvicorn + starlette, same TLS), p50 of {n}",
            f"{p50['bare'] * 1000:.2f} ms", "1.00x"),
           (f"answer path: the MCP SDK's client alone, 2026-07-28 (a canned answer, no server work; spoke "
            f"{spoken['canned']})", f"{p50['canned'] * 1000:.2f} ms", f"{p50['canned'] / p50['bare']:.2f}x")]
    cheapest = "the gateway's cheapest call (list_pending_actions)"
    for name in sorted(p50, key=lambda n: (n.startswith("gateway"), "legacy" in n, "before" not in n)):
        if name in ("bare", "canned"):
            continue
        what = cheapest if name.startswith("gateway") else "the MCP SDK's own no-op tool"
        label = "legacy handshake" if "legacy" in name else "2026-07-28 revision"
        when = f", before ({before})" if name.endswith(" before") else ""
        target = " (target <= 2.0x)" if name == "gateway 2026-07-28" else ""
        out.append((f"answer path: {what}, {label}{when} (spoke {spoken[name]}){target}",
                    f"{p50[name] * 1000:.2f} ms", f"{p50[name] / p50['bare']:.2f}x"))
    return out


# ------------------------------------------------------------------------------------------- list_vms


async def list_vms(client: Client, target: str) -> float:
    started = time.perf_counter()
    result = await client.call_tool("list_vms", {"target": target})
    elapsed = time.perf_counter() - started
    _checked(result, f"list_vms on {target}")
    return elapsed


def mirror_medians(size: int, runs: int, before: str | None = None) -> tuple[int, dict[str, float]]:
    """(raw reply bytes, median seconds per column) at ``size`` VMs."""
    with contextlib.ExitStack() as outer:
        tmp = Path(outer.enter_context(tempfile.TemporaryDirectory(prefix="bench-answer-mirror-")))
        started = time.perf_counter()
        sim = start_simulator(binary=build_simulator(), hosts_per_cluster=3, standalone_hosts=1,
                              vms=max(1, size // 2), startup_timeout=3600)
        outer.callback(sim.stop)
        print(f"{size} VMs: simulator up in {time.perf_counter() - started:.0f}s", flush=True)
        gateways = servers(outer, tmp, sim, {"mirror": sim.port, "stale": sim.port}, before)
        target = Target(name="floor", host=sim.host, port=sim.port, insecure=True, timeout_seconds=600,
                        credential_env_prefix="FLOOR")
        pool = SessionPool(target, Credentials(sim.user, sim.password))
        outer.callback(pool.close)
        reply_bytes = pool.run(lambda s: mirror_bench._with_view(s, mirror_bench.raw_floor))
        sync_timeout = 60 + size / 20

        async def medians() -> dict[str, float]:
            async with contextlib.AsyncExitStack() as stack:
                clients = {f"{revision}{which}": await stack.enter_async_context(
                    mcp_client(f"https://localhost:{served.port}/mcp", served.cert, mode, served.token))
                    for revision, mode in REVISIONS.items() for which, served in gateways.items()}
                for which, served in gateways.items():
                    for name in ("mirror", "stale"):
                        await list_vms(clients[f"legacy{which}"], name)  # swept: starts the mirror
                        await asyncio.to_thread(served.wait_synced, name, sync_timeout)

                def over_https(revision: str, name: str) -> Callable[[], float]:
                    client = clients[revision]
                    return lambda: asyncio.run_coroutine_threadsafe(list_vms(client, name), loop).result()

                def raw() -> int:
                    return pool.run(lambda s: mirror_bench._with_view(s, mirror_bench.raw_floor))

                # the client's floor for this answer: the same bytes from a server that does nothing
                listing = await clients["2026-07-28"].call_tool("list_vms", {"target": "mirror"})
                _checked(listing, "list_vms on mirror")
                canned_url = await asyncio.to_thread(serve_canned, outer, tmp, gateways[""].cert,
                                                     listing.content[0].text)  # type: ignore[union-attr]
                canned = await stack.enter_async_context(mcp_client(canned_url, gateways[""].cert, "auto"))

                async def canned_call() -> float:
                    started = time.perf_counter()
                    _checked(await canned.call_tool("noop", {}), "the canned listing")
                    return time.perf_counter() - started

                columns: dict[str, Callable[[], Any]] = {
                    "raw floor": raw,
                    **{f"{name} {revision}": over_https(revision, name)
                       for revision in clients for name in ("mirror", "stale")},
                    "canned": lambda: asyncio.run_coroutine_threadsafe(canned_call(), loop).result(),
                }
                return await asyncio.to_thread(mirror_bench.interleaved, columns, runs,
                                               lambda: sim.control("/gc"))

        loop = asyncio.new_event_loop()
        try:
            return reply_bytes, loop.run_until_complete(medians())
        finally:
            loop.close()


def serve_canned(stack: contextlib.ExitStack, tmp: Path, cert: Path, text: str) -> str:
    """``CANNED_SERVER`` answering every tools/call with ``text`` (stopped by ``stack``); its URL."""
    (tmp / "canned.json").write_text(text, encoding="utf-8")
    return serve_bare(stack, cert, CANNED_SERVER, "/mcp", str(tmp / "canned.json"))


#: the targets of the issue: list_vms from the mirror at most this share of the raw sweep
TARGETS = {3000: 0.15, 30000: 0.07}


def mirror_rows(scale: list[int], runs: int, before: str | None = None) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for size in scale:
        try:
            reply_bytes, medians = mirror_medians(size, runs, before)
        except (SystemExit, TimeoutError, Exception) as exc:  # report what this machine allowed
            out.append((f"answer path, list_vms, {size:,} VMs: not measured on this machine",
                        type(exc).__name__, ""))
            continue
        label = f"answer path, list_vms, {size:,} VMs:"
        raw = medians["raw floor"]
        out.append((f"{label} raw RetrievePropertiesEx, bytes read only (floor, {reply_bytes / 1e6:.2f} MB "
                    "reply)", mirror_bench.ms(raw), "1.00x"))
        goal = f" (target <= {TARGETS[size]:.2f}x)" if size in TARGETS else ""
        for revision in [*REVISIONS, *(f"{r} before" for r in REVISIONS if before is not None)]:
            spoken = "legacy handshake" if "legacy" in revision else "2026-07-28 revision"
            when = f", before ({before})" if revision.endswith(" before") else ""
            for name, what in (("mirror", "from the mirror over HTTPS (fresh: zero-wait poll first)"),
                               ("stale", "from the mirror over HTTPS (max_staleness_seconds: no poll)")):
                value = medians[f"{name} {revision}"]
                out.append((f"{label} {what}, {spoken}{when}{goal if name == 'mirror' and not when else ''}",
                            mirror_bench.ms(value), f"{value / raw:.2f}x"))
        out.append((f"{label} the same answer's bytes to the SDK's client from a canned server (no server "
                    "work: the client's floor), 2026-07-28", mirror_bench.ms(medians["canned"]),
                    f"{medians['canned'] / raw:.2f}x"))
    return out


def run(calls: int, count: int, scale: list[int], runs: int,
        before: str | None = None) -> list[tuple[str, str, str]]:
    """Every row of this benchmark (``bench/run_all.py`` adds them to its table); ``calls`` 0: the
    list_vms rows alone."""
    return [*(call_rows(calls, count, before) if calls else []), *mirror_rows(scale, runs, before)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per column per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", default="3000,30000", help="VM counts of the list_vms rows")
    parser.add_argument("--runs", type=int, default=7, help="timed list_vms calls per column, median")
    parser.add_argument("--no-mirror", action="store_true", help="the call rows only")
    parser.add_argument("--no-calls", action="store_true", help="the list_vms rows only")
    parser.add_argument("--before", help="a git commit (or a folder holding a gateway package) measured "
                                         "beside this checkout")
    args = parser.parse_args(argv)
    scale = [] if args.no_mirror else [int(n) for n in args.scale.split(",") if n]
    table = run(0 if args.no_calls else args.calls, args.rounds, scale, args.runs, args.before)
    command = " ".join(argv or sys.argv[1:])
    print(f"\n{datetime.now():%Y-%m-%d %H:%M} `python bench/answer_path.py {command}`\n")
    print("| what | value | ratio |\n| --- | --- | --- |")
    for what, value, ratio in table:
        print(f"| {what} | {value} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
