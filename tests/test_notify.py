"""Humans are told: notifications.yaml parsing (tables of cases), the signed webhook and the chat payload,
and end to end: a real gateway over a simulator, a proposal on a gated target, and a loopback HTTP
receiver that checks every signature, fails on purpose and holds a request open."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from support.gateway_env import ADMIN, HUMAN, PERMISSIVE, VM0, VM1, Env, propose_delete
from support.simulator import (
    MakeSimulator,
    find_vm,
    pyvmomi_connect,
    read_properties,
    wait_until,
    write_targets,
)

from gateway import notify
from gateway.errors import ConfigError, GatewayError
from gateway.proposals import Approval, Proposal

SECRET = "s3cr3t-for-the-test-receiver"
ENV = {"HOOK_SECRET": SECRET, "CHAT_WEBHOOK_URL": "https://chat.example.com/hooks/T0/B0/xyz"}


# ------------------------------------------------------------------------------ configuration (pure)


def parse(section: Any) -> tuple[notify.NotificationConfig, list[str]]:
    problems: list[str] = []
    return notify.parse({"notifications": section}, ENV, problems, "n.yaml"), problems


GOOD_HOOK = {"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/gw",
             "secret_env": "HOOK_SECRET"}


@pytest.mark.parametrize("channel, problem", [
    ({**GOOD_HOOK, "colour": "red"}, "unknown key 'colour'"),
    ({**GOOD_HOOK, "kind": "email"}, "'kind' must be one of webhook, chat"),
    ({k: v for k, v in GOOD_HOOK.items() if k != "secret_env"}, "needs 'secret_env'"),
    ({**GOOD_HOOK, "secret_env": "MISSING_SECRET"}, "MISSING_SECRET is not set"),
    ({**GOOD_HOOK, "secret_env": "HOME"}, "ending in _SECRET"),
    ({**GOOD_HOOK, "url": "http://hooks.example.com/gw"}, "plain http is allowed only to a loopback"),
    ({**GOOD_HOOK, "url_env": "CHAT_WEBHOOK_URL"}, "exactly one of 'url' and 'url_env'"),
    ({**GOOD_HOOK, "events": ["approval_needed", "exploded"]}, "unknown event 'exploded'"),
    ({**GOOD_HOOK, "max_attempts": 0}, "'max_attempts' must be a whole number between 1 and 20"),
    ({**GOOD_HOOK, "backoff_seconds": "soon"}, "'backoff_seconds' must be a number"),
    ({"name": "chat", "kind": "chat", "url_env": "NOPE_URL"}, "NOPE_URL is not set"),
])
def test_a_bad_channel_is_refused_with_the_fix(channel: dict[str, Any], problem: str) -> None:
    config, problems = parse({"channels": [channel]})
    assert config.channels == () and len(problems) >= 1
    assert any(problem in p for p in problems), problems


def test_good_channels_parse_with_secrets_from_the_environment() -> None:
    config, problems = parse({"link_base": "https://gw.example.com:8443", "channels": [
        GOOD_HOOK,
        {"name": "chat", "kind": "chat", "url_env": "CHAT_WEBHOOK_URL", "events": ["approval_needed"]},
        {"name": "local", "kind": "webhook", "url": "http://127.0.0.1:9/x", "secret_env": "HOOK_SECRET"},
    ]})
    assert problems == []
    hook, chat, local = config.channels
    assert hook.secret == SECRET.encode() and hook.events == frozenset(notify.DEFAULT_EVENTS)
    assert chat.url == ENV["CHAT_WEBHOOK_URL"] and chat.secret is None and chat.events == {"approval_needed"}
    assert local.url.startswith("http://127.0.0.1")
    assert config.link("p-1") == "https://gw.example.com:8443/ui#proposal=p-1"
    assert SECRET not in repr(config) and "xyz" not in repr(config)


def test_duplicate_names_and_unknown_top_level_keys_are_refused() -> None:
    _, problems = parse({"channels": [GOOD_HOOK, GOOD_HOOK], "chanels": []})
    assert any("used twice" in p for p in problems) and any("unknown key 'chanels'" in p for p in problems)


def test_a_missing_file_means_no_channel_and_bad_yaml_names_the_line(tmp_path: Path) -> None:
    assert notify.load(tmp_path / "absent.yaml", ENV).channels == ()
    (tmp_path / "n.yaml").write_text("notifications:\n  channels: [\n")
    with pytest.raises(ConfigError, match=r"n\.yaml:\d+:\d+: not valid YAML"):
        notify.load(tmp_path / "n.yaml", ENV)


# ------------------------------------------------------------------------------------ messages (pure)


def a_proposal(**changes: Any) -> Proposal:
    fields: dict[str, Any] = dict(
        id="p-1", token_hash="h", caller="agent-a", role="admin", surface="test", target="vc-2",
        target_host="10.0.0.2", tool="delete_vm", args={"vm": "web-1"}, args_digest="d",
        plan_summary="delete VM <!channel> web-1", affected=[], plan_params={}, created_at=1_800_000_000.0,
        expires_at=1_800_001_800.0, require_web_approval=True,
    )
    fields.update(changes)
    return Proposal(**fields)


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    expected = hmac.new(b"k", b"1800000000.{}", hashlib.sha256).hexdigest()
    assert notify.signature(b"k", "1800000000", b"{}") == f"sha256={expected}"


def test_the_chat_message_has_title_target_summary_and_link_and_cannot_mention_a_channel() -> None:
    facts = notify.proposal_facts(a_proposal())
    message = notify.chat_message("approval_needed", facts, "https://gw/ui#proposal=p-1")
    assert message["title"] == "Approval needed: delete_vm on vc-2"
    assert message["target"] == "vc-2" and message["link"] == "https://gw/ui#proposal=p-1"
    assert "Target: vc-2 (10.0.0.2)" in message["text"] and "https://gw/ui#proposal=p-1" in message["text"]
    assert "<!channel>" not in message["text"] and "&lt;!channel&gt;" in message["text"]


def test_an_approval_of_several_tells_the_progress_who_and_why_and_the_blast_radius() -> None:
    disk = {"label": "Hard disk 1", "size": "40 GB", "datastore": "ds1"}
    blast = {"count": 1, "objects": [{"name": "web-1", "moid": "vm-1", "power_state": "poweredOff",
                                      "host": "esx-1", "snapshot_count": 2, "disks": [disk]}]}
    approved = Approval("p-1", "alice", "person", "admin", 1_800_000_100.0, "owner <!here> agreed", "d1",
                        approver_key="token::alice")
    proposal = a_proposal(approval_rule={"required": 2, "roles": [], "reason_required": True},
                          blast_radius=blast, shown_digest="d1", approvals=(approved,))
    facts = notify.proposal_facts(proposal)
    assert facts["approvals_progress"] == "1 of 2 approvals"
    assert [a["by"] for a in facts["approvals"]] == ["alice"]
    message = notify.chat_message("approval", facts, "https://gw/ui#proposal=p-1")
    assert message["title"] == "1 of 2 approvals, waiting for more: delete_vm on vc-2"
    text = message["text"]
    assert "Affects web-1 (poweredOff; host esx-1; 2 snapshot(s)): Hard disk 1 40 GB on ds1" in text
    assert "Approved by alice: owner &lt;!here&gt; agreed" in text and "<!here>" not in text
    assert "approval" in notify.DEFAULT_EVENTS


@pytest.mark.parametrize("event, gated, expected", [
    ("proposed", True, ("proposed", "approval_needed")),
    ("proposed", False, ("proposed",)),
    ("denied", True, ("denied",)),
    ("expired", True, ("expired",)),
])
def test_a_gated_proposal_also_raises_approval_needed(
    event: str, gated: bool, expected: tuple[str, ...],
) -> None:
    assert notify.events_for(event, a_proposal(require_web_approval=gated)) == expected


def test_facts_never_carry_the_token_hash_or_arguments() -> None:
    facts = notify.proposal_facts(a_proposal())
    assert "token_hash" not in facts and "args" not in facts and "h" not in facts.values()


# --------------------------------------------------------------------------------------- end to end


@dataclass
class Receiver:
    """A loopback webhook receiver: checks each signature, answers ``plan`` statuses in turn to /hook
    (then 200), and holds requests for events in ``hold`` until ``release`` is set."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    plan: list[int] = field(default_factory=list)
    hold: set[str] = field(default_factory=set)
    release: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, event: str, path: str = "/hook") -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.received if r["path"] == path and r["event"] == event]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            stamp, sent = self.headers.get("X-Gateway-Timestamp", ""), self.headers.get("X-Gateway-Signature")
            mac = hmac.new(SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256)
            good = "sha256=" + mac.hexdigest()
            event = self.headers.get("X-Gateway-Event", "")
            if event in state.hold:
                state.holding.set()
                state.release.wait(30)
            with state.lock:
                status = state.plan.pop(0) if state.plan and self.path == "/hook" else 200
                state.received.append({
                    "path": self.path, "event": event, "body": json.loads(body), "status": status,
                    "signed": sent is not None, "valid": sent is not None and hmac.compare_digest(sent, good),
                    "delivery": self.headers.get("X-Gateway-Delivery"),
                })
            self.send_response(status)
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
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


