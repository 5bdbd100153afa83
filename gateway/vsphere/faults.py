"""The one place where pyVmomi faults and transport errors become gateway errors.

Text from the target is untrusted: stripped of control characters and bounded. Translation never raises.
"""

from __future__ import annotations

import errno
import http.client
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from xml.parsers.expat import ExpatError

from pyVmomi import vim, vmodl

from gateway import errors

MAX_DETAIL_CHARS = 300
"""Longest piece of target-supplied text that goes into a message."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069]+")


@dataclass(frozen=True)
class _Rule:
    """What one exception class becomes: the error type, what happened, and what to do about it."""

    error: type[errors.GatewayError]
    what: str
    remedy: str


_CHECK_ADDRESS = "check 'host' and 'port' in targets.yaml and that the target is up and reachable"

# Looked up along the exception's MRO, so a subclass (InvalidPowerState) finds its own row before
# its parent's (InvalidState), and NotAuthenticated its own before NoPermission's.
_RULES: dict[type[BaseException], _Rule] = {
    # --- authentication and authorization
    vim.fault.InvalidLogin: _Rule(
        errors.AuthFailed, "login refused for the configured account",
        "check the user and password set for this target's credential_env_prefix"),
    vim.fault.NotAuthenticated: _Rule(
        errors.NotAuthenticated, "the session was rejected again right after logging in anew",
        "check that no other client is terminating the account's sessions and that the session limit "
        "is not exhausted"),
    vim.fault.NoPermission: _Rule(
        errors.PermissionDenied, "the target's account lacks a privilege for this operation",
        "grant the privilege to the account the gateway logs in with, or use another target"),
    vim.fault.RestrictedByAdministrator: _Rule(
        errors.PermissionDenied, "the operation is restricted by the target's administrator",
        "ask the target's administrator to lift the restriction"),
    vmodl.fault.SecurityError: _Rule(
        errors.PermissionDenied, "the target refused the operation for security reasons",
        "check the account's privileges on the target"),
    # --- objects
    vmodl.fault.ManagedObjectNotFound: _Rule(
        errors.NotFound, "the object no longer exists on the target",
        "list the objects again and use a current name or id"),
    vim.fault.NotFound: _Rule(
        errors.NotFound, "the target could not find the object",
        "list the objects again and use a current name or id"),
    vim.fault.FileNotFound: _Rule(
        errors.NotFound, "the target could not find the file",
        "check the datastore path"),
    # --- state
    vim.fault.InvalidState: _Rule(
        errors.InvalidState, "the object is not in a state that allows this operation",
        "read the object's current state and retry when it allows the operation"),
    vim.fault.InvalidPowerState: _Rule(
        errors.InvalidState, "the VM's power state does not allow this operation",
        "read the VM's power state and power it on or off first as the operation needs"),
    vim.fault.TaskInProgress: _Rule(
        errors.InvalidState, "another task is already running on the object",
        "wait for the running task to finish, then retry"),
    vim.fault.ConcurrentAccess: _Rule(
        errors.InvalidState, "the object was changed concurrently",
        "read the object again and retry"),
    vim.fault.ResourceInUse: _Rule(
        errors.InvalidState, "the resource is in use",
        "release the resource first, then retry"),
    vmodl.fault.HostNotConnected: _Rule(
        errors.InvalidState, "the host that owns the object is not connected",
        "reconnect the host in vCenter, then retry"),
    vim.fault.InsufficientResourcesFault: _Rule(
        errors.InvalidState, "the target lacks the resources for this operation",
        "free capacity or choose another host, cluster or datastore"),
    # --- arguments
    vmodl.fault.InvalidArgument: _Rule(
        errors.InvalidArgument, "the target rejected an argument",
        "correct the argument and retry"),
    vmodl.fault.InvalidRequest: _Rule(
        errors.InvalidArgument, "the target rejected the request",
        "correct the arguments and retry"),
    vim.fault.InvalidName: _Rule(
        errors.InvalidArgument, "the name is not valid on the target",
        "choose a name without reserved characters, within the length limit"),
    vim.fault.DuplicateName: _Rule(
        errors.InvalidArgument, "an object with that name already exists in the same place",
        "choose a unique name"),
    vim.fault.AlreadyExists: _Rule(
        errors.InvalidArgument, "the object already exists",
        "choose a unique name or use the existing object"),
    vim.fault.OutOfBounds: _Rule(
        errors.InvalidArgument, "a value is out of the allowed range",
        "choose a value within the range the target allows"),
    # --- capability
    vmodl.fault.NotSupported: _Rule(
        errors.NotSupported, "the target does not support this operation",
        "use a target (vCenter or ESXi version) that supports it"),
    vmodl.fault.NotImplemented: _Rule(
        errors.NotSupported, "the target does not implement this operation",
        "use a target (vCenter or ESXi version) that implements it"),
    vmodl.fault.RequestCanceled: _Rule(
        errors.TaskFailed, "the operation was cancelled on the target",
        "check the target's recent tasks for who cancelled it"),
    # --- transport: the order of an exception's MRO picks the most specific row
    ssl.SSLCertVerificationError: _Rule(
        errors.Unreachable, "the target's TLS certificate could not be verified",
        "set 'ca_file' in targets.yaml to the CA bundle that signed the target's certificate "
        "(or, for a lab only, 'insecure: true')"),
    ssl.SSLError: _Rule(
        errors.Unreachable, "the TLS handshake with the target failed",
        "check that 'port' is the target's HTTPS port and that it speaks TLS 1.2 or newer"),
    socket.gaierror: _Rule(
        errors.Unreachable, "the target's host name could not be resolved",
        "check 'host' in targets.yaml and the gateway's DNS"),
    ConnectionRefusedError: _Rule(errors.Unreachable, "the connection was refused", _CHECK_ADDRESS),
    ConnectionResetError: _Rule(
        errors.Unreachable, "the target dropped the connection",
        "check the target's health and any proxy or firewall between it and the gateway"),
    BrokenPipeError: _Rule(
        errors.Unreachable, "the target dropped the connection",
        "check the target's health and any proxy or firewall between it and the gateway"),
    TimeoutError: _Rule(
        errors.Timeout, "the target did not answer in time",
        "check the target's health, or raise 'timeout_seconds' for it in targets.yaml"),
    http.client.HTTPException: _Rule(
        errors.Unreachable, "the target answered with an unexpected HTTP response",
        "check that 'host' and 'port' point at the vSphere API endpoint and that the service is healthy"),
    ExpatError: _Rule(
        errors.Unreachable, "the target answered with malformed XML",
        "check that 'host' and 'port' point at the vSphere API endpoint"),
    OSError: _Rule(errors.Unreachable, "the target could not be reached", _CHECK_ADDRESS),
    # --- the catch-alls for faults without a row of their own
    vmodl.MethodFault: _Rule(
        errors.VSphereError, "the target reported a fault",
        "see the fault name; the gateway log has the details"),
}


def clean_text(text: object, limit: int = MAX_DETAIL_CHARS) -> str:
    """Target-supplied text made safe for a message: no control characters, one line, bounded length."""
    flat = " ".join(_CONTROL.sub(" ", _ANSI.sub("", str(text))).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def fault_name(exc: BaseException) -> str:
    """The stable name of a fault (``vim.fault.InvalidPowerState``) or of a Python exception class."""
    return type(exc).__name__


def _fault_text(exc: BaseException) -> str:
    """The human text a fault or error carries, or "" when it has none."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return clean_text(exc.verify_message)
    if isinstance(exc, vmodl.MethodFault):
        text = getattr(exc, "msg", None) or " ".join(
            str(m.message) for m in (getattr(exc, "faultMessage", None) or []) if getattr(m, "message", None)
        )
        named = getattr(exc, "name", None)
        if not text and isinstance(named, str) and named:
            text = f"name '{named}'"
        return clean_text(text or "")
    if isinstance(exc, OSError) and exc.strerror:
        return clean_text(exc.strerror)
    return clean_text(exc.args[0]) if exc.args else ""


