"""The lab suite's MCP client: it calls a tool only when the gateway annotates it read-only, so a write
can never be sent to a lab vCenter, whatever a test asks."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import Command


class WriteRefused(AssertionError):
    """A lab test asked for a tool that is not read-only: the suite never sends it."""


@dataclass
class Lab:
    base: str
    cafile: Path
    token: str
    targets: list[str]
    env: dict[str, str]
    command: Command
    _read_only: dict[str, bool] = field(default_factory=dict)

    def _client(self, http: httpx2.AsyncClient) -> Client:
        return Client(streamable_http_client(f"{self.base}/mcp", http_client=http), mode="2026-07-28")

    def _http(self) -> httpx2.AsyncClient:
        verify = ssl.create_default_context(cafile=str(self.cafile))
        return httpx2.AsyncClient(base_url=self.base, verify=verify,
                                  headers={"Authorization": f"Bearer {self.token}"}, timeout=120)

    def tools(self) -> dict[str, bool]:
        """Every tool offered, by name: whether it is annotated read-only."""
        async def run() -> dict[str, bool]:
            async with self._http() as http, self._client(http) as client:
                listed = await client.list_tools()
            return {t.name: bool(t.annotations and t.annotations.read_only_hint) for t in listed.tools}

        if not self._read_only:
            self._read_only = anyio.run(run)
        return self._read_only

    def read(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """``tool``'s answer; ``WriteRefused`` (nothing sent) unless the gateway marks it read-only."""
        if not self.tools().get(tool):
            raise WriteRefused(f"the lab suite only reads: {tool!r} is not a read-only tool of this gateway")

        async def run() -> dict[str, Any]:
            async with self._http() as http, self._client(http) as client:
                result = await client.call_tool(tool, args)
            answer = answer_of(result)
            assert not result.is_error, answer
            return answer

        return anyio.run(run)