async def wait_for(condition: Any, what: str, timeout: float = 20.0) -> Any:
    with anyio.fail_after(timeout):
        while not (value := condition()):
            await anyio.sleep(0.02)
    assert value, what
    return value


@pytest.fixture
async def gated(tmp_path: Path, make_simulator: MakeSimulator, receiver: Receiver,
                monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Env, Any]]:
    env = Env(tmp_path, make_simulator(vms=2))
    (tmp_path / "notifications.yaml").write_text(yaml.safe_dump({"notifications": {
        "link_base": "https://gw.example.com:8443",
        "channels": [
            {"name": "ops", "kind": "webhook", "url": f"{receiver.url}/hook", "secret_env": "HOOK_SECRET",
             "events": ["approval_needed", "denied", "expired", "approved", "executed"],
             "backoff_seconds": 0.05},
            {"name": "chat", "kind": "chat", "url": f"{receiver.url}/chat", "events": ["approval_needed"]},
        ]}}))
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    gw = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}},
                   targets_extra={"proposal_ttl_seconds": 1800},
                   notify_env={"HOOK_SECRET": SECRET})
    await gw.start()
    try:
        yield env, gw
    finally:
        for g in env.gateways:
            await g.close()
        env.gateways.clear()


pytestmark = pytest.mark.anyio


