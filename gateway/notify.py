"""Proposal lifecycle events sent to webhooks and chat channels, never delaying a call.

``notifications.example.yaml`` documents the file and its events. ``Notifier.on_event`` only builds
and queues a message; a task on the server's loop posts it, retrying network errors, 408, 429 and 5xx
with backoff. Webhook bodies are HMAC-SHA256 signed over ``<timestamp>.<body>``; the delivery id stays
the same across retries (deduplicate on it). Each failed attempt is an audit row without the URL: the
secret, and URLs from ``url_env``, never reach a log, a row or an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import httpx2

from gateway.audit.redact import displayable
from gateway.config import ConfigProblems, load_yaml, located
from gateway.errors import AuditUnavailable, ConfigError
from gateway.guard.approvals import approval_view
from gateway.proposals import Proposal

log = logging.getLogger(__name__)

EVENTS: Final = frozenset({
    "approval_needed", "approval", "proposed", "approved", "denied", "cancelled", "expired", "executing",
    "executed", "failed", "stale", "outcome_unknown", "checkpoint",
})
_EVENT_LIST: Final = ", ".join(sorted(EVENTS))
DEFAULT_EVENTS: Final = ("approval_needed", "approval", "approved", "denied", "expired", "failed", "stale",
                         "outcome_unknown")
KINDS: Final = ("webhook", "chat")
_CHANNEL_KEYS: Final = frozenset({"name", "kind", "url", "url_env", "secret_env", "events", "max_attempts",
                                  "backoff_seconds", "timeout_seconds"})
_TOP_KEYS: Final = frozenset({"link_base", "channels"})
MAX_BACKOFF_SECONDS: Final = 300.0
QUEUE_SIZE: Final = 1000
#: deliveries in flight at once (each may be waiting out a backoff)
CONCURRENCY: Final = 16
USER_AGENT: Final = "vsphere-mcp-gateway-notifier"

AuditWrite = Callable[[Mapping[str, Any]], Any]


class Listens(Protocol):
    """What the notifier attaches to: ``Moves.add_lifecycle_listener``."""

    def add_lifecycle_listener(self, fn: Callable[[str, Proposal], None]) -> None: ...


@dataclass(frozen=True)
class Channel:
    name: str
    kind: str
    url: str = field(repr=False)
    secret: bytes | None = field(default=None, repr=False)
    events: frozenset[str] = frozenset(DEFAULT_EVENTS)
    max_attempts: int = 5
    backoff_seconds: float = 2.0
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class NotificationConfig:
    channels: tuple[Channel, ...] = ()
    link_base: str | None = None

    def link(self, proposal_id: str) -> str:
        """Where a human opens this proposal's card on the web page."""
        return f"{(self.link_base or '').rstrip('/')}/ui#proposal={proposal_id}"


# ------------------------------------------------------------------------------------ configuration


