"""The mirror checks itself: what it holds is compared with live reads, at a bounded cost.

A stream can go wrong without an error (a lost update, a change never reported), so: every poll must
bring back a change to the mirror's own marker, finished tasks' objects are read live, rolling rounds
compare slices and full rounds everything. A difference is confirmed before it counts; a divergence
is logged, counted and repaired by a resync, and until then reads sweep. Pure parts and live reads only.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pyVmomi import VmomiSupport, vim, vmodl

from gateway.vsphere.collector import _plain, retrieve_with
from gateway.vsphere.soap_scan import ObjectProps

PC: Any = vmodl.query.PropertyCollector

Kind = Literal["rolling", "full"]

CHEAP: Mapping[str, tuple[str, ...]] = {
    "VirtualMachine": ("name", "runtime.powerState", "parent"),
}
"""Paths a rolling round compares per type (others: ``name``): what the listings show first and every
change of place or power moves, all scalars or references."""

DEFAULT_CHEAP = ("name",)

MIN_SLICE = 20
"""Objects a rolling round compares at least (bounded above by the inventory covered per interval)."""

MAX_ROUND_SECONDS = 5.0
MIN_ROUND_SECONDS = 0.5

PROOF_SECONDS = 2 * MAX_ROUND_SECONDS
"""A read's freshness poll proves the stream live only when no poll did within this long. Every
comparison round proves it (rolling rounds at most ``MAX_ROUND_SECONDS`` apart), so reads prove only
when rounds stall: a proof costs the target a change and each of its filters a recomputation (about
0.4 s per read at 3,000 VMs in the simulator), which a read should not pay while rounds do it."""

CONTROL_TYPES = frozenset({"ListView", "TaskManager"})
"""Objects in the mirror's filter that are not mirrored: the marker and the task list."""

TERMINAL_TASK_STATES = frozenset({"success", "error"})

task_type: Any = vim.Task  # pyVmomi's constructors are untyped


class Schedule:
    """When rounds are due (the clock is passed in) and which objects a rolling round compares."""

    def __init__(self, full_seconds: float, now: float) -> None:
        self.full_seconds = full_seconds
        self.round_seconds = min(MAX_ROUND_SECONDS, max(MIN_ROUND_SECONDS, full_seconds / 12))
        self._next_round = now + self.round_seconds
        self._next_full = now + full_seconds
        self._cursor = 0

    def due(self, now: float) -> Kind | None:
        """The round due at ``now`` (the full one wins when both are), or None."""
        if now >= self._next_full:
            return "full"
        if now >= self._next_round:
            return "rolling"
        return None

    def wait(self, now: float) -> float:
        """Seconds until the next round is due (0 when one is)."""
        return max(0.0, min(self._next_round, self._next_full) - now)

    def done(self, kind: Kind, now: float) -> None:
        self._next_round = now + self.round_seconds
        if kind == "full":
            self._next_full = now + self.full_seconds

    def slice(self, moids: Iterable[str]) -> list[str]:
        """The next slice of ``moids`` (sorted, rotating): large enough that consecutive rounds cover
        them all within one full interval."""
        ordered = sorted(moids)
        if not ordered:
            return []
        rounds = max(1, math.floor(self.full_seconds / self.round_seconds))
        size = min(len(ordered), max(MIN_SLICE, math.ceil(len(ordered) / rounds)))
        start = self._cursor % len(ordered)
        self._cursor = start + size
        return (ordered + ordered)[start:start + size]


def cheap_paths(type_name: str) -> tuple[str, ...]:
    return CHEAP.get(type_name, DEFAULT_CHEAP)


def differences(mirror: Mapping[str, ObjectProps], live: Mapping[str, ObjectProps],
                paths: Mapping[str, tuple[str, ...]] | None, moids: Sequence[str] | None) -> list[str]:
    """Moids whose mirrored and live states differ, sorted.

    ``moids`` None compares every object on either side (a full round: one held but gone live, or
    live but never mirrored, differs); otherwise only those. ``paths`` None compares every property
    either side has; otherwise each type's paths there (``CHEAP`` and its default). Data objects (a
    cluster's ``configurationEx``) are not compared: they have no value equality."""
    wanted = sorted(set(mirror) | set(live)) if moids is None else list(moids)
    out = []
    for moid in wanted:
        held, seen = mirror.get(moid), live.get(moid)
        if held is None or seen is None:
            if held is not seen:
                out.append(moid)
            continue
        keys = (set(held.props) | set(seen.props)) if paths is None else set(
            paths.get(held.type, DEFAULT_CHEAP))
        if any(_differ(held.props.get(k), seen.props.get(k)) for k in keys):
            out.append(moid)
    return sorted(out)


def _differ(a: Any, b: Any) -> bool:
    if isinstance(a, VmomiSupport.DataObject) or isinstance(b, VmomiSupport.DataObject):
        return False
    return bool(a != b)


def plain_value(name: str, value: Any) -> Any:
    """A pyVmomi property value as the mirror keeps it (references as moids, enum strings as str)."""
    return untracked(_plain(name, value, strict=False))


def untracked(value: Any) -> Any:
    """``value`` with str subclasses (pyVmomi enum values) as plain str, so that a dict of scalars is not
    tracked by the cycle collector (a 30,000-VM mirror otherwise adds ~300,000 objects to every full
    collection of the process), and every string a fresh, interned copy (``kept``)."""
    if isinstance(value, str):
        return kept(value)
    if isinstance(value, list):
        return [untracked(item) for item in value]
    return value