def _rule_for(exc: BaseException) -> _Rule | None:
    return next((_RULES[cls] for cls in type(exc).__mro__ if cls in _RULES), None)


def _invalid_argument(exc: BaseException, message: str) -> errors.GatewayError:
    named = "name" if getattr(exc, "name", None) else "argument"
    field = clean_text(getattr(exc, "invalidProperty", None) or named, 80)
    return errors.InvalidArgument(field, message)


_BUILDERS: dict[type[errors.GatewayError], Callable[[BaseException, str], errors.GatewayError]] = {
    errors.InvalidArgument: _invalid_argument,
}


def _build(rule: _Rule, exc: BaseException, target: str, **details: Any) -> errors.GatewayError:
    name = fault_name(exc)
    text = _fault_text(exc)
    said = f"{name}: {text}" if text else name
    message = f"target '{target}': {rule.what} ({said}); {rule.remedy}"
    builder = _BUILDERS.get(rule.error)
    error = builder(exc, message) if builder else rule.error(message)
    error.details.update({"target": target, "fault": name, **details})
    return error


def translate(exc: BaseException, target: str) -> errors.GatewayError:
    """The gateway error for ``exc`` raised while talking to ``target``; a ``GatewayError`` passes as is.

    Exceptions that are neither vSphere faults nor transport errors (programming errors) become a
    generic ``VSphereError`` whose message points at the log; callers that want those to crash
    should check ``is_foreign`` first.
    """
    if isinstance(exc, errors.GatewayError):
        return exc
    rule = _rule_for(exc)
    if rule is None:
        error = errors.VSphereError(
            f"target '{target}': unexpected error ({type(exc).__name__}); the gateway log has the details",
            target=target)
        return error
    return _build(rule, exc, target)


