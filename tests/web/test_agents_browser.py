"""The Agents view: after real calls by two agents through the gateway (MCP over HTTPS, simulated vCenters
behind it), headless Chromium shows one row per caller with its counts and a chart, at 1280 px and at
360 px; clicking a caller filters the Audit tab; a person whose role covers one target sees only that
target's callers. The API under it (``/ui/api/agents``) on both engines: the file log and PostgreSQL,
where another replica's rows count too.

Screenshots go to test-artifacts/web/ and to /tmp/agents-view/ (for a person to look at)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from playwright.sync_api import Browser, Page, expect
from support.browser import ARTIFACTS
from support.httpserver import FAST_HASH
from support.simulator import closed_port, credential_prefix
from support.webserver import WebServer, mcp_call, web_server

from gateway.audit.pg_sink import PgAuditSink
from gateway.auth.tokens import create_token
from gateway.server.runtime import Gateway
from gateway.settings import Settings
from gateway.store.postgres import PostgresStore
from gateway.vocabulary import Kind
from gateway.web.app import build_web_app

SHOTS = Path("/tmp/agents-view")
#: (agent, tool, arguments) of the calls made before the page is opened: three by ``agent`` on prod-vc
#: (one refused: no such target) and two by ``adam`` on lab-vc
CALLS = [
    ("agent", "list_vms", {"target": "prod-vc"}),
    ("agent", "list_vms", {"target": "prod-vc"}),
    ("agent", "list_vms", {"target": "nowhere"}),
    ("adam", "list_hosts", {"target": "lab-vc"}),
    ("adam", "list_vms", {"target": "lab-vc"}),
]


def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn, *args).result(timeout=120)


@pytest.fixture(scope="module")
def served(vcsim_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(tmp_path_factory.mktemp("agents-browser"), vcsim_bin) as running:
        for who, tool, args in CALLS:
            run_async(mcp_call, running, who, tool, args)
        yield running


def page_for(browser: Browser, served: WebServer, who: str, width: int, problems: list[str]) -> Page:
    context = browser.new_context(base_url=served.origin, ignore_https_errors=True,
                                  viewport={"width": width, "height": 900})
    page = context.new_page()
    page.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text
            or "Refused to" in m.text else None)
    page.goto("/ui/")
    page.fill("#token", served.tokens[who])
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#who-name")).to_have_text(who)
    page.click('#tabs a[data-tab="agents"]')
    return page


def shot(page: Page, name: str) -> Path:
    SHOTS.mkdir(exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    return path


def agent_row(page: Page, caller: str) -> Any:
    return page.locator(f'#agents-body tr[data-caller="{caller}"]')


def cell(row: Any, title: str) -> Any:
    return row.locator(f'td[data-label="{title}"]')


@pytest.mark.parametrize("width", [1280, 360])
def test_the_agents_view_lists_both_agents_with_their_counts_and_a_chart(
    browser: Browser, served: WebServer, width: int,
) -> None:
    problems: list[str] = []
    page = page_for(browser, served, "alice", width, problems)
    agent, adam = agent_row(page, "agent"), agent_row(page, "adam")
    expect(agent).to_have_count(1)
    expect(adam).to_have_count(1)
    expect(cell(agent, "Calls")).to_have_text("3")
    expect(cell(adam, "Calls")).to_have_text("2")
    expect(cell(agent, "Refused")).to_have_text("not_found 1")
    expect(cell(adam, "Refused")).to_have_text("0")
    expect(cell(agent, "Last call").locator("time")).to_have_attribute("datetime", re.compile(r"^\d{4}-"))
    # the chart: 96 quarter-hours of the last 24 hours, drawn as an inline SVG by the page's script
    chart = agent.locator("svg.chart")
    expect(chart).to_have_attribute("data-points", "96")
    expect(chart).to_have_attribute("aria-label", "3 calls by agent, per 15 min; at most 3 in one")
    assert chart.bounding_box()["width"] > 40  # type: ignore[index]
    page.click('#agents-windows button[data-window="1h"]')
    expect(agent.locator("svg.chart")).to_have_attribute("data-points", "60")
    expect(cell(agent, "Calls")).to_have_text("3")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"the page scrolls sideways at {width} px ({scroll} px wide)"
    shot(page, f"agents-{width}")
    assert problems == []


def test_clicking_a_caller_filters_the_audit_tab(browser: Browser, served: WebServer) -> None:
    problems: list[str] = []
    page = page_for(browser, served, "alice", 1280, problems)
    agent_row(page, "adam").locator("button.caller-link").click()
    expect(page).to_have_url(f"{served.origin}/ui/#audit")
    expect(page.locator('#audit-filters input[name="caller"]')).to_have_value("adam")
    callers = page.locator('#audit-body td[data-label="Caller"]')
    expect(callers).to_have_count(2)
    expect(callers).to_have_text(["adam", "adam"])
    assert problems == []


def test_a_person_whose_role_covers_one_target_sees_only_its_callers(
    browser: Browser, served: WebServer,
) -> None:
    problems: list[str] = []
    page = page_for(browser, served, "lara", 360, problems)  # lab-approver: lab-* only
    expect(agent_row(page, "adam")).to_have_count(1)
    expect(cell(agent_row(page, "adam"), "Calls")).to_have_text("2")
    expect(page.locator("#agents-body tbody tr")).to_have_count(1)
    expect(agent_row(page, "agent")).to_have_count(0)
    shot(page, "agents-lab-only-360")
    assert problems == []


# ---------------------------------------------------------------------------- the API on both engines


ROLES = """\
roles:
  lab-approver:
    tools: read
    allow_write: []
    allow_destructive: []
    targets: ["lab-*"]
    approve: any
    audit: all
