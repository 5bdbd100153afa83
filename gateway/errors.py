"""The gateway's one exception tree.

Every error a caller can see is a ``GatewayError`` subclass with a stable wire ``code`` and a
message that names the remedy. Foreign exceptions (pyVmomi faults, socket errors, YAML errors) are
translated at exactly one boundary per foreign system and raised ``from`` the original, so the
traceback stays in the log and never reaches the wire::

    GatewayError
    ├── InvalidArgument        invalid_argument
    ├── NotFound               not_found
    ├── Ambiguous              ambiguous
    ├── ConfigError            config_error
    ├── VSphereError
    │   ├── Unreachable        unreachable
    │   ├── Timeout            timeout
    │   ├── QueueTimeout       queue_timeout
    │   ├── AuthFailed         auth_failed
    │   ├── NotAuthenticated   not_authenticated
    │   ├── InvalidState       invalid_state
    │   ├── PermissionDenied   permission_denied
    │   ├── TaskFailed         task_failed
    │   ├── OutcomeUnknown     outcome_unknown
    │   └── NotSupported       not_supported
    ├── PolicyDenied           policy_denied
    ├── RateLimited            rate_limited
    ├── ConfirmationExpired    confirmation_expired
    ├── ConfirmationInvalid    confirmation_invalid
    ├── Stale                  stale
    ├── ApprovalRequired       approval_required
    ├── AuditUnavailable       audit_unavailable
    ├── StateUnavailable       state_unavailable
    ├── Unauthorized           unauthorized
    ├── Forbidden              forbidden
    ├── IdempotencyConflict    idempotency_conflict
    ├── IdempotencyInProgress  idempotency_in_progress
    └── TaskNotFound           task_not_found
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
