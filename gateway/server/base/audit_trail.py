"""The audit trail of one process: the ONE owner of every way an audit row is written.

Contract (``AuditTrail``): every row goes to the sink within ``AUDIT_DEADLINE_SECONDS``, in a worker
thread, never on the event loop. Two kinds of row, two promises:

- a row that gates something (``record``, ``record_answer``, ``intent``): written now, or
  ``AuditUnavailable`` is raised and the caller refuses what it was about to do (a refused intent
  leaves a ``refused`` row waiting to say so);
- a row of something that already happened (``record_outcome``, ``write_or_wait``): never raises;
  a row the sink cannot take now waits in memory, in order (the server reports unready), and is
  appended by ``flush_waiting`` once the sink is writable again. While ``MAX_WAITING_OUTCOMES`` rows
  wait, no new change runs (``intent``, ``refuse_unless_writable``).

Reads' rows are committed in groups: the ``call`` row of a read tool's call (``reading`` is set for
it by ``server.call.arrival``) goes through the sink's ``write_grouped`` when it has one, so its answer
is sent once the row is in the log (appended and chained: a crash of the process loses nothing),
without waiting for the disk flush, which the sink makes for a group of rows at once (the exact
promise: ``AuditSink.write_grouped``, ``PgAuditSink.write_grouped``). Every other row (a change's,
a refusal's, a proposal's move) is on the disk before ``record`` returns, and takes the grouped rows
before it there too.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from gateway import tracing
from gateway.answer import Answer
from gateway.audit.schedule import Checkpointing, CheckpointTimer, IntervalSettings, checkpoint_interval
from gateway.audit.syslog_forward import Forwarder, forwarder_for
from gateway.errors import AuditUnavailable
from gateway.server.base import reloads
from gateway.server.base.context import off_loop
from gateway.store.base import AuditWriter

log = logging.getLogger(__name__)

T = TypeVar("T")
#: how long one audit append may take before the call is refused
AUDIT_DEADLINE_SECONDS: Final = 5.0
#: outcome rows kept in memory while the audit cannot take them; past this, new changes are refused
MAX_WAITING_OUTCOMES: Final = 1000
#: set while a read tool's call runs (``server.call.arrival``): its ``call`` row is committed in a group
reading: contextvars.ContextVar[bool] = contextvars.ContextVar("gateway_reading", default=False)
#: the phase of a call's own row (a read's, answered once it is written)
CALL_PHASE: Final = "call"


@runtime_checkable
class GroupCommit(Protocol):
    """A sink that can append a row now and flush it to the disk with a group (the two sinks)."""

    def write_grouped(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]: ...


class AuditTrail:
    """Every audit row of this process, written through one sink (see the module's contract)."""

    def __init__(self, audit: AuditWriter, where: Path | str) -> None:
        self.audit = audit
        #: the sink's grouped append (``GroupCommit``), None when it has none: every row is flushed alone
        self._grouped = audit.write_grouped if isinstance(audit, GroupCommit) else None
        #: the log named in refusals (the file, or the table's label)
        self.where = where
        self.waiting: collections.deque[dict[str, Any]] = collections.deque()
        self._flushing = threading.Lock()
        #: called with each row as written (stamped: seq, prev, hash), in the writing thread, after the
        #: sink took it: the one hook for forwarding rows elsewhere (a log pipeline). A listener must not
        #: block or raise; a failure is logged and never fails the row
        self.written: list[Callable[[Mapping[str, Any]], None]] = []
        #: the syslog forwarder (``forward_to_syslog``), one of the ``written`` listeners; stopped at close
        self.forwarder: Forwarder | None = None

    def write_quietly(self, row: Mapping[str, Any]) -> None:
        """A row written before the gateway exists (targets.yaml at start): lost only if the audit is down."""
        try:
            self.write_row(row)
        except AuditUnavailable:
            log.error("the audit log could not record the load of %s", row.get("path"))

    def writable(self) -> bool:
        return self.audit.writable()

    async def record(self, row: Mapping[str, Any]) -> None:
        """Append one audit row (every async audit write comes here): in a worker thread, within a
        deadline. Raises ``AuditUnavailable`` when it cannot be written: the call is refused."""
        await self._off_loop(lambda: self.write_row(row))

    async def record_answer(self, row: Mapping[str, Any], result: Any) -> Answer:
        """Encode ``result`` once (``Answer.cleaned``; an ``Answer`` is already encoded) and append
        ``row`` fingerprinting that answer, in one worker thread (the encoding of a big listing never
        runs on the event loop); ``record``'s deadline and refusal. Returns the answer to send."""

        def encode_and_write() -> Answer:
            answer = result if isinstance(result, Answer) else Answer.cleaned(result)
            self.write_row({**row, "result": answer})
            return answer

        return await self._off_loop(encode_and_write)

    async def _off_loop(self, write: Callable[[], T]) -> T:
        # ``asyncio.to_thread`` without its coroutine: the executor's future is awaited directly under a
        # timeout scope, with no task of its own (one hop less on every answer); the context goes along
        # as ``to_thread`` takes it (the trace, ``reading``)
        future = asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, write)
        try:
            async with asyncio.timeout(AUDIT_DEADLINE_SECONDS + 1.0):
                return await future
        except TimeoutError:
            raise AuditUnavailable(
                f"audit log {self.where} did not take the row within "
                f"{AUDIT_DEADLINE_SECONDS:g}s "
                "(a held lock or a slow disk); nothing more was done. Retry, and see the gateway log"
            ) from None

    async def refuse_unless_writable(self, row: Mapping[str, Any]) -> None:
        """Refuse a change before its first vSphere read while the audit cannot take rows (what
        ``readiness`` reports: the sink says it is not writable, or too many rows wait): its intent
        could not be written anyway. ``row`` (phase ``refused``) waits for the audit, like an intent's."""
        if len(self.waiting) < MAX_WAITING_OUTCOMES and await off_loop(self.audit.writable):
            return
        exc = AuditUnavailable(
            f"audit log {self.where} cannot take rows now (/readyz says why); nothing was "
            "read from or sent to vSphere. Retry once the audit is writable again"
        )
        reason = "the audit was not writable; nothing was read from or sent to vSphere"
        self.wait({**row, "error_code": exc.code, "reason": reason})
        raise exc

    async def intent(self, row: Mapping[str, Any]) -> None:
        """The durable row a change writes before its vSphere call. If it cannot be written the change is
        refused (``AuditUnavailable``), and a ``refused`` row waits to say so once the audit is back.
        While ``MAX_WAITING_OUTCOMES`` rows already wait, every new change is refused."""
        if len(self.waiting) >= MAX_WAITING_OUTCOMES:
            raise AuditUnavailable(
                f"{len(self.waiting)} audit rows of finished changes wait for the audit log "
                f"{self.where}; no new change runs until it takes them"
            )
        try:
            await self.record(row)
        except AuditUnavailable as exc:
            self.wait(
                {
                    **row,
                    "phase": "refused",
                    "error_code": exc.code,
                    "reason": "the intent row could not be written; nothing was sent to vSphere",
                }
            )
            raise

    async def record_outcome(self, row: Mapping[str, Any]) -> None:
        """Append the row of something that already happened. Never raises and never holds the caller
        past the deadline: a row the audit cannot take now waits (see ``flush_waiting``)."""
        if self.waiting:
            self.wait(row)
            return
        try:
            await self.record(row)
        except AuditUnavailable:
            log.error(
                "audit row of a finished change (%s) waits until the audit log is writable",
                row.get("phase"),
            )
            self.wait(row)

    def write_or_wait(self, row: Mapping[str, Any]) -> None:
        """``record_outcome`` for synchronous callers (worker threads, the CLI)."""
        self.flush_waiting()
        if self.waiting:
            self.wait(row)
            return
        try:
            self.write_row(row)
        except AuditUnavailable:
            log.error("audit row (%s) waits until the audit log is writable", row.get("phase"))
            self.wait(row)

    def write_now(self, row: Mapping[str, Any]) -> None:
        """Append ``row`` now, after the rows waiting, or raise ``AuditUnavailable`` (a load that must
        not apply unrecorded: roles.yaml)."""
        self.flush_waiting()
        if self.waiting:
            raise AuditUnavailable(f"audit log {self.where} cannot take rows now; see the server log")
        self.write_row(row)

    def wait(self, row: Mapping[str, Any]) -> None:
        self.waiting.append({**tracing.with_trace_id(row), "delayed": True, "row_id": uuid.uuid4().hex})

    def flush_waiting(self) -> int:
        """Append the rows that waited for the audit log, oldest first; stop at the first failure."""
        written = 0
        with self._flushing:
            while self.waiting:
                try:
                    self.write_row(self.waiting[0])
                except AuditUnavailable:
                    break
                self.waiting.popleft()
                written += 1
        return written

    def write(self, event: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """The sink's own shape (``AuditWriter.write``), for collaborators handed a sink (the edge's
        refused-token rows, the web page's sign-ins): the row goes through ``write_row``, so it is
        forwarded too. The deadline is always ``AUDIT_DEADLINE_SECONDS``."""
        return self.write_row(event)

    def write_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Append one row now (``AuditUnavailable`` when it cannot be); return it as stored."""
        try:
            # the sink gives up on its locks first, so a refused row is never appended late
            phase = row.get("phase")
            append = self._grouped if phase == CALL_PHASE and self._grouped is not None and reading.get() \
                else self.audit.write
            with tracing.span("gateway.audit_append", **{"audit.phase": phase}):
                stored = append(tracing.with_trace_id(row), timeout=AUDIT_DEADLINE_SECONDS)
        except AuditUnavailable:
            raise
        except Exception as exc:  # any failure to record is a refusal, never a silent pass
            log.exception("audit write failed")
            raise AuditUnavailable(
                f"audit log {self.where} could not record the call; see the server log"
            ) from exc
        self._written(stored)
        return stored

    def _written(self, row: Any) -> None:
        """Hand a row the sink wrote to the ``written`` listeners."""
        if not isinstance(row, Mapping):
            return
        for listener in list(self.written):
            try:
                listener(row)
            except Exception:
                log.exception("an audit row listener failed (the row is in the log)")

    def forward_to(self, forwarder: Forwarder) -> Forwarder:
        """Hand every row written from now on to ``forwarder`` (one of the ``written`` listeners); it is
        stopped by ``stop_forwarding``."""
        self.forwarder = forwarder
        self.written.append(forwarder.offer)
        return forwarder

    def stop_forwarding(self) -> None:
        """Let the syslog forwarder send what waits (a few seconds at most), then stop it."""
        if self.forwarder is not None:
            self.forwarder.close()


def forward_to_syslog(trail: AuditTrail, path: Path | None) -> Forwarder | None:
    """Start forwarding every row ``trail`` writes to the receiver ``syslog.yaml`` at ``path`` names
    (nothing without the file). Its load is audited like every configuration file's; a bad file is
    ``ConfigError`` and the gateway does not start."""
    if path is None or not path.exists():
        return None

    def start() -> Forwarder | None:  # attached before the load's own row is written, so it is sent too
        forwarder = forwarder_for(path)
        return trail.forward_to(forwarder).start() if forwarder is not None else None

    return reloads.load_audited(
        "syslog", path, start,
        lambda f: {"receivers": {f.config.where: reloads.fingerprint(repr(f.config))} if f else {}},
        trail.write_quietly)


#: what ``start_checkpoints`` runs (the composition root holds it to stop it)
ScheduledCheckpoints = CheckpointTimer


def checkpoint_schedule(settings: IntervalSettings) -> float:
    """GATEWAY_AUDIT_CHECKPOINT_SECONDS checked (``ConfigError`` naming the fix): a process that would
    leave its newest rows unsigned for no sane interval does not start."""
    return checkpoint_interval(settings)


def start_checkpoints(audit: AuditWriter, seconds: float) -> CheckpointTimer | None:
    """Sign the audit chain's head every ``seconds``, rows or none, in a thread of its own (the sinks
    block; ``gateway.audit.schedule``); None for a sink that signs nothing (no key). Each replica runs
    one; the sink signs one head once whoever asks. ``CheckpointTimer.stop`` (blocking) ends it."""
    if isinstance(audit, Checkpointing) and getattr(audit, "key_file", None) is not None:
        return CheckpointTimer(audit, seconds).start()
    return None
