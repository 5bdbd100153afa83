"""Idempotency keys on the call path: a repeated key gets the first call's outcome, never a second run.

What a key means is ``guard.idempotency_rules``; where keys live, ``store.idempotency_keys``. The first
call runs in a task of its own, so a dropped client does not cancel it; a retry of a running call waits
for it (awaited here, polled on another replica)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final, NoReturn, Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gateway.answer import Answer
from gateway.errors import (
    GatewayError,
    IdempotencyConflict,
    IdempotencyInProgress,
    OutcomeUnknown,
    StateUnavailable,
    error_of,
)
from gateway.guard import confirm
from gateway.guard.callers import key_of
from gateway.guard.idempotency_rules import KEY_FIELD, Step, decide, keeps_error
from gateway.server.base.audit_trail import AuditTrail
from gateway.server.base.context import (
    CallContext,
    Handler,
    ProgressSink,
    off_loop,
    redact_args,
    target_label,
)
from gateway.store.idempotency_keys import KeyRecord, KeyTable
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category

log = logging.getLogger(__name__)

#: how often a retry on another replica reads the store while the first call runs
POLL_SECONDS: Final = 0.25
#: how long a retry waits for the first call still running before it reports idempotency_in_progress
WAIT_SECONDS: Final = 600.0
#: how many claims pass between two sweeps of keys past the window
SWEEP_EVERY: Final = 256


class Instances(Protocol):
    """This process's claim id (``acquire``) and whether the process behind another id runs."""

    def acquire(self) -> str: ...

    def alive(self, instance_id: str) -> bool: ...


