"""The approval page in a real browser: headless Chromium (Debian's package, never a downloaded one)
driven by Playwright, against the real gateway over HTTPS with simulated vCenters behind it, and an
agent speaking MCP. Each scenario saves screenshots to test-artifacts/web/.

The server and MCP helpers come from tests/support/webserver.py. Playwright's sync API owns this thread's
event loop while the browser is open, so the agent's (async) MCP calls run in a helper thread.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Dialog,
    Locator,
    Page,
    expect,
)
from support.browser import ARTIFACTS
from support.simulator import find_vm, pyvmomi_connect, wait_until
from support.webserver import WebServer, mcp_call, propose_delete, web_server

pytestmark = pytest.mark.browser

XSS = "<img src=x onerror=alert(1)>"
SLOW = 15_000  # ms: long enough for the expiry sweeper (2 s) plus the page's poll (2 s), with margin

def run_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Run the coroutine function ``fn(*args)`` to completion on a fresh loop in another thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn, *args).result(timeout=120)


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def served(vcsim_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(tmp_path_factory.mktemp("web-browser"), vcsim_bin) as running:
        yield running


class Watched:
    """A browser context whose pages record script errors, CSP violations and dialogs (alert())."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.problems: list[str] = []
        self.dialogs: list[str] = []

    def page(self) -> Page:
        page = self.context.new_page()
        page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        page.on("console", self._console)
        page.on("dialog", self._dialog)
        return page

    def _console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text or "Refused to" in message.text:
            self.problems.append(f"CSP: {message.text}")

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()


@pytest.fixture
def people(browser: Browser, served: WebServer) -> Iterator[Callable[[], Watched]]:
    """Factory of fresh browser contexts (one per person); each is checked for problems at the end."""
    opened: list[Watched] = []

    def open_context() -> Watched:
        context = browser.new_context(base_url=served.origin, ignore_https_errors=True,
                                      viewport={"width": 1280, "height": 900})
        watched = Watched(context)
        opened.append(watched)
        return watched

    yield open_context
    for watched in opened:
        watched.context.close()
    for watched in opened:
        assert watched.problems == [], watched.problems
        assert watched.dialogs == [], f"a script ran: {watched.dialogs}"


def sign_in(watched: Watched, served: WebServer, who: str) -> Page:
    page = watched.page()
    page.goto("/ui/")
    page.fill("#token", served.tokens[who])
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#who-name")).to_have_text(who)
    return page


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def pending_card(page: Page, proposal_id: str) -> Locator:
    return page.locator(f'#pending-list [data-proposal="{proposal_id}"]')


def decided_card(page: Page, proposal_id: str) -> Locator:
    return page.locator(f'#recent-list [data-proposal="{proposal_id}"]')


def forced_post(page: Page, proposal_id: str, action: str, *, csrf: bool) -> list[Any]:
    """POST from inside the signed-in page, with or without the CSRF token: [status, error body]."""
    return page.evaluate(  # type: ignore[no-any-return]
        """async ([pid, action, withCsrf]) => {
            const session = await (await fetch("api/session")).json();
            const headers = {"Content-Type": "application/json"};
            if (withCsrf) headers["X-CSRF-Token"] = session.csrf;
            const url = `api/proposals/${pid}/${action}`;
            const response = await fetch(url, {method: "POST", headers, body: "{}"});
            return [response.status, (await response.json()).error || null];
        }""", [proposal_id, action, csrf])


# ---------------------------------------------------------------------------- scenarios