"""


def engine_gateway(tmp: Path, database_url: str | None) -> Gateway:
    entries, env = [], {}
    for name in ("prod-vc", "lab-vc"):
        prefix = credential_prefix(name)
        entries.append({"name": name, "host": "127.0.0.1", "port": closed_port(), "insecure": True,
                        "credential_env_prefix": prefix})
        env.update({f"{prefix}_USER": "nobody", f"{prefix}_PASSWORD": "nothing"})
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"targets": entries}))
    roles = tmp / "roles.yaml"
    roles.write_text(ROLES)
    roles.chmod(0o600)
    if database_url is not None:
        env["GATEWAY_DATABASE_URL"] = database_url
    settings = Settings.from_env(env, home=str(tmp / "home"), targets=str(tmp / "targets.yaml"),
                                 roles=str(roles), web_ui=True)
    return Gateway.build(settings)


def call_row(who: str, key: str, target: str, **fields: Any) -> dict[str, Any]:
    return {"phase": "call", "tool": "list_vms", "target": target, "caller": who, "caller_key": key,
            "kind": "agent", "surface": "https", "outcome": "ok", **fields}


async def agents_of(gateway: Gateway, token: str, window: str = "1h") -> dict[str, Any]:
    app = build_web_app(gateway)
    origin = "https://testserver"
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=origin) as client:
        signed = await client.post("/api/sign-in", json={"token": token}, headers={"Origin": origin})
        assert signed.status_code == 200, signed.text
        response = await client.get(f"/api/agents?window={window}")
        assert response.status_code == 200, response.text
        refused = await client.get("/api/agents?window=2h")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_argument"
        body: dict[str, Any] = response.json()
        return body


@pytest.mark.parametrize("engine", ["file", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_api_counts_the_rows_a_role_may_read_on_each_engine(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    # in a thread of its own: Playwright's sync API may hold this thread's event loop (the module's browser)
    url = request.getfixturevalue("pg_url") if engine == "postgres" else None
    run_async(api_scenario, tmp_path, url)


async def api_scenario(tmp_path: Path, url: str | None) -> None:
    gateway = engine_gateway(tmp_path, url)
    try:
        now = time.time()
        tokens = {name: create_token(gateway.store, name, role, expires_in=None, now=now, hasher=FAST_HASH,
                                     kind=Kind.PERSON)[0]
                  for name, role in (("alice", "admin"), ("lara", "lab-approver"))}
        trail = gateway.trail
        trail.write_row(call_row("agent-a", "token:a", "prod-vc", queue_wait_ms=4.0))
        trail.write_row(call_row("agent-a", "token:a", "prod-vc", phase="denied", error_code="rate_limited"))
        trail.write_row(call_row("agent-b", "token:b", "lab-vc", queue_wait_ms=12.0))
        first = await agents_of(gateway, tokens["alice"])
        assert {e["caller"]: e["calls"] for e in first["callers"]} == {"agent-a": 2, "agent-b": 1}
        if url is not None:  # another replica appends to the same table: its rows count on the next view
            with PostgresStore(url) as replica_store, PgAuditSink(replica_store) as replica:
                replica.write(call_row("agent-b", "token:b", "lab-vc", phase="busy", count=4, tool=None))
                replica.write(call_row("agent-b", "token:b", "lab-vc"))
        else:
            trail.write_row(call_row("agent-b", "token:b", "lab-vc", phase="busy", count=4, tool=None))
            trail.write_row(call_row("agent-b", "token:b", "lab-vc"))
        everyone = {e["caller"]: e for e in (await agents_of(gateway, tokens["alice"]))["callers"]}
        a, b = everyone["agent-a"], everyone["agent-b"]
        assert (a["calls"], a["rate_limited"], a["refusals"], a["targets"]) == (
            2, 1, {"rate_limited": 1}, ["prod-vc"])
        assert (b["calls"], b["busy"], b["queued"]) == (6, 4, 1)
        assert 12.0 <= b["queue_wait_p50_ms"] <= 14.0
        assert len(b["series"]) == 60 and b["series"][-1] + b["series"][-2] == 6
        lab = (await agents_of(gateway, tokens["lara"], "7d"))["callers"]
        assert [e["caller"] for e in lab] == ["agent-b"]  # lara's role covers lab-* only
        assert len(lab[0]["series"]) == 168
    finally:
        await gateway.close()
