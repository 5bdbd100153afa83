"""What any MCP tool call over HTTPS costs on this machine: a tool that does nothing, on the bare MCP SDK.

    python bench/mcp_floor.py [--calls 300]

The server is the SDK's own ``MCPServer`` with one tool, ``noop``, served by uvicorn over TLS in a child
process (as the gateway is), called by the SDK's client with its default settings. Its p50 is the part
of a gateway call's time that is the protocol, the TLS and the two SDKs, not the gateway:
``bench/run_all.py`` prints it beside get_vm_details (section 2).
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
from collections.abc import AsyncIterator
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH), str(BENCH.parent / "tests")]

import httpx2  # noqa: E402
import mirror as mirror_bench  # noqa: E402  (its free_port and stop_process)
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from support.simulator import wait_until  # type: ignore[import-not-found]  # noqa: E402

from gateway.server.edge.tls import create_certificate  # noqa: E402

SERVER = """
import logging
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

logging.disable(logging.INFO)
server = MCPServer("noop")


@server.tool()
def noop() -> str:
    return "{}"


uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            ssl_certfile=sys.argv[2], ssl_keyfile=sys.argv[3])
"""


def serve(stack: contextlib.ExitStack, tmp: Path) -> tuple[str, Path]:
    """Start the no-op server (stopped by ``stack``); its MCP URL and the certificate to trust."""
    cert = create_certificate(tmp / "tls", ["localhost"], ["127.0.0.1"]).cert
    port = mirror_bench.free_port()
    argv = [sys.executable, "-c", SERVER, str(port), str(cert), str(cert.with_name("key.pem"))]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    stack.callback(mirror_bench.stop_process, process)
    url = f"https://localhost:{port}/mcp"
    context = ssl.create_default_context(cafile=str(cert))

    def listening() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the no-op MCP server exited with {process.returncode}")
        with contextlib.suppress(OSError, httpx2.TransportError), httpx2.Client(verify=context) as http:
            http.get(url)
            return True
        return False

    wait_until(listening, timeout=60, interval=0.1, what=url)
    return url, cert


@contextlib.asynccontextmanager
async def client(url: str, cert: Path) -> AsyncIterator[Client]:
    """An SDK client (default settings) of the no-op server at ``url``."""
    http = httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(cert)), timeout=60)
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as session:
        yield session


async def p50(url: str, cert: Path, calls: int) -> float:
    async with client(url, cert) as session:
        for _ in range(20):
            await session.call_tool("noop", {})
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            await session.call_tool("noop", {})
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-mcp-floor-")))
        url, cert = serve(stack, tmp)
        seconds = asyncio.run(p50(url, cert, args.calls))
    print(f"a tool doing nothing, bare MCP SDK over HTTPS: p50 {seconds * 1000:.2f} ms "
          f"over {args.calls} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
