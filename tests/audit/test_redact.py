"""One redaction for everything that leaves the process (``gateway.audit.redact``).

Tables of phrasings and keys that must be masked and of look-alikes that must not (correlation ids,
ordinary words in VM names); then the real ``gateway serve`` in front of a simulator, with a loopback
receiver for its webhook and chat channel: a secret hidden in a bulk call's ``name_regex`` must reach
none of the webhook body, the chat body, the page's card, ``list_pending_actions``, the proposals
table and the server's log, and the chat URL kept in the environment must not reach the log either.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import signal
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.answers import answer_of
from support.httpserver import FAST_HASH
from support.simulator import Simulator, complete_rules, wait_until, write_targets

from gateway import notify
from gateway.audit.redact import MASK, displayable, displayable_text, is_secret_key, redact, redact_text
from gateway.auth.principal import CallerKey
from gateway.auth.tokens import create_token
from gateway.logs import configure_logging, flush_logs
from gateway.proposals import Proposal
from gateway.server.edge.tls import create_certificate
from gateway.server.proposals.views import proposal_view
from gateway.store.sqlite import SqliteStore
from gateway.vocabulary import Kind

REPO = Path(__file__).resolve().parents[2]
PAROL, SEKRET = "\u043f\u0430\u0440\u043e\u043b\u044c", "\u0441\u0435\u043a\u0440\u0435\u0442123"

# ------------------------------------------------------------------------------------ tables (pure)


@pytest.mark.parametrize(("text", "expected"), [
    # phrasings
    ("passwd Hunter2", "passwd ***"),
    ("new passwd: Hunter2 set", "new passwd: *** set"),
    ("the password for root is Hunter2", "the password for root is ***"),
    ("the password of admin: Hunter2", "the password of admin: ***"),
    ('password is "two words"', 'password is "***"'),
    ("password was 'two words' then", "password was '***' then"),
    ('password is "Hunter2', "password is ***"),
    ("Passwort: Geheim123", "Passwort: ***"),
    ("Kennwort = Geheim123", "Kennwort = ***"),
    (f"{PAROL}: {SEKRET}", f"{PAROL}: ***"),
    (f"{PAROL.title()} {SEKRET.title()}", f"{PAROL.title()} ***"),
    ("mot de passe: Hunter2", "mot de passe: ***"),
    ("contraseña: Hunter2", "contraseña: ***"),
    ("credentials admin:Hunter2", "credentials ***"),
    ("credential: Hunter2", "credential: ***"),
    ("secret Hunter2", "secret ***"),
    ('secret "two words"', 'secret "***"'),
    ("(?:password is Hunter2|AKIAIOSFODNN7EXAMPLE)?web", "(?:password is ***"),
    # keys in text
    ("pass=Hunter2 user=bob", "pass=*** user=bob"),
    ("auth: Hunter2", "auth: ***"),
    ("pin=1234", "pin=***"),
    ('{"pin": "1234", "vm": "web-1"}', '{"pin": "***", "vm": "web-1"}'),
    ("x-auth=Hunter2", "x-auth=***"),
    # webhook URLs carrying their secret in the path or the query
    ("POST https://acme.webhook.office.com/webhookb2/1a2b@3c4d/IncomingWebhook/5e6f/7a8b ok",
     "POST https://acme.webhook.office.com/webhookb2/*** ok"),
    ("POST https://example.com/x/IncomingWebhook/5e6f/7a8b ok",
     "POST https://example.com/x/IncomingWebhook/*** ok"),
    ("https://discord.com/api/webhooks/123/abcDEF ok", "https://discord.com/api/webhooks/*** ok"),
    ("https://chat.example.com/hooks/T0/B0/xyz ok", "https://chat.example.com/hooks/*** ok"),
    ("https://h.example.com/run?api-version=1&sig=abcDEF123&sv=1 ok",
     "https://h.example.com/run?api-version=1&sig=***&sv=1 ok"),
    ("https://h.example.com/run?token=abcDEF123 ok", "https://h.example.com/run?token=*** ok"),
    ("https://h.example.com/run?code=abcDEF123&x=1", "https://h.example.com/run?code=***&x=1"),
])
def test_credential_phrasings_and_keys_are_masked(text: str, expected: str) -> None:
    masked = redact_text(text)
    assert masked.startswith(expected), masked
    assert "Hunter2" not in masked and "Geheim123" not in masked and "AKIAIOSFODNN7EXAMPLE" not in masked


@pytest.mark.parametrize("text", [
    "VM secret-santa-01 is poweredOn",
    "the secret sauce VM",
    "passwd-sync-01 on DC0_H0",
    "the passwd file changed",
    "auth-server-1 author=bob oauth=on",
    "ping=3 spinner=on mapping: 4 shipping=ok pinned: true",
    "pin-board-vm pass-through-01",
    "the password field is required",
    "password is required",
    "credentials expired for ops",
    "credentials are missing",
    "secret rotation scheduled",
    "cid=0123456789abcdef0123456789abcdef caller=ops",
    "X-Request-ID: req-2026-11-30T21:00:00Z-ABCDEFabcdef0123456789xyzXYZ01234",
    '"correlation_id": "4bf92f3577b34da6a3ce929d0e0e4736"',
    "POST https://hooks.example.com/gw 200",
    "https://h.example.com/run?api-version=2016-06-01&sv=1.0 ok",
    "Delete 2 VM(s) whose whole name matches the given name_regex: web-1, web-2",
])
def test_look_alikes_stay_readable(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(("key", "secret"), [
    ("pass", True), ("auth", True), ("pin", True), ("x_auth", True), ("pin_code", True), ("Passwort", True),
    ("passcode", True), ("author", False), ("ping", False), ("spinner", False), ("oauth_issuer", False),
    ("pass_count", False), ("auth_method", False), ("bypass", False), ("mapping", False),
])
def test_short_credential_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_short_keys_mask_values_and_open_sections() -> None:
    # "auth" often names a section (auth: {user, password}): its scalars are masked, a mapping is opened
    event = {"pass": "Hunter2", "pin": 1234, "auth": "Hunter2",
             "cfg": {"auth": {"user": "bob", "password": "x"}}}
    assert redact(event) == {"pass": MASK, "pin": MASK, "auth": MASK,
                             "cfg": {"auth": {"user": "bob", "password": MASK}}}


def test_shown_redacts_before_it_bounds_and_is_idempotent() -> None:
    secret = "x" * 2000 + " password is Hunter2"
    assert "Hunter2" not in displayable_text(secret[-60:]) and len(displayable_text(secret)) <= 1024
    cut = displayable_text("a" * 1010 + " password=Hunter2")  # a cut never leaves half a secret behind
    assert "Hunt" not in cut and "Hunter2" not in cut
    value = {"summary": "web\u202e1 password is Hunter2", "affected": [{"name": "pin=1234"}]}
    once = displayable(value)
    assert once == {"summary": "web\\u202e1 password is ***", "affected": [{"name": "pin=***"}]}
    assert displayable(once) == once


@pytest.mark.parametrize("shape", [
    "password for " * 30_000, "secret " * 50_000, "https://a" + "/b" * 150_000, "?a=" * 100_000,
    ("https://a" + "/b" * 50 + " ") * 3_000, "the password of x" * 20_000,
])
def test_redaction_of_long_adversarial_phrasing_completes(shape: str) -> None:
    # the phrase, webhook and query rules stay linear (pytest-timeout fails a quadratic one)
    assert redact_text(shape) == shape


def test_texts_seen_clean_are_remembered_and_a_secret_never_is() -> None:
    """A short text once found clean is looked up the next time; a text that held a secret is masked
    every time and never kept, and the set of clean texts stays bounded whatever is sent."""
    from gateway.audit import redact as module

    secret = "login with password=Hunter2-for-the-memo"
    assert redact_text(secret) == redact_text(secret) == "login with password=***"
    assert secret not in module._CLEAN_TEXTS
    assert redact_text("DC0_H0_VM_memo") == "DC0_H0_VM_memo" and "DC0_H0_VM_memo" in module._CLEAN_TEXTS
    for n in range(module._CLEAN_TEXTS_MAX + 10):
        assert redact_text(f"vm-name-{n}") == f"vm-name-{n}"
    assert 0 < len(module._CLEAN_TEXTS) <= module._CLEAN_TEXTS_MAX
    long_clean = "x" * (module._CLEAN_TEXT_LEN + 1)
    assert redact_text(long_clean) == long_clean and long_clean not in module._CLEAN_TEXTS


def test_a_long_run_of_open_quotes_is_masked_in_linear_time() -> None:
    masked = redact_text('password is "' * 30_000)
    assert masked.startswith('password is "***"') and len(masked) < 30_000 * 13


# ----------------------------------------------- every exit redacts, whatever the record holds (pure)


def _stored_proposal(**changes: Any) -> Proposal:
    """A proposal record as an older gateway (or a hand-edited database) may hold it: text in clear."""
    fields: dict[str, Any] = dict(
        id="p-1", token_hash="h", caller="agent-a", role="admin", surface="test", target="vc1",
        target_host="10.0.0.1", tool="bulk_vm_action", args={}, args_digest="d",
        plan_summary="Delete VMs matching '(?:password is Hunter2)?web'",
        affected=[{"type": "vm", "name": "web pin=1234", "moid": "vm-1"}], plan_params={},
        created_at=1_800_000_000.0, expires_at=1_800_001_800.0, require_web_approval=True, state="failed",
        error={"code": "task_failed", "message": "vSphere said: secret Hunter2 refused"},
    )
    fields.update(changes)
    return Proposal(**fields)


def test_the_pending_view_and_notifications_redact_every_text_they_carry() -> None:
    proposal = _stored_proposal()
    facts = notify.proposal_facts(proposal)
    texts = {
        "view": json.dumps(proposal_view(proposal, 1_800_000_100.0)),
        "facts": json.dumps(facts),
        "chat": json.dumps(notify.chat_message("failed", facts, "https://gw/ui#proposal=p-1")),
    }
    assert {where: text for where, text in texts.items() if "Hunter2" in text or "1234" in text} == {}
    assert "web pin=***" in texts["view"] and "password is ***" in texts["chat"]


# ------------------------------------------------------------------ the HTTP client's log lines


def test_the_http_clients_request_lines_never_carry_a_url(tmp_path: Path) -> None:
    with _receiver() as receiver:
        url = chat_url(receiver)
        stream = io.StringIO()
        configure_logging("text", "DEBUG", stream)  # conftest puts the root logger back afterwards
        with httpx2.Client(trust_env=False) as client:
            assert client.post(url, content=b"{}").status_code == 200
        logging.getLogger("gateway.notify").info("delivered to %s", url)  # a line of our own naming it
        assert receiver.received, "the request reached the receiver"
    assert flush_logs()
    written = stream.getvalue()
    assert HOOK_PART not in written and TOKEN_PART not in written, written
    assert "IncomingWebhook" not in written, written
    assert " httpx2: " not in written and " httpcore2." not in written, "the client's own lines are quiet"
    assert "delivered to http://127.0.0.1:" in written


# ------------------------------------------------------------------------- the real server, end to end

SECRET_REGEX = "(?:password is Hunter2|AKIAIOSFODNN7EXAMPLE)?DC0_H0_VM[01]"
CLEAN_REGEX = "DC0_H0_VM[01]"
LEAKS = ("Hunter2", "AKIAIOSFODNN7EXAMPLE")
HOOK_SECRET = "s3cr3t-for-the-test-receiver"
HOOK_PART = "5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
TOKEN_PART = "Zq81TokenInTheQuery"
GATEWAY_MAIN = "from gateway.cli import main; raise SystemExit(main())"


def chat_url(receiver: _Receiver) -> str:
    """A Teams-style incoming webhook URL on the receiver, with a token in its query as well."""
    return f"{receiver.url}/chat/webhookb2/g@t/IncomingWebhook/{HOOK_PART}/u?token={TOKEN_PART}"


@dataclass
class _Receiver:
    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, prefix: str) -> list[str]:
        with self.lock:
            return [r["body"] for r in self.received if r["path"].startswith(prefix)]


@contextlib.contextmanager
def _receiver() -> Iterator[_Receiver]:
    """A loopback HTTP receiver recording every POST (path and body) and answering 200."""
    state = _Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            with state.lock:
                state.received.append({"path": self.path, "body": body})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _home(tmp: Path, sim: Simulator, receiver: _Receiver) -> tuple[dict[str, str], dict[str, str]]:
    """GATEWAY_HOME with targets, rules (vc1 needs a human), notifications and two admin tokens."""
    home = tmp / "home"
    home.mkdir(mode=0o700)
    env = write_targets(tmp / "targets.yaml", {"vc1": sim})
    (tmp / "rules.yaml").write_text(yaml.safe_dump(complete_rules({
        "defaults": {"read": "allow", "write": "allow", "destructive": "allow"},
        "targets": {"vc1": {"require_web_approval": True}}})))
    (home / "notifications.yaml").write_text(yaml.safe_dump({"notifications": {"channels": [
        {"name": "ops", "kind": "webhook", "url": f"{receiver.url}/hook", "secret_env": "HOOK_SECRET",
         "events": ["approval_needed"]},
        {"name": "chat", "kind": "chat", "url_env": "CHAT_WEBHOOK_URL", "events": ["approval_needed"]},
    ]}}))
    env.update({
        "GATEWAY_HOME": str(home), "GATEWAY_TARGETS_FILE": str(tmp / "targets.yaml"),
        "GATEWAY_RULES_FILE": str(tmp / "rules.yaml"), "GATEWAY_LOG_LEVEL": "INFO",
        "HOOK_SECRET": HOOK_SECRET, "CHAT_WEBHOOK_URL": chat_url(receiver),
        "PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", ""),
    })
    with SqliteStore(home / "state.db") as store:
        kinds = {"agent": Kind.AGENT, "alice": Kind.PERSON}
        tokens = {name: create_token(store, name, "admin", expires_in=None, now=time.time(), hasher=FAST_HASH,
                                     kind=kind)[0] for name, kind in kinds.items()}
    return env, tokens


@pytest.mark.anyio
async def test_a_secret_in_name_regex_never_leaves_the_host_in_clear(
    sim_vc1: Simulator, tmp_path: Path,
) -> None:
    with _receiver() as receiver:
        env, tokens = _home(tmp_path, sim_vc1, receiver)
        cert = create_certificate(tmp_path / "tls", ["localhost"], ["127.0.0.1"])
        log = tmp_path / "serve.log"
        argv = ["serve", "--transport", "https", "--cert", str(cert.cert), "--key", str(cert.key),
                "--public-name", "localhost", "--host", "127.0.0.1", "--port", "0", "--grace-seconds", "10",
                "--web", "--enable-destructive"]
        with log.open("wb") as sink:
            process = subprocess.Popen([sys.executable, "-c", GATEWAY_MAIN, *argv], cwd=REPO, env=env,
                                       stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        try:
            found = wait_until(lambda: process.poll() is not None or re.search(
                r"running on https://127\.0\.0\.1:(\d+)", log.read_text()), timeout=60, what="gateway serve")
            assert isinstance(found, re.Match), log.read_text()
            base = f"https://localhost:{found.group(1)}"
            tls = ssl.create_default_context(cafile=str(cert.cert))
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {tokens['agent']}"}, timeout=60,
                                      verify=tls)
            async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http),
                                    mode="2026-07-28") as client:
                refused = answer_of(await client.call_tool("bulk_vm_action", {
                    "target": "vc1", "action": "delete_vm", "name_regex": SECRET_REGEX,
                    "force_power_off": True}))
                assert refused["error"]["code"] == "invalid_argument", refused
                assert "name_regex" in refused["error"]["message"], refused
                # the same selection without the secret is proposed: every exit below is live
                proposed = answer_of(await client.call_tool("bulk_vm_action", {
                    "target": "vc1", "action": "delete_vm", "name_regex": CLEAN_REGEX,
                    "force_power_off": True}))
                assert proposed.get("state") == "pending", proposed
                pending = answer_of(await client.call_tool("list_pending_actions", {}))
            async with httpx2.AsyncClient(base_url=base, verify=tls, timeout=60) as page:
                signed = await page.post("/ui/api/sign-in", json={"token": tokens["alice"]},
                                         headers={"Origin": base})
                assert signed.status_code == 200, signed.text
                cards = (await page.get("/ui/api/proposals")).text
            wait_until(lambda: receiver.bodies("/hook") and receiver.bodies("/chat"), timeout=30,
                       what="the webhook and the chat post")
            state_db = f"file:{env['GATEWAY_HOME']}/state.db?mode=ro"
            with contextlib.closing(sqlite3.connect(state_db, uri=True)) as db:
                db.row_factory = sqlite3.Row
                (row,) = db.execute("SELECT * FROM proposals").fetchall()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    assert "DC0_H0_VM0" in proposed["summary"], proposed  # the summary still names the VMs it acts on
    pid = proposed["proposal_id"]
    assert [p["proposal_id"] for p in pending["pending"]] == [pid], pending
    assert pid in cards and pid in receiver.bodies("/hook")[0] and pid in receiver.bodies("/chat")[0]
    assert row["plan_summary"] == proposed["summary"]
    # every column, ``args`` (the call itself, planned again at confirm or approval) included: a
    # proposal never takes an argument holding a secret
    stored = {key: row[key] for key in row.keys()}  # noqa: SIM118 (sqlite3.Row)
    exits = {"the refusal": json.dumps(refused), "the answer": json.dumps(proposed),
             "list_pending_actions": json.dumps(pending),
             "the card": cards,
             "the webhook": receiver.bodies("/hook")[0], "the chat post": receiver.bodies("/chat")[0],
             "the proposals table": json.dumps(stored), "the log": log.read_text()}
    audit = (Path(env["GATEWAY_HOME"]) / "audit.jsonl").read_text()
    refusals = [r for r in map(json.loads, audit.splitlines())
                if r.get("tool") == "bulk_vm_action" and r.get("error_code") == "invalid_argument"]
    assert len(refusals) == 1, refusals  # the refusal is audited once, its argument masked
    exits["the audit log"] = audit
    leaked = {where: found for where, text in exits.items()
              if (found := [secret for secret in (*LEAKS, HOOK_PART, TOKEN_PART) if secret in text])}
    assert leaked == {}, leaked


@pytest.mark.parametrize("field", ["caller_key", "proposer_key", "approver_key", "person_key",
                                   "acting_for_key", "requested_by_key"])
def test_caller_keys_are_kept_whole_and_a_token_inside_one_is_still_masked(field: str) -> None:
    """A caller key names a token by its id (``token::<id>``), which reads like a credential label; rows
    must keep it whole (``audit: own`` and the page compare it), while a real token there is masked."""
    idp = "https://idp.example"
    for key in (CallerKey.token("abc123def456"), CallerKey.person(idp, "248289761001"),
                CallerKey.client(idp, "ops-agent", for_subject="u-1"), CallerKey.system("os:root")):
        assert redact({field: str(key)}) == {field: str(key)}
    token = "gwt_abc123def456_" + "A" * 43
    assert "A" * 43 not in json.dumps(redact({field: token}))