def load(path: Path, environ: Mapping[str, str]) -> NotificationConfig:
    """Parse ``path`` with the strict loader (duplicate keys refused); a missing file is no channel.
    ConfigError lists every problem as ``file:line:column: ...`` with its fix."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return NotificationConfig()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the notifications file ({exc.strerror}); fix its "
                          "permissions or set GATEWAY_NOTIFICATIONS_FILE") from None
    problems: list[str] = []
    data = load_yaml(text, str(path), problems)
    config = parse(data, environ, problems, str(path))
    if problems:
        raise ConfigProblems(problems)
    return config


def parse(data: Any, environ: Mapping[str, str], problems: list[str], source: str) -> NotificationConfig:
    """The ``notifications:`` document as a value; each problem appended to ``problems`` as a sentence
    starting with its ``file:line:column`` (when ``data`` came from ``load_yaml``)."""
    if data is None:
        return NotificationConfig()
    if not isinstance(data, dict) or set(data) != {"notifications"}:
        problems.append(f"{located(source, data)}: the file must hold one top-level key, 'notifications:'")
        return NotificationConfig()
    section = data["notifications"] or {}
    if not isinstance(section, dict):
        problems.append(f"{located(source, data, 'notifications')}: 'notifications' must be a mapping with "
                        "'channels' (and 'link_base')")
        return NotificationConfig()
    for key in sorted(set(section) - _TOP_KEYS, key=str):
        problems.append(f"{located(source, section, key)}: notifications: unknown key '{key}'; allowed keys "
                        f"are {', '.join(sorted(_TOP_KEYS))}")
    link_base = section.get("link_base")
    if link_base is not None and not (isinstance(link_base, str) and _url_problem(link_base) is None):
        problems.append(f"{located(source, section, 'link_base')}: notifications.link_base must be the web "
                        "page's https:// address, e.g. https://gateway.example.com:8443")
        link_base = None
    raw_channels = section.get("channels") or []
    if not isinstance(raw_channels, list):
        problems.append(f"{located(source, section, 'channels')}: notifications.channels must be a list of "
                        "channels")
        raw_channels = []
    channels: list[Channel] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw_channels):
        where = functools.partial(_where, source, raw_channels, index, entry)
        channel = _parse_channel(entry, environ, problems, where)
        if channel is None:
            continue
        if channel.name in seen:
            problems.append(f"{where('name')}: channel name '{channel.name}' is used twice; names must be "
                            "unique")
            continue
        seen.add(channel.name)
        channels.append(channel)
    return NotificationConfig(tuple(channels), link_base)


def _where(source: str, channels: Any, index: int, entry: Any, key: str | None = None) -> str:
    """``file:line:column: notifications.channels[i] (name)`` of ``key`` in a channel (or of the channel)."""
    name = entry.get("name") if isinstance(entry, dict) else None
    label = f"notifications.channels[{index}]" + (f" ({name})" if isinstance(name, str) and name else "")
    at = located(source, entry, key) if key is not None and isinstance(entry, dict) and key in entry else None
    return f"{at or located(source, channels, index)}: {label}"


def _url_problem(url: str) -> str | None:
    """Why ``url`` may not receive notifications: https anywhere, plain http only on loopback."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "must be an https:// URL"
    if parts.scheme == "http":
        try:
            loopback = ipaddress.ip_address(parts.hostname).is_loopback
        except ValueError:
            loopback = parts.hostname == "localhost"
        if not loopback:
            return "must use https:// (plain http is allowed only to a loopback address)"
    return None


Where = Callable[..., str]


def _number(entry: Mapping[str, Any], key: str, default: float, low: float, high: float, where: Where,
            problems: list[str], *, integer: bool = False) -> float:
    value = entry.get(key, default)
    wrong_kind = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if wrong_kind or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        problems.append(f"{where(key)}: '{key}' must be {kind} between {low:g} and {high:g}")
        return default
    return float(value)


def _parse_channel(
    entry: Any, environ: Mapping[str, str], problems: list[str], where: Where,
) -> Channel | None:
    if not isinstance(entry, dict):
        problems.append(f"{where()}: each channel must be a mapping with name, kind and url")
        return None
    before = len(problems)
    for key in sorted(set(entry) - _CHANNEL_KEYS, key=str):
        allowed = ", ".join(sorted(_CHANNEL_KEYS))
        problems.append(f"{where(key)}: unknown key '{key}'; allowed keys are {allowed}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{where('name')}: 'name' is required (a short label used in audit rows)")
        name = "?"
    kind = entry.get("kind")
    if kind not in KINDS:
        problems.append(f"{where('kind')}: 'kind' must be one of {', '.join(KINDS)}")
    url = _channel_url(entry, environ, problems, where)
    secret: bytes | None = None
    secret_env = entry.get("secret_env")
    if secret_env is not None:
        if not isinstance(secret_env, str) or not secret_env.endswith("_SECRET"):
            problems.append(f"{where('secret_env')}: 'secret_env' must name an environment variable ending "
                            "in _SECRET")
        elif not environ.get(secret_env):
            problems.append(f"{where('secret_env')}: the environment variable {secret_env} is not set; set "
                            "it to the shared HMAC secret (e.g. `openssl rand -hex 32`) in the gateway's "
                            "environment")
        else:
            secret = environ[secret_env].encode()
    elif kind == "webhook":
        problems.append(f"{where()}: a webhook channel needs 'secret_env' (the variable holding its HMAC "
                        "secret); unsigned generic webhooks are refused")
    events = entry.get("events", list(DEFAULT_EVENTS))
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        problems.append(f"{where('events')}: 'events' must be a non-empty list of: {_EVENT_LIST}")
        events = list(DEFAULT_EVENTS)
    for unknown in sorted(set(events) - EVENTS):
        problems.append(f"{where('events')}: unknown event '{unknown}'; events are {_EVENT_LIST}")
    attempts = _number(entry, "max_attempts", 5, 1, 20, where, problems, integer=True)
    backoff = _number(entry, "backoff_seconds", 2.0, 0.01, MAX_BACKOFF_SECONDS, where, problems)
    timeout = _number(entry, "timeout_seconds", 10.0, 0.1, 120, where, problems)
    if len(problems) > before or url is None:
        return None
    return Channel(name=name, kind=str(kind), url=url, secret=secret, events=frozenset(events),
                   max_attempts=int(attempts), backoff_seconds=backoff, timeout_seconds=timeout)