async def test_a_gated_proposal_tells_humans_without_delaying_the_call(
    gated: tuple[Env, Any], receiver: Receiver,
) -> None:
    _env, gw = gated
    receiver.hold = {"approval_needed"}
    proposal = await propose_delete(gw)  # returns while the receiver still holds the webhook open
    assert proposal["requires_human_approval"] and proposal["expires_in_seconds"] == 1800
    await wait_for(receiver.holding.is_set, "the receiver got the webhook")
    assert receiver.of("approval_needed") == [], "the call returned before the webhook was answered"
    receiver.release.set()

    (hook,) = await wait_for(lambda: receiver.of("approval_needed"), "signed webhook")
    (chat,) = await wait_for(lambda: receiver.of("approval_needed", "/chat"), "chat message")
    assert hook["valid"] and hook["body"]["event"] == "approval_needed"
    facts = hook["body"]["proposal"]
    assert facts["proposal_id"] == proposal["proposal_id"] and facts["target"] == "vc1"
    assert facts["requires_human_approval"] and proposal["token"] not in json.dumps(hook["body"])
    link = f"https://gw.example.com:8443/ui#proposal={proposal['proposal_id']}"
    assert hook["body"]["link"] == link and hook["delivery"] == hook["body"]["delivery_id"]
    assert chat["body"]["link"] == link and chat["body"]["target"] == "vc1" and not chat["signed"]
    assert chat["body"]["title"].startswith("Approval needed: delete_vm on vc1") and chat["body"]["summary"]

    await gw.actions.deny(proposal["proposal_id"], HUMAN)
    (denied,) = await wait_for(lambda: receiver.of("denied"), "denial webhook")
    assert denied["valid"] and denied["body"]["proposal"]["decided_by"] == HUMAN.name


async def test_an_expiry_is_told_and_a_failing_receiver_is_retried_and_audited(
    gated: tuple[Env, Any], receiver: Receiver,
) -> None:
    env, gw = gated
    receiver.plan = [503, 500]  # the first two deliveries fail, the third attempt gets through
    proposal = await propose_delete(gw)
    hooks = await wait_for(lambda: [r for r in receiver.of("approval_needed") if r["status"] == 200], "retry")
    attempts = receiver.of("approval_needed")
    assert [r["status"] for r in attempts] == [503, 500, 200] and all(r["valid"] for r in attempts)
    assert len({r["delivery"] for r in attempts}) == 1 and len(hooks) == 1
    failures = await wait_for(lambda: env.rows(phase="notification_failed"), "audited failures")
    assert [(r["attempt"], r["will_retry"], r["error"]) for r in failures] == [
        (1, True, "HTTP 503"), (2, True, "HTTP 500")]
    assert failures[0]["channel_name"] == "ops" and failures[0]["proposal_id"] == proposal["proposal_id"]
    assert receiver.url not in json.dumps(failures)

    env.clock.now += 1801
    gw.moves.expire_due()
    (expired,) = await wait_for(lambda: receiver.of("expired"), "expiry webhook")
    assert expired["valid"] and expired["body"]["proposal"]["state"] == "expired"


