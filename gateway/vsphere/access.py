"""What the endpoint is (``about``) and the privileges this session's account holds (``check_privileges``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyVmomi import vmodl

from gateway.vsphere.collector import Session


def about(session: Session) -> dict[str, Any]:
    """Product facts of the endpoint (no request: read at login). ``instance_uuid`` is None on ESXi."""
    info = session.content.about
    return {
        "product": info.name, "full_name": info.fullName, "version": info.version, "build": info.build,
        "api_type": info.apiType, "api_version": info.apiVersion,
        "instance_uuid": getattr(info, "instanceUuid", None) or None,
    }


@dataclass(frozen=True)
class PrivilegeCheck:
    """Which ``privileges`` the session holds on the root folder: True, False, or None (undetermined)."""

    user: str | None
    held: dict[str, bool | None]
    error: str | None = None


def check_privileges(session: Session, privileges: Sequence[str]) -> PrivilegeCheck:
    """Ask the target whether this session holds ``privileges`` at the root folder.

    Uses ``HasPrivilegeOnEntities`` (needs only System.View), falling back to
    ``FetchUserPrivilegeOnEntities``. A lookup that fails leaves every privilege undetermined (None),
    never granted; ``error`` then names the fault.
    """
    content = session.content
    wanted = sorted(set(privileges))
    undetermined: dict[str, bool | None] = dict.fromkeys(wanted)
    try:
        current = content.sessionManager.currentSession
    except vmodl.MethodFault as exc:
        return PrivilegeCheck(None, undetermined, type(exc).__name__)
    if current is None:
        return PrivilegeCheck(None, undetermined, "the target reports no current session")
    if not wanted:
        return PrivilegeCheck(current.userName, {})
    manager = content.authorizationManager
    try:
        result = manager.HasPrivilegeOnEntities([content.rootFolder], current.key, wanted)
    except vmodl.MethodFault as first:
        try:
            fetched = manager.FetchUserPrivilegeOnEntities([content.rootFolder], current.userName)
        except vmodl.MethodFault:
            return PrivilegeCheck(current.userName, undetermined, type(first).__name__)
        held = {p for r in fetched or [] for p in r.privileges or []}
        return PrivilegeCheck(current.userName, {p: p in held for p in wanted})
    granted = {a.privId: bool(a.isGranted) for r in result or [] for a in r.privAvailability or []}
    return PrivilegeCheck(current.userName, {p: granted.get(p) for p in wanted})