def _channel_url(entry: Mapping[str, Any], environ: Mapping[str, str], problems: list[str],
                 where: Where) -> str | None:
    url, url_env = entry.get("url"), entry.get("url_env")
    if (url is None) == (url_env is None):
        problems.append(f"{where('url' if url is not None else None)}: set exactly one of 'url' and "
                        "'url_env' (use url_env when the URL holds a secret, as Slack and Teams webhook URLs "
                        "do)")
        return None
    if url_env is not None:
        if not isinstance(url_env, str) or not url_env.endswith("_URL"):
            problems.append(f"{where('url_env')}: 'url_env' must name an environment variable ending in _URL")
            return None
        url = environ.get(url_env)
        if not url:
            problems.append(f"{where('url_env')}: the environment variable {url_env} is not set; set it to "
                            "the webhook URL")
            return None
        source, key = f"the URL in {url_env}", "url_env"
    else:
        source, key = "'url'", "url"
    if not isinstance(url, str):
        problems.append(f"{where(key)}: 'url' must be a string")
        return None
    problem = _url_problem(url)
    if problem:
        problems.append(f"{where(key)}: {source} {problem}")
        return None
    return url


# ------------------------------------------------------------------------------------------ messages


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Gateway-Signature`` value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def proposal_facts(p: Proposal) -> dict[str, Any]:
    """What a notification says about a proposal: never its token, token hash or arguments; redacted
    and bounded as every text leaving the process is (``gateway.audit.redact.displayable``)."""
    error = p.error or {}
    facts: dict[str, Any] = displayable({
        "proposal_id": p.id, "state": p.state, "target": p.target, "target_host": p.target_host,
        "tool": p.tool, "summary": p.plan_summary, "affected": p.affected, "requested_by": p.caller,
        "requires_human_approval": p.require_web_approval, "created_at": _iso(p.created_at),
        "expires_at": _iso(p.expires_at), "decided_by": p.approved_by, "outcome": p.outcome,
        "error_code": error.get("code") if isinstance(error, dict) else None,
        **approval_view(p),
    })
    return facts


_TITLES: Final = {
    "approval_needed": "Approval needed: {tool} on {target}",
    "proposed": "Proposed: {tool} on {target}",
    "approval": "{approvals_progress}, waiting for more: {tool} on {target}",
    "approved": "Approved by {decided_by}: {tool} on {target}",
    "denied": "Denied by {decided_by}: {tool} on {target}",
    "cancelled": "Cancelled: {tool} on {target}",
    "expired": "Expired without a decision: {tool} on {target}",
    "executing": "Running: {tool} on {target}",
    "executed": "Done: {tool} on {target}",
    "failed": "Failed ({outcome}): {tool} on {target}",
    "stale": "Stale, not run: {tool} on {target}",
    "outcome_unknown": "Outcome unknown: {tool} on {target}",
}


def _chat_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chat_message(event: str, facts: Mapping[str, Any], link: str) -> dict[str, Any]:
    """A Slack- or Teams-style incoming webhook body: title, target, summary, link to the card."""
    shown = {k: "-" if v is None else v for k, v in facts.items()}
    title = _chat_escape(_TITLES[event].format_map(shown))
    lines = [
        f"*{title}*",
        _chat_escape(str(facts["summary"])),
        f"Target: {_chat_escape(str(facts['target']))} ({_chat_escape(str(facts['target_host']))})",
        f"Requested by {_chat_escape(str(facts['requested_by']))}; proposal {facts['proposal_id']}",
    ]
    lines += _approval_lines(facts)
    if event == "approval_needed":
        lines.append(f"Waits for a human until {facts['expires_at']}")
    lines.append(f"Open: {link}")
    return {"title": title, "text": "\n".join(lines), "target": facts["target"],
            "summary": facts["summary"], "link": link}