class Idempotency:
    """Keys of write and destructive calls: claim, run once, keep the outcome, replay it."""

    def __init__(self, keys: KeyTable, trail: AuditTrail, instance: Instances, *, window: float,
                 clock: Callable[[], float] = time.time, wait_seconds: float = WAIT_SECONDS) -> None:
        self.keys = keys
        self.trail = trail
        #: this process's claim id, and whether the process behind another one still runs
        self.instance = instance
        self._claims = 0
        self.window = window
        self.clock = clock
        self.wait_seconds = wait_seconds
        #: first calls running in this process, by (caller, key): a retry here awaits the very task
        self._running: dict[tuple[str, str], asyncio.Task[Answer]] = {}

    def wrap(self, spec: ToolSpec, handler: Handler) -> Handler:
        """``handler`` for ``spec``, keyed when a call carries a key (reads are never keyed)."""
        if spec.kind is Category.READ or spec.target_mode == "none":
            return handler

        async def keyed(ctx: CallContext, args: dict[str, Any], progress: ProgressSink | None) -> Answer:
            key = args.pop(KEY_FIELD, None)
            if key is None:
                result = await handler(ctx, args, progress)
                return await _answer_of(result)
            return await self._keyed(ctx, str(key), args, progress, handler)

        return keyed

    async def _keyed(self, ctx: CallContext, secret: str, args: dict[str, Any],
                     progress: ProgressSink | None, handler: Handler) -> Answer:
        key = key_id(secret)
        ctx = replace(ctx, idempotency_key=key[:16])  # rows name the key by its digest: it opens the outcome
        seal = _Seal(secret)
        caller, tool = key_of(ctx.principal), ctx.spec.name  # keys are per caller key, never per name
        digest = confirm.args_digest(tool, str(args.get("target")), args)
        for _attempt in range(5):  # a lost claim race reads the key again
            now = self.clock()
            held = await off_loop(self.keys.get, caller, key)
            alive = held is None or not held.running or held.owner is None or await off_loop(
                self.instance.alive, held.owner)
            seen = held.seen(alive) if held else None
            step = decide(seen, tool=tool, digest=digest, now=now, window=self.window)
            if step in (Step.RUN, Step.TAKE_OVER):
                await self._sweep(now)
                owner = await off_loop(self.instance.acquire)
                claim = KeyRecord(caller, key, tool, digest, True, now, correlation_id=ctx.correlation_id,
                                  owner=owner)
                replacing = held.created_at if held is not None and step is Step.TAKE_OVER else None
                if await off_loop(self.keys.claim, claim, replacing=replacing):
                    return await self._first(ctx, claim, seal, args, progress, handler)
                continue
            assert held is not None
            if step is Step.CONFLICT:
                await self._refuse(ctx, args, IdempotencyConflict(
                    f"this idempotency key was used for another call ({held.tool}, other arguments) "
                    "within the window; use a new key for a new call, the same key only to retry that one"))
            if step is Step.ORPHANED:
                held = await self._orphaned(held, seal)
            if step is Step.WAIT:
                held = await self._wait_for(held)
                if held is None:  # the first call changed nothing and released the key: run now
                    continue
                if held.running:
                    await self._refuse(ctx, args, IdempotencyInProgress(
                        "the call first made with this idempotency key is still running; retry with the "
                        "same key later (it will not run twice), or check get_tasks"))
            return await self._replay(ctx, held, seal, args)
        raise StateUnavailable("the idempotency key changed hands too often; retry with the same key")

    async def _first(self, ctx: CallContext, claim: KeyRecord, seal: _Seal, args: dict[str, Any],
                     progress: ProgressSink | None, handler: Handler) -> Answer:
        task = asyncio.get_running_loop().create_task(self._run(ctx, claim, seal, args, progress, handler))
        where = (claim.caller, claim.key)
        self._running[where] = task

        def done(t: asyncio.Task[Answer]) -> None:
            self._running.pop(where, None)
            if not t.cancelled():
                t.exception()  # retrieved: the caller that gave up on it does not need it logged twice

        task.add_done_callback(done)
        return await asyncio.shield(task)  # a dropped client stops waiting; the change runs on

    async def _run(self, ctx: CallContext, claim: KeyRecord, seal: _Seal, args: dict[str, Any],
                   progress: ProgressSink | None, handler: Handler) -> Answer:
        try:
            result = await handler(ctx, args, progress)
            answer = await _answer_of(result)
        except GatewayError as exc:
            if keeps_error(exc.code):
                await self._keep(claim, seal.close(Answer.of({"error": exc.to_wire()}).text), failed=True)
            else:
                await off_loop(self.keys.release, claim.caller, claim.key, claim.created_at)
            raise
        except BaseException:
            unknown = OutcomeUnknown("the change was interrupted; check the objects and get_tasks before "
                                     "doing anything again")
            kept = seal.close(Answer.of({"error": unknown.to_wire()}).text)
            await asyncio.shield(self._keep(claim, kept, failed=True))
            raise
        await self._keep(claim, await asyncio.to_thread(seal.close, answer.text), failed=False)
        return answer

    async def _orphaned(self, held: KeyRecord, seal: _Seal) -> KeyRecord:
        """The record of a first call whose process stopped before it ended: its outcome is unknown (kept
        so, never run again)."""
        unknown = OutcomeUnknown(
            "the process that ran the first call with this idempotency key stopped before it "
            "finished; whether the change happened is unknown: check the objects (get_tasks) before calling "
            "again with a new key")
        text = seal.close(Answer.of({"error": unknown.to_wire()}).text)
        await self._keep(held, text, failed=True)
        return replace(held, running=False, outcome=text, failed=True)

    async def _sweep(self, now: float) -> None:
        """Now and then, forget finished keys past the window (the table stays small)."""
        self._claims += 1
        if self._claims % SWEEP_EVERY == 1:
            try:
                await off_loop(self.keys.sweep, now - self.window)
            except GatewayError:
                log.warning("idempotency keys not swept", exc_info=True)

    async def _keep(self, claim: KeyRecord, text: str, *, failed: bool) -> None:
        try:
            await off_loop(self.keys.finish, claim.caller, claim.key, claim.created_at, text, failed=failed,
                           now=self.clock())
        except GatewayError:
            # the outcome stands; a retry will wait and then report idempotency_in_progress, never rerun
            log.exception("the outcome of idempotency key %r could not be kept", claim.key)

    async def _wait_for(self, held: KeyRecord) -> KeyRecord | None:
        """The key's record once its first call ended (None if it released the key), or as it stands
        when the wait ends."""
        local = self._running.get((held.caller, held.key))
        if local is not None:
            await asyncio.wait({local}, timeout=self.wait_seconds)
            return await off_loop(self.keys.get, held.caller, held.key)
        deadline = time.monotonic() + self.wait_seconds
        current: KeyRecord | None = held
        while current is not None and current.running and current.created_at == held.created_at:
            if time.monotonic() >= deadline:
                return current
            await asyncio.sleep(POLL_SECONDS)
            current = await off_loop(self.keys.get, held.caller, held.key)
        return current if current is not None and current.created_at == held.created_at else None

    async def _replay(self, ctx: CallContext, held: KeyRecord, seal: _Seal, args: dict[str, Any]) -> Answer:
        text = await asyncio.to_thread(seal.open, held.outcome)
        value = await asyncio.to_thread(json.loads, text)
        error = value.get("error") if held.failed and isinstance(value, dict) else None
        await self.trail.record(ctx.row(
            "retry", target=target_label(args), args=redact_args(ctx.spec, args),
            replay_of=held.correlation_id,
            outcome=error.get("code") if isinstance(error, dict) else "ok",
            result=None if held.failed else Answer(value, text)))
        if isinstance(error, dict):
            raise error_of(error)
        return Answer(value, text)

    async def _refuse(self, ctx: CallContext, args: dict[str, Any], exc: GatewayError) -> NoReturn:
        await self.trail.record(ctx.row("retry", target=target_label(args), args=redact_args(ctx.spec, args),
                                        outcome=exc.code, error_code=exc.code, error=exc.message))
        raise exc


def key_id(secret: str) -> str:
    """What the store keeps of a key: its sha256 (the key itself opens the outcome kept for it)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class _Seal:
    """Outcomes are kept sealed with a key derived from the caller's idempotency key, which the store
    never holds: a proposal's answer carries its confirmation token, and nobody reading the database may
    confirm with it (the proposal table keeps only the token's hash, for the same reason)."""

    def __init__(self, secret: str) -> None:
        self._aead = AESGCM(hmac.new(secret.encode("utf-8"), b"gateway idempotency outcome",
                                     hashlib.sha256).digest())

    def close(self, text: str) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, text.encode("utf-8", "surrogatepass"), None)
        return base64.b64encode(nonce + sealed).decode("ascii")

    def open(self, kept: str | None) -> str:
        if not kept:
            return "{}"
        raw = base64.b64decode(kept)
        return self._aead.decrypt(raw[:12], raw[12:], None).decode("utf-8", "surrogatepass")


async def _answer_of(result: dict[str, Any] | Answer) -> Answer:
    return result if isinstance(result, Answer) else await asyncio.to_thread(Answer.cleaned, result)


def key_from_meta(meta: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with the request's ``_meta`` key filled in when the argument is absent (the argument wins)."""
    key = meta.get(KEY_FIELD) if isinstance(meta, dict) else None
    if key is None or args.get(KEY_FIELD) is not None:
        return args
    return {**args, KEY_FIELD: key}

