"""The gateway's one exception tree: each error has a stable wire ``code`` and a message naming the remedy.

Foreign exceptions are translated at one boundary per foreign system and raised ``from`` the
original, so tracebacks stay in the log and never reach the wire::

    GatewayError
    ├── InvalidArgument, NotFound, Ambiguous, ConfigError
    ├── VSphereError
    │   └── Unreachable, Timeout, QueueTimeout, Busy, AuthFailed, NotAuthenticated, InvalidState,
    │       PermissionDenied, TaskFailed, OutcomeUnknown, NotSupported
    ├── PolicyDenied, RateLimited, ConfirmationExpired, ConfirmationInvalid, Stale,
    │   ApprovalRequired, ReasonRequired
    ├── AuditUnavailable, StateUnavailable
    ├── Unauthorized, Forbidden
    └── IdempotencyConflict, IdempotencyInProgress, TaskNotFound
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """Base of every error the gateway reports; ``code`` is stable and part of the wire contract."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        """The error as it travels to a caller: code, message and any safe, JSON-able details."""
        wire: dict[str, Any] = {"code": self.code, "message": self.message}
        wire.update({k: v for k, v in self.details.items() if v is not None})
        return wire


class InvalidArgument(GatewayError):
    code = "invalid_argument"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)


class NotFound(GatewayError):
    code = "not_found"


class Ambiguous(GatewayError):
    code = "ambiguous"


class ConfigError(GatewayError):
    code = "config_error"


class VSphereError(GatewayError):
    code = "vsphere_error"


class Unreachable(VSphereError):
    code = "unreachable"


class Timeout(VSphereError):
    code = "timeout"


class QueueTimeout(VSphereError):
    code = "queue_timeout"


class Busy(VSphereError):
    """Refused at once: the caller already has as many calls queued on the target as it may (the
    target's ``max_queued_per_caller``); other callers are still served."""

    code = "busy"

    def __init__(self, message: str, *, target: str, retry_after: float) -> None:
        super().__init__(message, target=target, retry_after_seconds=round(retry_after, 1))
        self.retry_after = retry_after


class AuthFailed(VSphereError):
    code = "auth_failed"


class NotAuthenticated(VSphereError):
    code = "not_authenticated"


class InvalidState(VSphereError):
    code = "invalid_state"


class PermissionDenied(VSphereError):
    code = "permission_denied"


class TaskFailed(VSphereError):
    code = "task_failed"


class OutcomeUnknown(VSphereError):
    code = "outcome_unknown"


class NotSupported(VSphereError):
    code = "not_supported"


class PolicyDenied(GatewayError):
    code = "policy_denied"


class RateLimited(GatewayError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message, retry_after_seconds=round(retry_after, 1))
        self.retry_after = retry_after


class ConfirmationExpired(GatewayError):
    code = "confirmation_expired"


class ConfirmationInvalid(GatewayError):
    code = "confirmation_invalid"


class Stale(GatewayError):
    code = "stale"


class ApprovalRequired(GatewayError):
    code = "approval_required"


class ReasonRequired(GatewayError):
    """An approval or denial without the reason its rule asks for (``reason_required``)."""

    code = "reason_required"


class AuditUnavailable(GatewayError):
    code = "audit_unavailable"


class StateUnavailable(GatewayError):
    """The shared state store (tokens, proposals) cannot be read or written; callers fail closed."""

    code = "state_unavailable"


class Unauthorized(GatewayError):
    code = "unauthorized"


class Forbidden(GatewayError):
    code = "forbidden"


class ScanLimitReached(GatewayError):
    """A history scan read ``max_scan`` records without reaching the start of its window."""

    code = "scan_limit_reached"


class IdempotencyConflict(GatewayError):
    """An idempotency key the caller already used for another call (another tool or other arguments)."""

    code = "idempotency_conflict"


class IdempotencyInProgress(GatewayError):
    """The call first made with this idempotency key is still running past the wait of its retry."""

    code = "idempotency_in_progress"


class TaskNotFound(GatewayError):
    """No task of this caller has that id (never made, someone else's, or its results expired)."""

    code = "task_not_found"


def error_of(wire: dict[str, Any]) -> GatewayError:
    """The ``GatewayError`` a wire error (``to_wire``) was made from, by its code: how an outcome kept as
    text (an idempotency key's replay, a task's result) is raised again with the same code and details."""
    details = {k: v for k, v in wire.items() if k not in ("code", "message")}
    cls = _by_code().get(str(wire.get("code")), GatewayError)
    exc = cls.__new__(cls)
    GatewayError.__init__(exc, str(wire.get("message", "")), **details)
    return exc


def _by_code() -> dict[str, type[GatewayError]]:
    found: dict[str, type[GatewayError]] = {}
    stack: list[type[GatewayError]] = [GatewayError]
    while stack:
        cls = stack.pop()
        found.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return found
