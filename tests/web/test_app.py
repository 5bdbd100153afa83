"""The approval page over real HTTPS: the gateway (two simulated vCenters behind it) served by uvicorn
with the page mounted at /ui, an agent speaking MCP with the SDK's client, and raw httpx2 requests
for the session, CSRF and origin rules. The pure parts (origin check, session store, approve rights,
audit visibility) get tables of cases first.

The running server and its MCP helpers are in tests/support/webserver.py.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.httpserver import FAST_HASH, REPO
from support.simulator import vm_exists
from support.webserver import (
    WebServer,
    change_headers,
    decide,
    mcp_call,
    propose_delete,
    signed_in,
    web_server,
)

from gateway.auth.tokens import Principal, create_token
from gateway.vocabulary import Kind
from gateway.web.session import (
    SECURE_COOKIE,
    SessionStore,
    clear_cookie_header,
    csrf_matches,
    origin_refusal,
    set_cookie_header,
)

STATIC = REPO / "gateway" / "web" / "static"


# ---------------------------------------------------------------------------- HTTP helpers


async def listed(client: httpx2.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await client.get("/ui/api/proposals")
    assert response.status_code == 200, response.text
    return {p["proposal_id"]: p for p in response.json()["proposals"]}


# ---------------------------------------------------------------------------- pure parts


ORIGIN = "https://gw.example.com"


@pytest.mark.parametrize(("origin", "fetch_site", "host", "refused"), [
    (ORIGIN, "same-origin", "gw.example.com", False),
    (ORIGIN, None, "gw.example.com", False),                  # older browsers send no Sec-Fetch-Site
    ("https://gw.example.com:443", None, "gw.example.com", False),
    (ORIGIN, None, "gw.example.com:443", False),
    ("https://GW.example.com", None, "gw.example.com", False),
    (None, "same-origin", "gw.example.com", True),            # a POST always carries Origin
    ("null", None, "gw.example.com", True),
    ("https://evil.example", None, "gw.example.com", True),
    ("http://gw.example.com", None, "gw.example.com", True),  # another scheme is another origin
    ("https://gw.example.com:8443", None, "gw.example.com", True),
    (ORIGIN, "cross-site", "gw.example.com", True),
    (ORIGIN, "same-site", "gw.example.com", True),
    (ORIGIN, "none", "gw.example.com", True),
    ("https://gw.example.com/path", None, "gw.example.com", True),
    ("https://user@gw.example.com", None, "gw.example.com", True),
])
def test_origin_refusal(origin: str | None, fetch_site: str | None, host: str, refused: bool) -> None:
    reason = origin_refusal(origin=origin, fetch_site=fetch_site, scheme="https", host=host)
    assert (reason is not None) is refused, reason


def test_origin_refusal_names_the_proxy_setting_when_only_the_scheme_differs() -> None:
    reason = origin_refusal(origin=ORIGIN, fetch_site="same-origin", scheme="http", host="gw.example.com")
    assert reason is not None and "--forwarded-allow-ips" in reason


def test_origin_refusal_also_applies_the_allow_list() -> None:
    def allowed(origin: str) -> bool:
        return origin == "https://other.example"

    assert origin_refusal(origin=ORIGIN, fetch_site=None, scheme="https", host="gw.example.com",
                          allowed=allowed) is not None


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _principal(name: str = "alice") -> Principal:
    return Principal(name, "admin", token_id=f"id-{name}")


def test_sessions_end_after_their_lifetime_or_when_idle() -> None:
    clock = FakeClock()
    store = SessionStore(lifetime=100, idle=30, clock=clock)
    busy, idle = store.create(_principal("busy")), store.create(_principal("idle"))
    for _ in range(4):
        clock.now += 20
        assert store.get(busy.id) is busy
    assert store.get(idle.id) is None, "idle for 80s with a 30s idle timeout"
    clock.now += 20
    assert store.get(busy.id) is None, "past its absolute lifetime however busy"
    assert len(store) == 0


def test_sessions_are_bounded_and_end_on_request() -> None:
    store = SessionStore(max_sessions=2, clock=FakeClock())
    first, second, third = (store.create(_principal(n)) for n in ("a", "b", "c"))
    assert store.get(first.id) is None and store.get(second.id) and store.get(third.id)
    assert store.end(second.id) is second and store.get(second.id) is None
    assert store.get(None) is None and store.get("") is None and store.end("nope") is None
    assert first.id != second.id and first.csrf != second.csrf
    with pytest.raises(ValueError, match="token id"):
        store.create(Principal("x", "admin"))


def test_csrf_matches_only_the_sessions_token() -> None:
    session = SessionStore(clock=FakeClock()).create(_principal())
    assert csrf_matches(session, session.csrf)
    assert not csrf_matches(session, None) and not csrf_matches(session, "")
    assert not csrf_matches(session, session.csrf + "x")


def test_cookie_headers() -> None:
    secure = set_cookie_header("abc", secure=True, max_age=3600, path="/ui/")
    assert secure == f"{SECURE_COOKIE}=abc; Max-Age=3600; HttpOnly; SameSite=Strict; Path=/; Secure"
    plain = set_cookie_header("abc", secure=False, max_age=3600, path="/ui/")
    assert plain == "gw_session=abc; Max-Age=3600; HttpOnly; SameSite=Strict; Path=/ui/"
    assert clear_cookie_header(secure=True, path="/ui/").startswith(f"{SECURE_COOKIE}=; Max-Age=0;")


def test_the_page_has_no_inline_code_and_never_parses_html() -> None:
    class Collector(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.scripts: list[dict[str, str | None]] = []
            self.in_script = False
            self.script_text = ""
            self.bad_attributes: list[str] = []
            self.urls: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            values = dict(attrs)
            self.bad_attributes += [name for name, _ in attrs if name.startswith("on") or name == "style"]
            self.urls += [v or "" for k, v in attrs if k in ("src", "href")]
            if tag == "script":
                self.scripts.append(values)
                self.in_script = True
            self.bad_attributes += ["<style>"] if tag == "style" else []

        def handle_endtag(self, tag: str) -> None:
            self.in_script = self.in_script and tag != "script"

        def handle_data(self, data: str) -> None:
            if self.in_script:
                self.script_text += data.strip()

    page = Collector()
    page.feed((STATIC / "index.html").read_text())
    assert page.scripts == [{"src": "static/app.js", "defer": None}] and page.script_text == ""
    assert page.bad_attributes == []
    assert page.urls and all(not u.startswith(("http:", "https:", "//", "data:")) for u in page.urls)
    script = (STATIC / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setAttribute(\"style", "http://", "https://"):
        assert sink not in script, sink


# ---------------------------------------------------------------------------- over HTTPS


@pytest.fixture(scope="module")
def served(vcsim_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with web_server(tmp_path_factory.mktemp("web"), vcsim_bin) as running:
        yield running


def _has_all_headers(response: httpx2.Response) -> None:
    csp = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "default-src 'none'" in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"  # once: the edge sets it
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.anyio
async def test_every_response_of_the_page_carries_the_security_headers(served: WebServer) -> None:
    async with served.http() as client:
        page = await client.get("/ui/")
        script = await client.get("/ui/static/app.js")
        style = await client.get("/ui/static/app.css")
        session = await client.get("/ui/api/session")
        missing = await client.get("/ui/api/nothing-here")
        unauthenticated = await client.get("/ui/api/proposals")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "static/app.js" in page.text
    assert script.headers["content-type"].startswith("text/javascript") and style.status_code == 200
    assert session.json() == {"signed_in": False, "sign_in_role": "lead"}  # the hint: a role that approves
    assert missing.status_code == 404 and unauthenticated.status_code == 401
    for response in (page, script, style, session, missing, unauthenticated):
        _has_all_headers(response)


@pytest.mark.anyio
async def test_sign_in_trades_the_token_for_a_hardened_session_cookie(served: WebServer) -> None:
    async with served.http() as client:
        response = await client.post("/ui/api/sign-in", json={"token": served.tokens["alice"]},
                                     headers={"Origin": served.origin})
        session = await client.get("/ui/api/session")
    assert response.status_code == 200, response.text
    cookie = response.headers["set-cookie"]
    name, _, rest = cookie.partition("=")
    attributes = [a.strip() for a in rest.split(";")[1:]]
    assert name == SECURE_COOKIE
    assert {"HttpOnly", "Secure", "SameSite=Strict", "Path=/"} <= set(attributes)
    assert not any(a.lower().startswith("domain") for a in attributes)
    max_age = int(next(a for a in attributes if a.startswith("Max-Age=")).split("=")[1])
    assert 0 < max_age <= 12 * 3600
    body = response.json()
    assert (body["name"], body["role"], body["approve"]) == ("alice", "admin", "any") and body["csrf"]
    assert served.tokens["alice"] not in response.text + cookie
    assert session.json()["signed_in"] is True and session.json()["csrf"] == body["csrf"]
    row = [r for r in served.audit_rows() if r.get("phase") == "web_sign_in"][-1]
    assert (row["caller"], row["role"], row["surface"]) == ("alice", "admin", "web") and row["correlation_id"]


@pytest.mark.anyio
async def test_a_bad_token_is_refused_and_a_token_in_the_url_never_accepted(served: WebServer) -> None:
    async with served.http() as client:
        wrong = await client.post("/ui/api/sign-in", json={"token": "gwt_aaaaaaaaaaaa_" + "A" * 43},
                                  headers={"Origin": served.origin})
        garbage = await client.post("/ui/api/sign-in", json={"nope": 1}, headers={"Origin": served.origin})
        in_url = await client.get(f"/ui/api/session?token={served.tokens['alice']}")
    assert wrong.status_code == 401
    assert wrong.headers.get("set-cookie", f"{SECURE_COOKIE}=;").startswith(f"{SECURE_COOKIE}=;")
    assert wrong.json()["error"]["code"] == "unauthorized"
    assert garbage.status_code == 400 and garbage.json()["error"]["code"] == "invalid_argument"
    assert in_url.status_code == 400 and in_url.json()["error"]["code"] == "token_in_query"


@pytest.mark.anyio
@pytest.mark.parametrize(("headers", "status"), [
    ({}, 403),                                                          # no Origin
    ({"Origin": "https://attacker.example"}, 403),                      # refused at the edge already
    ({"Sec-Fetch-Site": "cross-site"}, 403),
    ({"Content-Type": "text/plain"}, 403),                              # what a cross-site form can send
])
async def test_sign_in_refuses_posts_that_may_come_from_another_site(
    served: WebServer, headers: dict[str, str], status: int,
) -> None:
    sent = {"Origin": served.origin, "Content-Type": "application/json", **headers}
    if not headers:
        sent.pop("Origin")
    async with served.http() as client:
        response = await client.post("/ui/api/sign-in", content=json.dumps({"token": served.tokens["alice"]}),
                                     headers=sent)
    assert response.status_code == status, response.text
    assert "set-cookie" not in response.headers


@pytest.mark.anyio
async def test_changes_need_the_csrf_token_the_page_origin_and_a_post(served: WebServer) -> None:
    proposal = await propose_delete(served, "agent", "lab-vc", "DC0_H0_VM1")
    pid = proposal["proposal_id"]
    async with signed_in(served, "alice") as (client, csrf):
        no_token = await decide(client, served, None, pid, "approve")
        wrong_token = await decide(client, served, csrf[::-1], pid, "approve")
        cross_site = await client.post(
            f"/ui/api/proposals/{pid}/approve", json={},
            headers={**change_headers(served, csrf), "Sec-Fetch-Site": "cross-site"})
        as_form = await client.post(f"/ui/api/proposals/{pid}/approve", content=b"a=1",
                                    headers={**change_headers(served, csrf),
                                             "Content-Type": "application/x-www-form-urlencoded"})
        by_get = await client.get(f"/ui/api/proposals/{pid}/approve")
        assert served.proposal_state(pid) == "pending"
        denied = await decide(client, served, csrf, pid, "deny")
    for response, reason in ((no_token, "csrf"), (wrong_token, "csrf"), (cross_site, "cross_site"),
                             (as_form, "content_type")):
        assert response.status_code == 403, response.text
        assert response.json()["error"]["reason_code"] == reason
    assert by_get.status_code == 405
    assert denied.status_code == 200 and denied.json()["result"]["state"] == "denied"
    assert "DC0_H0_VM1" in served.sims["lab"].vm_names()


@pytest.mark.anyio
async def test_sign_out_ends_the_session_even_for_a_replayed_cookie(served: WebServer) -> None:
    async with signed_in(served, "alice") as (client, csrf):
        cookie = client.cookies[SECURE_COOKIE]
        without_csrf = await client.post("/ui/api/sign-out", json={}, headers=change_headers(served, None))
        assert without_csrf.status_code == 403
        out = await client.post("/ui/api/sign-out", json={}, headers=change_headers(served, csrf))
    assert out.status_code == 200 and out.headers["set-cookie"].startswith(f"{SECURE_COOKIE}=;")
    async with served.http({"Cookie": f"{SECURE_COOKIE}={cookie}"}) as replay:
        refused = await replay.get("/ui/api/proposals")
    assert refused.status_code == 401
    assert any(r.get("phase") == "web_sign_out" and r["caller"] == "alice" for r in served.audit_rows())


@pytest.mark.anyio
async def test_revoking_the_token_or_changing_its_role_applies_to_the_session(served: WebServer) -> None:
    store = served.gateway.store
    for name in ("tess", "rob"):
        token, _ = create_token(store, name, "admin", expires_in=None, now=time.time(), hasher=FAST_HASH,
                                kind=Kind.PERSON)
        served.tokens[name] = token
    async with signed_in(served, "tess") as (tess, _), signed_in(served, "rob") as (rob, _):
        assert (await tess.get("/ui/api/proposals")).status_code == 200
        store.update_token("tess", revoked=True)
        store.update_token("rob", role="reader")
        revoked = await tess.get("/ui/api/proposals")
        session = await rob.get("/ui/api/session")
    assert revoked.status_code == 401 and "revoked" in revoked.json()["error"]["message"]
    assert (session.json()["role"], session.json()["approve"]) == ("reader", "none")


@pytest.mark.anyio
async def test_approving_needs_the_roles_approve_right(served: WebServer) -> None:
    by_agent = await propose_delete(served, "agent", "prod-vc", "DC0_H0_VM0")
    by_olga = await propose_delete(served, "olga", "prod-vc", "DC0_H0_VM0")
    agent_confirm = await mcp_call(served, "agent", "confirm_action", {"token": by_agent["token"]})
    async with signed_in(served, "rita") as (rita, rita_csrf), signed_in(served, "olga") as (olga, olga_csrf):
        seen_by_rita = await listed(rita)
        reader = await decide(rita, served, rita_csrf, by_agent["proposal_id"], "approve")
        reader_deny = await decide(rita, served, rita_csrf, by_agent["proposal_id"], "deny")
        seen_by_olga = await listed(olga)
        own = await decide(olga, served, olga_csrf, by_olga["proposal_id"], "approve")
        others = await decide(olga, served, olga_csrf, by_agent["proposal_id"], "approve")
    assert agent_confirm[0] and agent_confirm[1]["error"]["code"] == "approval_required"
    assert by_agent["proposal_id"] not in seen_by_rita, "a role that cannot decide sees only its own"
    assert reader.status_code == 404 and reader_deny.status_code == 404
    assert reader.json()["error"]["reason_code"] == "not_visible"
    card = seen_by_olga[by_agent["proposal_id"]]
    assert card["gated"] is True and card["target_host"] == served.gateway.targets["prod-vc"].address
    assert seen_by_olga[by_olga["proposal_id"]]["can_decide"] is False
    assert seen_by_olga[by_agent["proposal_id"]]["can_decide"] is True
    assert own.status_code == 403 and own.json()["error"]["reason_code"] == "own_proposal"
    assert others.status_code == 200, others.text
    assert others.json()["result"]["state"] == "executed"
    assert "DC0_H0_VM0" not in served.sims["prod"].vm_names()
    approved = [r for r in served.audit_rows() if r.get("phase") == "approved"
                and r.get("proposal_id") == by_agent["proposal_id"]]
    assert [(r["caller"], r["surface"], r["requested_by"]) for r in approved] == [("olga", "web", "agent")]
    assert served.proposal_state(by_olga["proposal_id"]) == "pending"


@pytest.mark.anyio
async def test_the_pages_approve_button_follows_the_one_decision(served: WebServer) -> None:
    """The card's approve right is the decision's own verdict (Entry.APPROVE), not a copy of the
    approve-right check: a proposer demoted since proposing makes the approval refused, so the page
    must not offer it (denying stays possible)."""
    token, _ = create_token(served.gateway.store, "dora", "agent", expires_in=None, now=time.time(),
                            hasher=FAST_HASH)
    served.tokens["dora"] = token
    proposal = await propose_delete(served, "dora", "lab-vc", "DC0_C0_RP0_VM1")
    served.gateway.store.update_token("dora", role="reader")
    async with signed_in(served, "alice") as (client, csrf):
        card = (await listed(client))[proposal["proposal_id"]]
        approved = await decide(client, served, csrf, proposal["proposal_id"], "approve")
    assert approved.status_code == 403, "the decision refuses the approval"
    assert card["can_approve"] is False, "the page does not offer an approval the decision refuses"
    assert "reader" in card["approve_note"]
    assert card["can_decide"] is True, "denying stays possible"
    assert "DC0_C0_RP0_VM1" in served.sims["lab"].vm_names()


@pytest.mark.anyio
async def test_a_denial_is_audited_with_the_human_and_the_agent_is_told(served: WebServer) -> None:
    proposal = await propose_delete(served, "agent", "lab-vc", "DC0_C0_RP0_VM0")
    async with signed_in(served, "alice") as (client, csrf):
        entry = (await listed(client))[proposal["proposal_id"]]
        response = await decide(client, served, csrf, proposal["proposal_id"], "deny")
        again = await decide(client, served, csrf, proposal["proposal_id"], "approve")
        after = (await listed(client))[proposal["proposal_id"]]
    assert entry["gated"] is False and entry["can_decide"] is True and entry["state"] == "pending"
    assert response.status_code == 200 and after["state"] == "denied" and after["approved_by"] == "alice"
    assert again.status_code == 409 and again.json()["error"]["code"] == "confirmation_invalid"
    failed, body = await mcp_call(served, "agent", "confirm_action", {"token": proposal["token"]})
    assert failed and "denied" in body["error"]["message"]
    rows = [r for r in served.audit_rows() if r.get("proposal_id") == proposal["proposal_id"]
            and r.get("phase") == "denied" and r.get("surface") == "web"]
    decisions = [(r["caller"], r["role"]) for r in rows if r["decision"]["rule"] == "human"]
    refusals = [r["error_code"] for r in rows if r["decision"]["rule"] == "proposal:state"]
    assert decisions == [("alice", "admin")] and refusals == ["confirmation_invalid"]
    assert "DC0_C0_RP0_VM0" in served.sims["lab"].vm_names()


@pytest.mark.anyio
async def test_the_page_shows_only_what_the_role_covers(served: WebServer) -> None:
    on_prod = await propose_delete(served, "agent", "prod-vc", "DC0_H0_VM1")
    on_lab = await propose_delete(served, "agent", "lab-vc", "DC0_H0_VM0")
    async with signed_in(served, "lara") as (client, csrf):
        proposals = await listed(client)
        targets = (await client.get("/ui/api/targets")).json()
        vms = (await client.get("/ui/api/inventory/vms")).json()
        tail = (await client.get("/ui/api/audit", params={"last": 500})).json()
        forbidden = await decide(client, served, csrf, on_prod["proposal_id"], "deny")
        allowed = await decide(client, served, csrf, on_lab["proposal_id"], "deny")
    assert on_lab["proposal_id"] in proposals and on_prod["proposal_id"] not in proposals
    assert all(p["target"].startswith("lab-") for p in proposals.values())
    assert [t["name"] for t in targets["targets"]] == ["lab-vc", "lab-down"]
    assert list(vms["targets"]) == ["lab-vc", "lab-down"]
    assert tail["rows"] and all(r["target"].startswith("lab-") for r in tail["rows"])
    assert forbidden.status_code == 404 and allowed.status_code == 200
    async with signed_in(served, "alice") as (client, csrf):
        assert (await decide(client, served, csrf, on_prod["proposal_id"], "deny")).status_code == 200


@pytest.mark.anyio
async def test_targets_show_connectivity_product_and_shared_instances(served: WebServer) -> None:
    async with signed_in(served, "rita") as (client, _):
        response = await client.get("/ui/api/targets")
    rows = {t["name"]: t for t in response.json()["targets"]}
    assert set(rows) == {"prod-vc", "prod-alias", "lab-vc", "lab-down"}
    assert rows["prod-vc"]["shares_instance_with"] == ["prod-alias"]
    assert "shares_instance_with" not in rows["lab-vc"]
    down = rows.pop("lab-down")
    assert down["connectivity"] == "error" and down["last_error"]["code"] == "unreachable"
    assert all(r["connectivity"] == "ok" and r["product"] and r["version"] for r in rows.values())
    assert rows["prod-vc"]["require_web_approval"] is True and rows["lab-vc"]["require_web_approval"] is False
    listing = [r["surface"] for r in served.audit_rows()
               if r.get("tool") == "list_targets" and r.get("caller") == "rita"]
    assert listing and listing[-1] == "web"


@pytest.mark.anyio
async def test_inventory_reads_every_kind_across_targets(served: WebServer) -> None:
    async with signed_in(served, "rita") as (client, _):
        answers = {kind: (await client.get(f"/ui/api/inventory/{kind}")).json()
                   for kind in ("vms", "hosts", "clusters", "datastores")}
        unknown = await client.get("/ui/api/inventory/networks")
    for kind, answer in answers.items():
        down = answer["targets"].pop("lab-down")
        assert down["error"]["code"] == "unreachable", kind
        assert set(answer["targets"]) == {"prod-vc", "prod-alias", "lab-vc"}, kind
        assert all(answer["targets"][t]["ok"][kind] for t in answer["targets"]), kind
    lab_vms = {vm["name"] for vm in answers["vms"]["targets"]["lab-vc"]["ok"]["vms"]}
    assert lab_vms == set(served.sims["lab"].vm_names())
    assert unknown.status_code == 404


@pytest.mark.anyio
async def test_audit_tail_filters_and_the_chain_verifies(served: WebServer) -> None:
    await propose_delete(served, "agent", "lab-vc", "DC0_H0_VM0")
    async with signed_in(served, "alice") as (client, _):
        proposed = (await client.get("/ui/api/audit", params={"phase": "proposed", "caller": "agent"})).json()
        two = (await client.get("/ui/api/audit", params={"last": 2})).json()
        bad = await client.get("/ui/api/audit", params={"last": 0})
        chain = (await client.get("/ui/api/audit/verify")).json()
    assert proposed["rows"]
    assert all((r["phase"], r["caller"]) == ("proposed", "agent") for r in proposed["rows"])
    assert len(two["rows"]) == 2 and two["rows"][0]["seq"] < two["rows"][1]["seq"]
    assert bad.status_code == 400
    assert chain["ok"] is True and chain["rows"] >= len(served.audit_rows()) - 5 and chain["first_seq"] == 1


@pytest.mark.anyio
async def test_the_built_in_reader_sees_only_its_own_audit_rows(served: WebServer) -> None:
    await propose_delete(served, "agent", "lab-vc", "DC0_H0_VM0")
    async with signed_in(served, "rita") as (client, _):
        mine = (await client.get("/ui/api/audit", params={"last": 500})).json()
        asked = (await client.get("/ui/api/audit", params={"last": 500, "caller": "agent"})).json()
    assert any(r["caller"] == "agent" for r in served.audit_rows())
    assert mine["rows"] and {r["caller"] for r in mine["rows"]} == {"rita"}
    assert asked["rows"] == []


@pytest.mark.anyio
async def test_a_role_without_the_audit_right_is_refused_the_audit(served: WebServer) -> None:
    async with signed_in(served, "olga") as (client, _):
        tail = await client.get("/ui/api/audit")
        chain = await client.get("/ui/api/audit/verify")
    assert tail.status_code == 403 and chain.status_code == 403
    assert "audit" in tail.json()["error"]["message"]


@pytest.mark.anyio
async def test_unknown_proposals_are_not_found(served: WebServer) -> None:
    async with signed_in(served, "alice") as (client, csrf):
        unknown = await decide(client, served, csrf, "aaaaaaaaaaaa", "approve")
        malformed = await decide(client, served, csrf, "..%2Fetc", "deny")
    assert unknown.status_code == 404 and malformed.status_code == 404


def refusals_of(served: WebServer, proposal_id: str) -> list[dict[str, Any]]:
    return [r for r in served.audit_rows() if r.get("proposal_id") == proposal_id
            and r.get("phase") == "denied" and r.get("decision", {}).get("rule") != "human"]


@pytest.mark.anyio
async def test_an_admin_agent_cannot_approve_its_own_gated_delete_through_the_page(served: WebServer) -> None:
    """The attack of issue 17: an agent holding an admin token proposes a gated delete_vm, is told a
    human must approve it, then posts its own token to the page's sign-in (with the page's Origin) and
    approves with the CSRF token of that answer. The sign-in is refused (agents never get a session),
    the approval with it too, both audited, and the VM is still there."""
    proposal = await propose_delete(served, "adam", "prod-vc", "DC0_H0_VM1")
    pid = proposal["proposal_id"]
    failed, confirmed = await mcp_call(served, "adam", "confirm_action", {"token": proposal["token"]})
    assert failed and confirmed["error"]["code"] == "approval_required"
    async with served.http() as client:
        signing_in = await client.post("/ui/api/sign-in", json={"token": served.tokens["adam"]},
                                       headers={"Origin": served.origin})
        csrf = signing_in.json().get("csrf")
        approving = await decide(client, served, csrf, pid, "approve")
    assert vm_exists(served.sims["prod"], "DC0_H0_VM1"), "the agent's own approval deleted the VM"
    assert served.proposal_state(pid) == "pending"
    assert signing_in.status_code == 403, signing_in.text
    error = signing_in.json()["error"]
    assert (error["code"], error["reason_code"]) == ("forbidden", "agent_token")
    assert "--kind person" in error["message"] and "set-cookie" not in signing_in.headers
    assert approving.status_code == 401
    refused = [r for r in served.audit_rows()
               if r.get("phase") == "web_sign_in_refused" and r["caller"] == "adam"]
    assert [(r["kind"], r["reason_code"], r["surface"]) for r in refused] == [("agent", "agent_token", "web")]


@pytest.mark.anyio
async def test_a_person_cannot_approve_or_deny_their_own_proposal(served: WebServer) -> None:
    """``approve: any`` is any proposal but one's own: alice (admin, a person) proposes over MCP and
    cannot approve it on the page; another person can."""
    mine = await propose_delete(served, "alice", "prod-vc", "DC0_C0_RP0_VM0")
    pid = mine["proposal_id"]
    async with signed_in(served, "alice") as (client, csrf):
        card = (await listed(client))[pid]
        approving = await decide(client, served, csrf, pid, "approve")
        denying = await decide(client, served, csrf, pid, "deny")
    assert vm_exists(served.sims["prod"], "DC0_C0_RP0_VM0"), "alice approved her own delete"
    assert approving.status_code == 403, approving.text
    assert approving.json()["error"]["reason_code"] == "own_proposal"
    assert denying.status_code == 403 and denying.json()["error"]["reason_code"] == "own_proposal"
    assert (card["mine"], card["can_approve"], card["can_decide"]) == (True, False, False)
    assert "their own proposal" in card["approve_note"]
    assert served.proposal_state(pid) == "pending"
    rows = refusals_of(served, pid)
    assert [(r["caller"], r["kind"], r["via"], r["reason_code"]) for r in rows] == [
        ("alice", "person", "approve", "own_proposal"), ("alice", "person", "deny", "own_proposal")]
    async with signed_in(served, "olga") as (client, csrf):
        assert (await decide(client, served, csrf, pid, "deny")).status_code == 200


@pytest.mark.anyio
async def test_a_session_ends_when_its_token_becomes_an_agents(served: WebServer) -> None:
    store = served.gateway.store
    token, _ = create_token(store, "paula", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH,
                            kind=Kind.PERSON)
    served.tokens["paula"] = token
    proposal = await propose_delete(served, "agent", "prod-vc", "DC0_H0_VM1")
    async with signed_in(served, "paula") as (client, csrf):
        assert (await client.get("/ui/api/session")).json()["kind"] == "person"
        store.update_token("paula", kind=Kind.AGENT)
        approving = await decide(client, served, csrf, proposal["proposal_id"], "approve")
        session = (await client.get("/ui/api/session")).json()
    assert approving.status_code == 401 and "agent" in approving.json()["error"]["message"]
    assert session["signed_in"] is False
    assert vm_exists(served.sims["prod"], "DC0_H0_VM1")
    assert served.proposal_state(proposal["proposal_id"]) == "pending"


@pytest.mark.anyio
async def test_a_web_approval_sends_the_bytes_its_audit_row_fingerprints(
    vcsim_bin: Path, tmp_path: Path
) -> None:
    """The approval's answer reaches the page as the very bytes the ``executed`` row fingerprints: the
    page sends the encoded answer inside ``{"result": ...}``, never a second encoding of it."""
    with web_server(tmp_path, vcsim_bin) as server:
        proposal = await propose_delete(server, "agent", "prod-vc", "DC0_H0_VM0")
        async with signed_in(server, "olga") as (client, csrf):
            response = await decide(client, server, csrf, proposal["proposal_id"], "approve")
        assert response.status_code == 200, response.text
        head, tail = b'{"result":', b"}"
        assert response.content.startswith(head) and response.content.endswith(tail)
        received = response.content[len(head):-len(tail)]
        assert json.loads(received)["state"] == "executed"
        (row,) = [r for r in server.audit_rows() if r.get("phase") == "executed"
                  and r.get("proposal_id") == proposal["proposal_id"]]
    assert row["result_digest"] == hashlib.sha256(received).hexdigest()
    assert row["result_size"] == len(received)