async def test_a_receiver_that_refuses_is_not_retried(gated: tuple[Env, Any], receiver: Receiver) -> None:
    env, gw = gated
    receiver.plan = [404]
    await propose_delete(gw)
    (failure,) = await wait_for(lambda: env.rows(phase="notification_failed"), "audited refusal")
    assert failure["will_retry"] is False and failure["error"] == "HTTP 404"
    assert [r["status"] for r in receiver.of("approval_needed")] == [404]


def test_the_example_file_parses() -> None:
    example = Path(__file__).resolve().parent.parent / "notifications.example.yaml"
    config = notify.load(example, {"OPS_HOOK_SECRET": "x", "TEAM_CHAT_WEBHOOK_URL": "https://chat.example.com/h"})
    assert [c.kind for c in config.channels] == ["webhook", "chat"]


def test_a_broken_notifications_file_stops_the_gateway_with_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from gateway.cli import main

    for var in ("GATEWAY_TARGETS_FILE", "GATEWAY_RULES_FILE", "GATEWAY_ROLES_FILE", "GATEWAY_AUDIT_LOG",
                "GATEWAY_NOTIFICATIONS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VC1_USER", "u")
    monkeypatch.setenv("VC1_PASSWORD", "p")
    (tmp_path / "targets.yaml").write_text(yaml.safe_dump({"targets": [
        {"name": "vc1", "host": "127.0.0.1", "credential_env_prefix": "VC1", "insecure": True}]}))
    broken = "notifications:\n  channels:\n    - name: x\n      kind: [\n"
    (tmp_path / "notifications.yaml").write_text(broken)
    assert main(["pending", "list", "--home", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'notifications.yaml'}:5:1: not valid YAML" in err, err


async def test_a_denial_from_the_shell_is_told_too(
    gated: tuple[Env, Any], receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.cli import main

    env, gw = gated
    proposal = await propose_delete(gw)
    for key, value in write_targets(env.tmp / "targets.yaml", {"vc1": env.sim},
                                    {"vc1": {"proposal_ttl_seconds": 1800}}).items():
        monkeypatch.setenv(key, value)
    argv = ["pending", "deny", proposal["proposal_id"], "--home", str(env.tmp)]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    (denied,) = await wait_for(lambda: receiver.of("denied"), "denial from the CLI")
    assert denied["valid"] and denied["body"]["proposal"]["decided_by"].startswith("os:")


async def test_the_pipeline_reports_every_transition_to_its_listeners(
    tmp_path: Path, make_simulator: MakeSimulator,
) -> None:
    """The listener points the notifier relies on: proposed, approved, executing, executed, stale, denied,
    cancelled, expired, each with the proposal as it is after the transition."""
    env = Env(tmp_path, make_simulator(vms=2))
    gw = env.build()
    seen: list[tuple[str, str, str]] = []
    gw.moves.add_lifecycle_listener(lambda event, p: seen.append((event, p.id, p.state)))
    try:
        done = await propose_delete(gw, vm=VM0)
        await gw.actions.approve(done["proposal_id"], HUMAN)
        stale = await propose_delete(gw, vm=VM1)
        si = pyvmomi_connect(env.sim)
        task = find_vm(si, VM1).Rename_Task(newName="renamed-meanwhile")
        wait_until(lambda: read_properties(si, task, "info.state")["info.state"] in ("success", "error"))
        with pytest.raises(GatewayError):
            await gw.calls.call(ADMIN, "confirm_action", {"token": stale["token"]})
        denied = await propose_delete(gw, vm="renamed-meanwhile")
        await gw.actions.deny(denied["proposal_id"], HUMAN)
        cancelled = await propose_delete(gw, vm="renamed-meanwhile")
        await gw.calls.call(ADMIN, "cancel_action", {"token": cancelled["token"]})
        expired = await propose_delete(gw, vm="renamed-meanwhile")
        env.clock.now += 10_000
        gw.moves.expire_due()
    finally:
        await gw.close()
        env.gateways.clear()

    def of(pid: str) -> list[tuple[str, str]]:
        return [(event, state) for event, p, state in seen if p == pid]

    assert of(done["proposal_id"]) == [("proposed", "pending"), ("approved", "approved"),
                                       ("executing", "executing"), ("executed", "executed")]
    # re-resolved before any claim: stale is its own state (gateway/proposals.py)
    assert of(stale["proposal_id"]) == [("proposed", "pending"), ("stale", "stale")]
    assert of(denied["proposal_id"]) == [("proposed", "pending"), ("denied", "denied")]
    assert of(cancelled["proposal_id"]) == [("proposed", "pending"), ("cancelled", "cancelled")]
    assert of(expired["proposal_id"]) == [("proposed", "pending"), ("expired", "expired")]


def test_file_problems_carry_line_and_column_and_repeated_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "n.yaml"
    path.write_text("notifications:\n  channels:\n    - name: ops\n      kind: webhook\n"
                    "      url: https://hooks.example.com/gw\n      secret_env: HOOK_SECRET\n"
                    "      colour: red\n")
    with pytest.raises(ConfigError) as problem:
        notify.load(path, ENV)
    assert f"{path}:7:7: notifications.channels[0] (ops): unknown key 'colour'" in problem.value.message
    path.write_text("notifications:\n  channels:\n    - name: ops\n      kind: webhook\n      kind: chat\n")
    with pytest.raises(ConfigError, match=r"n\.yaml:5:7: the key 'kind' appears twice"):
        notify.load(path, ENV)


async def test_every_signed_audit_checkpoint_goes_to_a_webhook_listing_checkpoint(
        tmp_path: Path, make_simulator: MakeSimulator, receiver: Receiver) -> None:
    """The signed checkpoint note reaches a witness outside the host as it was signed."""
    from gateway.audit.note import open_checkpoint, parse_checkpoint
    from gateway.audit.signing import load_or_create_signing_key

    env = Env(tmp_path, make_simulator(vms=1))
    (tmp_path / "notifications.yaml").write_text(yaml.safe_dump({"notifications": {"channels": [
        {"name": "witness", "kind": "webhook", "url": f"{receiver.url}/hook", "secret_env": "HOOK_SECRET",
         "events": ["checkpoint"]},
        {"name": "ops", "kind": "webhook", "url": f"{receiver.url}/ops", "secret_env": "HOOK_SECRET"},
    ]}}))
    gw = env.build(notify_env={"HOOK_SECRET": SECRET})
    await gw.start()
    try:
        await anyio.to_thread.run_sync(lambda: gw.audit.write({"phase": "call", "tool": "list_vms"}))
        entry = await anyio.to_thread.run_sync(gw.audit.checkpoint)
        assert entry is not None
        delivered = await wait_for(lambda: receiver.of("checkpoint"), "the checkpoint delivery")
    finally:
        await gw.close()
    body = delivered[0]["body"]
    assert delivered[0]["valid"] and body["event"] == "checkpoint"
    assert body["checkpoint"]["note"] == entry["note"] and body["checkpoint"]["tree_size"] == entry["seq"]
    checkpoint = parse_checkpoint(body["checkpoint"]["note"])
    key = load_or_create_signing_key(gw.settings.signing_key_file).public_key()
    assert checkpoint is not None and open_checkpoint(body["checkpoint"]["note"], checkpoint.origin, key)
    assert receiver.of("checkpoint", "/ops") == [], "a channel not listing checkpoint gets none"


async def test_a_shell_decision_is_told_through_the_servers_own_notifications_file(
    gated: tuple[Env, Any], receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server was started with GATEWAY_NOTIFICATIONS_FILE pointing outside GATEWAY_HOME; the shell
    knows nothing of it, and still finds it (the server's audited load names it)."""
    from gateway.cli import main

    env, _ = gated
    elsewhere = env.tmp / "etc" / "notifications.yaml"
    elsewhere.parent.mkdir()
    (env.tmp / "notifications.yaml").rename(elsewhere)
    server = env.build(rules={**PERMISSIVE, "targets": {"vc1": {"require_web_approval": True}}},
                       targets_extra={"proposal_ttl_seconds": 1800}, notify_env={"HOOK_SECRET": SECRET},
                       notifications_file=elsewhere)
    proposal = await propose_delete(server)
    for key, value in write_targets(env.tmp / "targets.yaml", {"vc1": env.sim},
                                    {"vc1": {"proposal_ttl_seconds": 1800}}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GATEWAY_NOTIFICATIONS_FILE", raising=False)
    argv = ["pending", "deny", proposal["proposal_id"], "--home", str(env.tmp)]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    (denied,) = await wait_for(lambda: [d for d in receiver.of("denied")
                                        if d["body"]["proposal"]["proposal_id"] == proposal["proposal_id"]],
                               "denial from the CLI through the server's file")
    assert denied["valid"]