def _approval_lines(facts: Mapping[str, Any]) -> list[str]:
    """The blast radius, the approvals so far with their reasons, and a denial's reason, as chat lines."""
    lines = []
    blast = facts.get("blast_radius") or {}
    for obj in (blast.get("objects") or [])[:10]:
        disks = ", ".join(f"{d.get('label')} {d.get('size')} on {d.get('datastore')}"
                          for d in obj.get("disks") or [])
        bits = [f"{obj.get('power_state')}", f"host {obj.get('host')}"]
        if "snapshot_count" in obj:
            bits.append(f"{obj['snapshot_count']} snapshot(s)")
        lines.append(_chat_escape(f"Affects {obj.get('name')} ({'; '.join(bits)})" + (f": {disks}" if disks
                                                                                    else "")))
    if blast.get("count", 0) > 10:
        lines.append(f"... {blast['count']} objects in all")
    if facts.get("approvals_progress"):
        lines.append(_chat_escape(str(facts["approvals_progress"])))
    for a in facts.get("approvals") or []:
        why = f": {a.get('reason')}" if a.get("reason") else ""
        lines.append(_chat_escape(f"Approved by {a.get('by')}{why}"))
    if facts.get("deny_reason"):
        lines.append(_chat_escape(f"Reason for the denial: {facts['deny_reason']}"))
    return lines


@dataclass
class Delivery:
    channel: Channel
    event: str
    proposal_id: str
    target: str
    body: bytes
    delivery_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def headers(self, now: float) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   "X-Gateway-Event": self.event, "X-Gateway-Delivery": self.delivery_id}
        if self.channel.secret is not None:
            timestamp = str(int(now))
            headers["X-Gateway-Timestamp"] = timestamp
            headers["X-Gateway-Signature"] = signature(self.channel.secret, timestamp, self.body)
        return headers


def events_for(event: str, proposal: Proposal) -> tuple[str, ...]:
    """The notification events one lifecycle transition raises (a gated proposal also needs a human)."""
    if event == "proposed" and proposal.require_web_approval:
        return ("proposed", "approval_needed")
    return (event,)


# ------------------------------------------------------------------------------------------ delivery