def test_sign_in_page_refuses_a_bad_token_and_sign_out_ends_the_session(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    watched = people()
    page = watched.page()
    page.goto("/ui/")
    expect(page.locator("#view-sign-in")).to_be_visible()
    shot(page, "01-sign-in")
    page.fill("#token", "gwt_aaaaaaaaaaaa_" + "A" * 43)
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#sign-in-error")).to_contain_text("not valid")
    assert "token" not in page.url and "gwt_" not in page.url
    page = sign_in(watched, served, "alice")
    expect(page.locator("#who-role")).to_contain_text("admin")
    page.click("#sign-out")
    expect(page.locator("#view-sign-in")).to_be_visible()
    page.reload()
    expect(page.locator("#view-sign-in")).to_be_visible()
    assert watched.context.cookies() == [] or all(c["value"] == "" for c in watched.context.cookies())


def test_agent_proposes_a_delete_and_a_human_approves_it_in_the_browser(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    proposal = run_async(propose_delete, served, "agent", "prod-vc", "DC0_H0_VM0")
    pid = proposal["proposal_id"]
    assert proposal["requires_human_approval"] is True
    refused, answer = run_async(mcp_call, served, "agent", "confirm_action", {"token": proposal["token"]})
    assert refused and answer["error"]["code"] == "approval_required"

    page = sign_in(people(), served, "alice")
    card = pending_card(page, pid)
    expect(card.locator(".target-name")).to_have_text("prod-vc")
    address = served.gateway.targets["prod-vc"].address
    expect(card.locator(".target-host")).to_have_text(address)
    expect(card.locator(".badge")).to_have_text("Blocked until approved")
    expect(card.locator(".gate")).to_contain_text("agent cannot confirm it over MCP")
    expect(card.locator(".caller")).to_have_text("agent")
    expect(card.locator(".affected li")).to_contain_text(["vm DC0_H0_VM0"])
    expect(card.locator(".countdown")).to_contain_text("expires in")
    expect(page.locator("#pending-count")).to_have_text(re.compile(r"^[1-9][0-9]*$"))
    shot(page, "02-pending")

    card.locator("button.approve").click()
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".confirm-target .target-name")).to_have_text("prod-vc")
    expect(dialog.locator(".confirm-target .target-host")).to_have_text(address)
    expect(page.locator("#confirm-ok")).to_have_text("Approve and run on prod-vc")
    shot(page, "03-approve-dialog")
    page.click("#confirm-ok")

    expect(decided_card(page, pid)).to_have_attribute("data-state", "executed", timeout=SLOW)
    expect(decided_card(page, pid).locator(".outcome")).to_have_text("Approved by alice and executed")
    expect(pending_card(page, pid)).to_have_count(0)
    wait_until(lambda: "DC0_H0_VM0" not in served.sims["prod"].vm_names(), timeout=10, what="VM deleted")
    shot(page, "04-executed")
    approved = [(r["caller"], r["surface"]) for r in served.audit_rows()
                if r.get("proposal_id") == pid and r.get("phase") == "approved"]
    assert approved == [("alice", "web")]