def kept(text: str) -> str:
    """``text`` as the mirror keeps it: one shared object per distinct value (power states, guest ids,
    host moids repeat across thousands of VMs), never the decoder's own object. A string the decoder
    made lives in the allocator's pages among the reply's other objects, and one kept string holds
    such a page, so the memory of a freed reply could not go back; the copy lives apart."""
    return sys.intern("".join(("", str(text))) if type(text) is not str else (text + "_")[:-1])


# ------------------------------------------------------------------------------ live reads


def wsdl_type(type_name: str) -> Any:
    """The pyVmomi class of a vSphere type name (``DistributedVirtualPortgroup``); KeyError if unknown."""
    get: Any = VmomiSupport.GetWsdlType  # untyped
    return get("urn:vim25", type_name)


def read_objects(session: Any, refs: Mapping[str, str], paths: Mapping[str, tuple[str, ...]]) -> dict[
        str, ObjectProps]:
    """``paths[type]`` of each object in ``refs`` (moid -> type), read live; objects that no longer
    exist are absent from the result."""
    if not refs:
        return {}
    stub = session.si._stub
    types = sorted(set(refs.values()))
    spec = PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=wsdl_type(t)(moid, stub), skip=False) for moid, t in refs.items()],
        propSet=[PC.PropertySpec(type=wsdl_type(t), pathSet=list(paths[t])) for t in types],
        reportMissingObjectsInResults=True)
    return retrieve(session, spec)


def read_view(session: Any, view: Any, paths: Mapping[Any, Sequence[str]]) -> dict[str, ObjectProps]:
    """``paths`` (by vim type) of every object in the mirror's ContainerView, read live."""
    spec = PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[
            PC.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)])],
        propSet=[PC.PropertySpec(type=t, pathSet=list(p)) for t, p in paths.items()])
    return retrieve(session, spec)


def retrieve(session: Any, spec: Any) -> dict[str, ObjectProps]:
    """One ``RetrievePropertiesEx`` (following continuation tokens), decoded as the stream's values are."""
    return {o.moid: o for o in retrieve_with(session.content.propertyCollector, spec, plain_value)}


def finished_tasks(session: Any, tasks: Sequence[str]) -> tuple[dict[str, str], set[str]]:
    """(the objects each finished task in ``tasks`` touched or made, moid -> type; tasks still
    running)."""
    touched: dict[str, str] = {}
    running: set[str] = set()
    for moid, props in _task_props(session, tasks):
        if props.get("info.state") not in TERMINAL_TASK_STATES:
            running.add(moid)
            continue
        for key in ("info.entity", "info.result"):
            if isinstance(props.get(key), VmomiSupport.ManagedObject):
                touched[props[key]._moId] = props[key]._wsdlName
    return touched, running


_UNDECODABLE = (TypeError, KeyError, AttributeError, ValueError)


def _task_props(session: Any, tasks: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """State, entity and result of each task; when pyVmomi cannot decode one (a snapshot as a task's
    entity, in the simulator) the tasks are read one by one and the undecodable ones skipped."""
    try:
        return _read_tasks(session, tasks)
    except _UNDECODABLE:
        if len(tasks) == 1:
            return []
    out: list[tuple[str, dict[str, Any]]] = []
    for task in tasks:
        try:
            out += _read_tasks(session, [task])
        except _UNDECODABLE:
            continue  # left to the rounds
    return out


def _read_tasks(session: Any, tasks: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    if not tasks:
        return []
    stub = session.si._stub
    spec = PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=task_type(moid, stub), skip=False) for moid in tasks],
        propSet=[PC.PropertySpec(type=vim.Task, pathSet=["info.state", "info.entity", "info.result"])],
        reportMissingObjectsInResults=True)
    objects = retrieve_with(session.content.propertyCollector, spec, lambda _name, value: value)
    return [(o.moid, o.props) for o in objects]  # values as pyVmomi decoded them: references keep their type


class Marker:
    """A ListView of the mirror's own session in the mirror's filter; changing its one member is a
    change only this mirror makes, so a poll that brings it back came from a live stream."""

    def __init__(self, session: Any) -> None:
        content: Any = session.content
        self.view: Any = content.viewManager.CreateListView([])
        self._member: Any = content.rootFolder
        self._holds = False
        self.outstanding = False
        """A change was made whose update has not been seen yet (a poll then expects that one)."""

    @property
    def moid(self) -> str:
        return str(self.view._moId)

    def filter_spec(self, task_manager: Any, mirrored: Any) -> Any:
        """The marker and the task list, added to ``mirrored`` (a filter spec). The marker's property
        spec comes first: govmomi's simulator looks an updated object up in the global registry for
        every spec of another type listed before the object's own, and a session's view is not there
        (the handler crashes)."""
        return PC.FilterSpec(
            objectSet=[PC.ObjectSpec(obj=self.view, skip=False), PC.ObjectSpec(obj=task_manager, skip=False),
                       *mirrored.objectSet],
            propSet=[PC.PropertySpec(type=vim.view.ListView, pathSet=["view"]),
                     PC.PropertySpec(type=vim.TaskManager, pathSet=["recentTask"]), *mirrored.propSet])

    def change(self) -> None:
        """Add or remove the member (one small call), unless a change is still outstanding."""
        if self.outstanding:
            return
        if self._holds:
            self.view.ModifyListView(remove=[self._member])
        else:
            self.view.ModifyListView(add=[self._member])
        self._holds = not self._holds
        self.outstanding = True

    def destroy(self) -> None:
        self.view.DestroyView()