class Notifier:
    """Queues lifecycle events as deliveries and posts them from a background task with retries."""

    def __init__(self, config: NotificationConfig, audit: AuditWrite, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.audit = audit
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Delivery] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._client: httpx2.AsyncClient | None = None
        self._slots = asyncio.Semaphore(CONCURRENCY)

    @property
    def enabled(self) -> bool:
        return bool(self.config.channels)

    def attach(self, gateway: Listens) -> None:
        gateway.add_lifecycle_listener(self.on_event)

    async def start(self) -> None:
        """Begin delivering (on the running loop); events seen before are dropped with a warning."""
        if not self.enabled or self._worker is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue(QUEUE_SIZE)
        self._client = httpx2.AsyncClient(follow_redirects=False, trust_env=False)
        self._worker = asyncio.create_task(self._run(), name="notifier")

    async def close(self, drain_seconds: float = 5.0) -> None:
        """Deliver what is queued for at most ``drain_seconds``, then stop (pending retries are dropped)."""
        if self._worker is None:
            return
        assert self._queue is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_seconds):
                while not self._queue.empty() or self._inflight:
                    await asyncio.sleep(0.05)
        for task in [self._worker, *self._inflight]:
            task.cancel()
        await asyncio.gather(self._worker, *self._inflight, return_exceptions=True)
        self._worker = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- the listener: any thread, never blocks
    def on_event(self, event: str, proposal: Proposal) -> None:
        if not self.enabled:
            return
        deliveries = self._deliveries(event, proposal)
        if not deliveries:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            log.warning("notifications for %s of proposal %s dropped: the notifier is not running",
                        event, proposal.id)
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for delivery in deliveries:
            if running is loop:
                self._enqueue(delivery)
            else:
                loop.call_soon_threadsafe(self._enqueue, delivery)

    def on_checkpoint(self, entry: Mapping[str, Any]) -> None:
        """A signed audit checkpoint (``gateway.audit.witness.CheckpointPublisher``): queued for each
        webhook channel listing ``checkpoint``; any thread, never blocks."""
        loop = self._loop
        if not self.enabled or loop is None or loop.is_closed() or not isinstance(entry.get("note"), str):
            return
        facts = {"note": entry["note"], "tree_size": entry.get("tree_size"), "root": entry.get("root")}
        for channel in self.config.channels:
            if channel.kind != "webhook" or "checkpoint" not in channel.events:
                continue
            delivery = Delivery(channel, "checkpoint", "", "", b"")
            payload = {"event": "checkpoint", "delivery_id": delivery.delivery_id,
                       "sent_at": _iso(self.clock()), "checkpoint": facts}
            delivery.body = json.dumps(payload, sort_keys=True).encode()
            loop.call_soon_threadsafe(self._enqueue, delivery)

    def _deliveries(self, event: str, proposal: Proposal) -> list[Delivery]:
        facts = proposal_facts(proposal)
        link = self.config.link(proposal.id)
        out = []
        for name in events_for(event, proposal):
            for channel in self.config.channels:
                if name not in channel.events:
                    continue
                if channel.kind == "chat":
                    payload = chat_message(name, facts, link)
                else:
                    payload = {"event": name, "sent_at": _iso(self.clock()), "link": link, "proposal": facts}
                delivery = Delivery(channel, name, proposal.id, proposal.target, b"")
                if channel.kind == "webhook":
                    payload["delivery_id"] = delivery.delivery_id
                delivery.body = json.dumps(payload, sort_keys=True, default=str).encode()
                out.append(delivery)
        return out

    def _enqueue(self, delivery: Delivery) -> None:
        assert self._queue is not None
        try:
            self._queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self._spawn(self._record(delivery, 0, "queue full: the receivers are too slow", False))

    # -- the background side
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            delivery = await self._queue.get()
            await self._slots.acquire()
            self._spawn(self._deliver(delivery))

    async def _deliver(self, delivery: Delivery) -> None:
        try:
            channel = delivery.channel
            for attempt in range(1, channel.max_attempts + 1):
                error, final = await self._attempt(delivery)
                if error is None:
                    return
                will_retry = not final and attempt < channel.max_attempts
                await self._record(delivery, attempt, error, will_retry)
                if not will_retry:
                    return
                await asyncio.sleep(min(MAX_BACKOFF_SECONDS, channel.backoff_seconds * 2 ** (attempt - 1)))
        finally:
            self._slots.release()

    async def _attempt(self, delivery: Delivery) -> tuple[str | None, bool]:
        """(None, _) when delivered; otherwise (why, whether retrying is pointless)."""
        assert self._client is not None
        try:
            reply = await self._client.post(delivery.channel.url, content=delivery.body,
                                            headers=delivery.headers(self.clock()),
                                            timeout=delivery.channel.timeout_seconds)
        except httpx2.HTTPError as exc:  # the message may quote the URL, which may hold a secret
            return f"{type(exc).__name__} (no answer)", False
        if 200 <= reply.status_code < 300:
            return None, False
        retryable = reply.status_code in (408, 429) or reply.status_code >= 500
        return f"HTTP {reply.status_code}", not retryable

    async def _record(self, delivery: Delivery, attempt: int, error: str, will_retry: bool) -> None:
        row = {"phase": "notification_failed", "caller": "gateway", "surface": "server",
               "channel_name": delivery.channel.name, "channel_kind": delivery.channel.kind,
               "event": delivery.event, "delivery_id": delivery.delivery_id,
               "proposal_id": delivery.proposal_id, "target": delivery.target, "attempt": attempt,
               "will_retry": will_retry, "error": error}
        log.warning("notification %s of proposal %s to channel %s failed (attempt %d): %s%s", delivery.event,
                    delivery.proposal_id, delivery.channel.name, attempt, error,
                    "; retrying" if will_retry else "; giving up")
        try:
            await asyncio.to_thread(self.audit, row)
        except AuditUnavailable:
            log.error("the audit log could not record a failed notification of proposal %s",
                      delivery.proposal_id)


def notifier_for(notifications_file: Path, environ: Mapping[str, str], audit: AuditWrite,
                 listeners: Sequence[Listens] = ()) -> Notifier:
    """Load the channels (ConfigError on a bad file) and attach the notifier to each gateway given."""
    notifier = Notifier(load(notifications_file, environ), audit)
    for gateway in listeners:
        notifier.attach(gateway)
    return notifier