def is_foreign(exc: BaseException) -> bool:
    """True for the exceptions ``translate`` has a row for: vSphere faults and transport errors."""
    return _rule_for(exc) is not None


#: connection-setup failures: the request was never sent, so nothing can have happened on the target
_NEVER_SENT: tuple[type[BaseException], ...] = (
    ConnectionRefusedError, socket.gaierror, ssl.SSLCertVerificationError)
_NEVER_SENT_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL})


def request_may_have_arrived(exc: BaseException) -> bool:
    """Whether a request that failed with ``exc`` may still have reached the target (and taken effect).

    Only failures to set up the connection (refused, name not resolved, certificate refused, no route)
    prove it did not; any other transport error (a reset, a dropped connection, a read timeout, a
    garbled answer) may have cut off the answer to a request the target received and carried out.
    A vSphere fault is an answer, so the request arrived.
    """
    if isinstance(exc, _NEVER_SENT):
        return False
    return not (isinstance(exc, OSError) and not isinstance(exc, TimeoutError)
                and exc.errno in _NEVER_SENT_ERRNOS)


def task_error(fault: BaseException | None, target: str, task_moid: str) -> errors.TaskFailed:
    """The error for a vSphere task that ended in ``error``; ``reason`` keeps the fault's own code."""
    if fault is None:
        return errors.TaskFailed(
            f"target '{target}': task {task_moid} failed without saying why; check the target's recent tasks",
            target=target, task=task_moid)
    cause = translate(fault, target)
    prefix = f"target '{target}': "
    said = cause.message[len(prefix):] if cause.message.startswith(prefix) else cause.message
    return errors.TaskFailed(
        f"target '{target}': task {task_moid} failed: {said}",
        target=target, task=task_moid, fault=cause.details.get("fault"), reason=cause.code)