def test_a_human_denies_a_proposal_that_is_not_gated(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    proposal = run_async(propose_delete, served, "agent", "lab-vc", "DC0_H0_VM0")
    pid = proposal["proposal_id"]
    page = sign_in(people(), served, "alice")
    card = pending_card(page, pid)
    expect(card.locator(".target-name")).to_have_text("lab-vc")
    expect(card.locator(".badge")).to_have_text("Not gated")
    expect(card.locator(".gate")).to_contain_text("agent may confirm it over MCP at any moment")
    card.locator("button.deny").click()
    expect(page.locator("#confirm-dialog .confirm-target .target-name")).to_have_text("lab-vc")
    expect(page.locator("#confirm-ok")).to_have_text("Deny on lab-vc")
    shot(page, "05-deny-dialog")
    page.click("#confirm-ok")
    expect(decided_card(page, pid)).to_have_attribute("data-state", "denied", timeout=SLOW)
    refused, answer = run_async(mcp_call, served, "agent", "confirm_action", {"token": proposal["token"]})
    assert refused and answer["error"]["code"] == "confirmation_invalid"
    assert "DC0_H0_VM0" in served.sims["lab"].vm_names()
    denied = [(r["caller"], r["surface"]) for r in served.audit_rows()
              if r.get("proposal_id") == pid and r.get("phase") == "denied"]
    # the human's denial, then the agent's refused confirm
    assert denied == [("alice", "web"), ("agent", "https")]


def test_an_expiry_appears_without_a_reload(people: Callable[[], Watched], served: WebServer) -> None:
    proposal = run_async(propose_delete, served, "agent", "prod-vc", "DC0_H0_VM1")
    pid = proposal["proposal_id"]
    page = sign_in(people(), served, "alice")
    expect(pending_card(page, pid)).to_be_visible()
    served.advance(served.gateway.settings.confirm_ttl_seconds + 5)
    expect(decided_card(page, pid)).to_have_attribute("data-state", "expired", timeout=SLOW)
    expect(decided_card(page, pid).locator(".badge")).to_have_text("Expired")
    expect(pending_card(page, pid)).to_have_count(0)
    shot(page, "06-expired")


def test_a_cancel_a_confirm_and_a_failure_appear_without_a_reload(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    withdrawn = run_async(propose_delete, served, "agent", "lab-vc", "DC0_C0_RP0_VM0")
    first = run_async(propose_delete, served, "agent", "lab-vc", "DC0_H0_VM1")
    second = run_async(propose_delete, served, "agent", "lab-vc", "DC0_H0_VM1")
    page = sign_in(people(), served, "alice")
    expect(pending_card(page, second["proposal_id"])).to_be_visible()

    refused, _ = run_async(mcp_call, served, "agent", "cancel_action", {"token": withdrawn["token"]})
    assert not refused
    card = decided_card(page, withdrawn["proposal_id"])
    expect(card).to_have_attribute("data-state", "cancelled", timeout=SLOW)
    expect(card.locator(".outcome")).to_have_text("Withdrawn by agent")

    refused, _ = run_async(mcp_call, served, "agent", "confirm_action", {"token": first["token"]})
    assert not refused, "not gated: the agent confirms it itself"
    card = decided_card(page, first["proposal_id"])
    expect(card).to_have_attribute("data-state", "executed", timeout=SLOW)
    expect(card.locator(".outcome")).to_have_text("Confirmed by agent and executed")

    pending_card(page, second["proposal_id"]).locator("button.approve").click()
    page.click("#confirm-ok")
    card = decided_card(page, second["proposal_id"])
    # the second proposal's VM went with the first: the lifecycle calls it stale (gateway/proposals.py)
    expect(card).to_have_attribute("data-state", "stale", timeout=SLOW)
    expect(card.locator(".outcome")).to_contain_text("stale")
    expect(page.locator("#toast")).to_contain_text("Not executed: ")
    shot(page, "07-cancelled-confirmed-failed")


def test_a_reader_sees_no_proposal_of_others_and_cannot_approve(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    """Who sees a proposal is the decision's ``proposal_rights``: its proposer, or someone who may decide
    it; a reader is neither, so the agent's proposal is not on its page and a forced approval is 404."""
    proposal = run_async(propose_delete, served, "agent", "prod-vc", "DC0_H0_VM1")
    pid = proposal["proposal_id"]
    page = sign_in(people(), served, "rita")
    expect(page.locator("#pending-empty")).to_be_visible()
    expect(pending_card(page, pid)).to_have_count(0)
    shot(page, "08-reader")
    status, error = forced_post(page, pid, "approve", csrf=True)
    assert (status, error["code"], error["reason_code"]) == (404, "not_found", "not_visible")
    assert served.proposal_state(pid) == "pending"


def test_an_others_approver_cannot_approve_its_own_proposal(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    own = run_async(propose_delete, served, "olga", "prod-vc", "DC0_C0_RP0_VM0")
    theirs = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    page = sign_in(people(), served, "olga")
    expect(pending_card(page, own["proposal_id"]).locator("button.approve")).to_be_disabled()
    own_card = pending_card(page, own["proposal_id"])
    expect(own_card.locator(".decide-note")).to_contain_text("their own proposal")
    expect(pending_card(page, theirs["proposal_id"]).locator("button.approve")).to_be_enabled()
    shot(page, "09-others-approver")
    status, error = forced_post(page, own["proposal_id"], "approve", csrf=True)
    assert (status, error["code"], error["reason_code"]) == (403, "forbidden", "own_proposal")
    assert served.proposal_state(own["proposal_id"]) == "pending"


@contextlib.contextmanager
def attacker_site(html: str) -> Iterator[str]:
    """Another web origin (plain HTTP on loopback) serving one page."""
    body = html.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_forged_posts_are_refused(people: Callable[[], Watched], served: WebServer) -> None:
    proposal = run_async(propose_delete, served, "agent", "prod-vc", "DC0_H0_VM1")
    pid = proposal["proposal_id"]
    watched = people()
    page = sign_in(watched, served, "alice")
    expect(pending_card(page, pid)).to_be_visible()
    status, error = forced_post(page, pid, "approve", csrf=False)
    assert (status, error["reason_code"]) == (403, "csrf")

    target = f"{served.origin}/ui/api/proposals/{pid}/approve"
    form = (f'<form method="post" action="{target}" enctype="text/plain">'
            '<input name=\'{"x":"\' value=\'"}\'><button id="go">Win a prize</button></form>')
    with attacker_site(form) as url:
        evil = watched.page()
        evil.goto(url)
        with evil.expect_response(target) as answer:
            evil.click("#go")
        assert answer.value.status == 403
    assert served.proposal_state(pid) == "pending"
    assert "DC0_H0_VM1" in served.sims["prod"].vm_names()


def _rename_vm(served: WebServer, old: str, new: str) -> None:
    from pyVim import connect

    si = pyvmomi_connect(served.sims["lab"])
    disconnect: Any = connect.Disconnect  # untyped
    try:
        find_vm(si, old).Rename_Task(new)
    finally:
        disconnect(si)
    wait_until(lambda: new in served.sims["lab"].vm_names(), timeout=10, what="VM renamed")


def test_names_from_vsphere_render_as_text(people: Callable[[], Watched], served: WebServer) -> None:
    _rename_vm(served, "DC0_C0_RP0_VM1", XSS)
    proposal = run_async(propose_delete, served, "agent", "lab-vc", XSS)
    page = sign_in(people(), served, "alice")
    card = pending_card(page, proposal["proposal_id"])
    expect(card.locator(".affected li")).to_contain_text([f"vm {XSS}"])
    assert card.locator("img").count() == 0

    page.goto("/ui/#inventory")
    section = page.locator('#inventory-body [data-target="lab-vc"]')
    expect(section.locator("td.name", has_text=XSS)).to_have_text(XSS)
    expect(page.locator('#inventory-body [data-target="prod-vc"] td.name').first).to_be_visible()
    down = page.locator('#inventory-body [data-target="lab-down"] .inline-error .code')
    expect(down).to_have_text("unreachable")
    assert page.locator("#inventory-body img").count() == 0
    shot(page, "10-inventory")
    for kind in ("hosts", "clusters", "datastores"):
        page.click(f'#inventory-kinds button[data-kind="{kind}"]')
        expect(page.locator('#inventory-body [data-target="lab-vc"] td.name').first).to_be_visible()
    shot(page, "11-inventory-datastores")


def test_targets_and_audit_pages(people: Callable[[], Watched], served: WebServer) -> None:
    page = sign_in(people(), served, "alice")
    page.goto("/ui/#targets")
    rows = page.locator("#targets-body tbody tr")
    expect(rows).to_have_count(4)
    prod = rows.filter(has_text="prod-vc").first
    expect(prod).to_contain_text("Connected")
    expect(prod).to_contain_text("prod-alias")
    expect(prod).to_contain_text("Required")
    expect(rows.filter(has_text="lab-vc")).to_contain_text("Not gated")
    expect(rows.filter(has_text="lab-down")).to_contain_text("Unreachable")
    expect(rows.filter(has_text="lab-down").locator(".inline-error .code")).to_have_text("unreachable")
    shot(page, "12-targets")

    page.goto("/ui/#audit")
    expect(page.locator("#chain-status")).to_contain_text("Hash chain verifies")
    page.fill('#audit-filters input[name="phase"]', "web_sign_in")
    page.click("#audit-filters button[type=submit]")
    phases = page.locator("#audit-body tbody .phase")
    expect(phases.first).to_have_text("web_sign_in")
    assert set(phases.all_inner_texts()) == {"web_sign_in"}
    page.fill('#audit-filters input[name="phase"]', "")
    page.click("#audit-filters button[type=submit]")
    expect(page.locator("#audit-body tbody tr").first).to_be_visible()
    shot(page, "13-audit")


# ---------------------------------------------------------------------------- layout at 360 px and 1280 px

# Every element wider than the viewport, and every single-word table cell whose text the browser broke
# over two lines ("poweredO" / "n").
LAYOUT_PROBLEMS = """() => {
    const width = document.documentElement.clientWidth;
    const problems = [];
    if (document.documentElement.scrollWidth > width) {
        problems.push(`page scrolls sideways: ${document.documentElement.scrollWidth} > ${width}`);
    }
    // a run of text is broken when one of its boxes starts below the bottom of the first line
    const broken = (rects) => {
        const shown = rects.filter((r) => r.width > 0);
        if (!shown.length) return false;
        const firstBottom = Math.min(...shown.map((r) => r.bottom));
        return shown.some((r) => r.top >= firstBottom - 1);
    };
    const textNodes = (root) => {
        const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
        const nodes = [];
        for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
        return nodes;
    };
    for (const cell of document.querySelectorAll("td, th, .badge, .tool, .target-name")) {
        const text = cell.textContent.trim();
        if (!text || /\\s/.test(text) || cell.closest("details")) continue;
        const rects = textNodes(cell).flatMap((node) => {
            const range = document.createRange();
            range.selectNodeContents(node);
            return [...range.getClientRects()];
        });
        if (broken(rects)) problems.push(`"${text}" is broken over two lines`);
    }
    for (const node of [...document.querySelectorAll("code")].flatMap(textNodes)) {
        for (const word of node.textContent.matchAll(/\\S+/g)) {
            const range = document.createRange();
            range.setStart(node, word.index);
            range.setEnd(node, word.index + word[0].length);
            if (broken([...range.getClientRects()])) problems.push(`"${word[0]}" is broken over two lines`);
        }
    }
    return problems;
}"""


def layout_problems(page: Page) -> list[str]:
    return page.evaluate(LAYOUT_PROBLEMS)  # type: ignore[no-any-return]


def within_view(page: Page, locator: Locator) -> bool:
    box = locator.bounding_box()
    width = page.viewport_size["width"] if page.viewport_size else 0
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width and box["height"] > 0


def narrow(watched: Watched, served: WebServer, who: str, width: int) -> Page:
    page = sign_in(watched, served, who)
    page.set_viewport_size({"width": width, "height": 800})
    return page


@pytest.mark.parametrize("width", [360, 420, 1280])
def test_the_page_fits_the_screen_with_buttons_in_place(
    people: Callable[[], Watched], served: WebServer, width: int,
) -> None:
    proposal = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    page = narrow(people(), served, "alice", width)
    card = pending_card(page, proposal["proposal_id"])
    expect(card.locator("button.approve")).to_be_visible()
    assert within_view(page, card.locator("button.approve"))
    assert within_view(page, card.locator("button.deny"))
    assert within_view(page, page.locator("#sign-out")), "the header pushes Sign out off the screen"
    assert layout_problems(page) == []
    shot(page, f"20-pending-{width}")
    for tab, ready in (("inventory", "#inventory-body tbody tr"), ("audit", "#audit-body tbody tr"),
                       ("targets", "#targets-body tbody tr")):
        page.goto(f"/ui/#{tab}")
        expect(page.locator(ready).first).to_be_visible(timeout=SLOW)
        shot(page, f"21-{tab}-{width}")
        assert layout_problems(page) == [], tab


def test_the_sign_in_hint_names_a_role_that_exists(people: Callable[[], Watched], served: WebServer) -> None:
    page = people().page()
    page.goto("/ui/")
    hint = page.locator("#sign-in-hint code")
    expect(hint).to_contain_text("gateway token create")
    role = re.search(r"--role (\S+)", hint.inner_text())
    assert role, hint.inner_text()
    defined = served.gateway.roles.roles()
    assert role.group(1) in defined and defined[role.group(1)].approve != "none"
    page.set_viewport_size({"width": 360, "height": 800})
    assert within_view(page, page.locator("#sign-in-form button[type=submit]"))
    assert layout_problems(page) == []
    shot(page, "23-sign-in-360")


def test_identical_proposals_are_told_apart(people: Callable[[], Watched], served: WebServer) -> None:
    first = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    second = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    page = sign_in(people(), served, "alice")
    shown = []
    for proposal in (first, second):
        card = pending_card(page, proposal["proposal_id"])
        expect(card.locator(".proposal-id")).to_contain_text(proposal["proposal_id"])
        when = card.locator("time.when")
        exact = when.get_attribute("datetime") or ""
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", exact), exact
        assert exact.replace("T", " ")[:19] in (when.get_attribute("title") or "")
        shown.append(card.locator(".meta").inner_text())
    assert shown[0] != shown[1]


def test_a_link_to_a_proposal_opens_its_card(people: Callable[[], Watched], served: WebServer) -> None:
    proposal = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    pid = proposal["proposal_id"]
    page = sign_in(people(), served, "alice")
    page.goto("/ui/#audit")
    expect(page.locator("#view-audit")).to_be_visible()
    page.goto(f"/ui/#proposal={pid}")
    card = pending_card(page, pid)
    expect(card).to_have_class(re.compile(r"\bfocused\b"))
    expect(card).to_be_in_viewport()
    expect(page.locator("#view-pending")).to_be_visible()
    shot(page, "22-linked-proposal")

    later = people().page()  # the link followed from a chat message, before signing in
    later.goto(f"/ui/#proposal={pid}")
    later.fill("#token", served.tokens["alice"])
    later.click("#sign-in-form button[type=submit]")
    expect(pending_card(later, pid)).to_have_class(re.compile(r"\bfocused\b"))
    expect(pending_card(later, pid)).to_be_in_viewport()


def test_the_audit_outcome_column_shows_outcomes_not_rule_names(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    rules = {r["decision"]["rule"] for r in served.audit_rows() if isinstance(r.get("decision"), dict)
             and r["decision"].get("rule")}
    assert rules, "the log has rows with a deciding rule"
    page = sign_in(people(), served, "alice")
    page.goto("/ui/#audit")
    expect(page.locator("#audit-body tbody tr").first).to_be_visible()
    header = page.locator("#audit-body thead th").all_inner_texts()
    column = [h.lower() for h in header].index("outcome")
    cells = page.locator(f"#audit-body tbody tr td:nth-child({column + 1})").all_inner_texts()
    assert cells and not (set(cells) & rules), set(cells) & rules
    proposed = page.locator("#audit-body tbody tr", has=page.locator(".phase-proposed")).first
    # prod-vc is gated: its proposals wait for a human's approval, not for the agent's confirmation
    expect(proposed.locator(f"td:nth-child({column + 1})")).to_have_text("waiting for approval")


# ---------------------------------------------------------------------------- the Audit tab reads right

SHOTS = Path("/work/notes/shots")

#: (phase, outcome) as the Audit tab shows each row
AUDIT_CELLS = """() => {
    const heads = [...document.querySelectorAll("#audit-body thead th")]
        .map((th) => th.textContent.toLowerCase());
    const phase = heads.indexOf("phase"), outcome = heads.indexOf("outcome");
    return [...document.querySelectorAll("#audit-body tbody tr:not(.row-json)")].map(
        (tr) => [tr.children[phase].textContent, tr.children[outcome].textContent]);
}"""


#: the text of the first cell wider than its table's frame (a frame scrolling sideways), or null
WIDEST_CELL = """(wrap) => {
    if (wrap.scrollWidth <= wrap.clientWidth) return null;
    const right = wrap.getBoundingClientRect().right;
    const cell = [...wrap.querySelectorAll("td")].find((td) => td.getBoundingClientRect().right > right + 1
        || td.scrollWidth > td.clientWidth + 1);
    return cell ? cell.textContent : `frame ${wrap.scrollWidth} > ${wrap.clientWidth}`;
}"""


def page_shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"page-{name}.png"))  # what the screen shows


def test_the_audit_tab_tells_a_refusal_from_a_humans_denial(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    gated = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    refused, answer = run_async(mcp_call, served, "agent", "confirm_action", {"token": gated["token"]})
    assert refused and answer["error"]["code"] == "approval_required"
    assert answer["error"]["decision"]["require_approval"] is True, answer  # the gate's real reason
    refused, answer = run_async(mcp_call, served, "agent", "no_such_tool", {})
    assert refused and answer["error"]["code"] == "not_found"
    failed, answer = run_async(mcp_call, served, "agent", "create_snapshot",
                               {"target": "lab-vc", "vm": "DC0_C0_RP0_VM0", "name": "audit-tab"})
    assert not failed, answer

    async def unknown_token() -> int:
        async with served.http({"Authorization": "Bearer gwt_aaaaaaaaaaaa_" + "x" * 43}) as client:
            return (await client.post("/mcp", json={})).status_code

    assert run_async(unknown_token) == 401
    run_async(served.server.config.app.state.refusals.flush)  # its minute's token_refused row, now
    page = sign_in(people(), served, "alice")
    page.goto("/ui/#audit")
    expect(page.locator("#audit-body tbody tr").first).to_be_visible()
    cells = {tuple(c) for c in page.evaluate(AUDIT_CELLS)}
    assert any(p == "token_refused" and o.startswith("token refused: ") for p, o in cells), cells
    assert ("refused", "approval_required") in cells and ("refused", "not_found") in cells, cells
    assert all(outcome.startswith("denied by ") for phase, outcome in cells if phase == "denied"), cells
    assert ("proposed", "waiting for approval") in cells, cells
    assert ("executing", "started (intent recorded)") in cells, cells
    assert all(o.startswith("approved by ") for p, o in cells if p == "approval"), cells
    assert not [c for c in cells if c[1] in ("", "—", "-")], "a row without its outcome"
    page_shot(page, "audit-1280")


def test_a_rows_json_opens_across_the_whole_table(people: Callable[[], Watched], served: WebServer) -> None:
    page = sign_in(people(), served, "alice")
    page.goto("/ui/#audit")
    first = page.locator("#audit-body tbody tr").first
    expect(first).to_be_visible()
    first.locator("button.row-toggle").click()
    opened = page.locator("#audit-body tr.row-json pre")
    expect(opened).to_be_visible()
    table_box, pre_box = page.locator("#audit-body table").bounding_box(), opened.bounding_box()
    assert table_box and pre_box and pre_box["width"] > 0.9 * table_box["width"], (table_box, pre_box)
    assert opened.evaluate("(pre) => getComputedStyle(pre).whiteSpace") == "pre"  # never broken mid-token
    assert '"phase"' in opened.inner_text()
    page_shot(page, "audit-row-1280")
    first.locator("button.row-toggle").click()
    expect(page.locator("#audit-body tr.row-json")).to_have_count(0)


def test_at_360_px_the_header_and_the_tables_show_everything(
    people: Callable[[], Watched], served: WebServer,
) -> None:
    page = narrow(people(), served, "alice", 360)
    for part in ("#who-name", "#who-role", "#sign-out"):
        assert within_view(page, page.locator(part)), part
        assert page.locator(part).evaluate("(node) => node.scrollWidth <= node.clientWidth"), f"{part} is cut"
    expect(page.locator("#who-role")).to_contain_text("admin")
    for tab, ready, column in (("targets", "#targets-body tbody tr", "Web approval"),
                               ("inventory", "#inventory-body tbody tr", "Name"),
                               ("audit", "#audit-body tbody tr", "Outcome")):
        page.goto(f"/ui/#{tab}")
        expect(page.locator(ready).first).to_be_visible(timeout=SLOW)
        cell = page.locator(f'{ready} td[data-label="{column}"]').first
        assert within_view(page, cell), f"{tab}: {column} is off the screen"
        wraps = page.locator(f"#{tab}-body .table-wrap")
        wide = [w.evaluate(WIDEST_CELL) for w in wraps.all()]
        assert not [w for w in wide if w], (tab, wide)
        problems = layout_problems(page)
        assert problems == [], (tab, problems)
        page_shot(page, f"{tab}-360")
    page.goto("/ui/#audit")
    expect(page.locator("#audit-body tbody tr").first).to_be_visible()
    page.locator("#audit-body tbody tr").first.locator("button.row-toggle").click()
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    page_shot(page, "audit-row-360")


def test_a_link_to_a_proposal_shows_that_card_alone(people: Callable[[], Watched], served: WebServer) -> None:
    others = [run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1") for _ in range(4)]
    linked = run_async(propose_delete, served, "agent", "prod-vc", "DC0_C0_RP0_VM1")
    page = narrow(people(), served, "alice", 360)
    page.goto(f"/ui/#proposal={linked['proposal_id']}")
    card = pending_card(page, linked["proposal_id"])
    expect(card).to_be_in_viewport()
    for other in others:
        expect(pending_card(page, other["proposal_id"])).to_be_hidden()
    expect(page.locator("#focus-bar")).to_contain_text(linked["proposal_id"])
    page_shot(page, "linked-360")
    page.click("#focus-all")
    expect(pending_card(page, others[0]["proposal_id"])).to_be_visible()
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"/ui/#proposal={linked['proposal_id']}")
    expect(pending_card(page, others[0]["proposal_id"])).to_be_hidden()
    expect(card).to_be_in_viewport()
    page_shot(page, "linked-1280")
