"""Floors for get_vm_details: the reads a hand-written pyVmomi client makes for the same answer.

``vm_details`` sends the gateway's own requests (a sweep of every VM's name, then
``details.vm_details_spec``), decoded by pyVmomi: the fair floor. ``vm_details_fewer`` is the older,
smaller floor (the VM's own properties only), kept labelled as such in the tables.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from pyVmomi import vim, vmodl  # noqa: E402

from gateway.vsphere.details import _VM_DETAIL_PATHS, vm_details_spec  # noqa: E402  (the same reads)
from gateway.vsphere.pool import VSphereSession  # noqa: E402


def vm_details(session: VSphereSession, name: str) -> int:
    """get_vm_details' reads with bare pyVmomi, the same requests the gateway sends (fair floor): a sweep of
    every VM's name to find the VM, then the gateway's own retrieval of its facts and details and the
    names they refer to (``details.vm_details_spec``), both replies decoded by pyVmomi."""
    content: Any = session.content
    vm = _vm_named(session, name)
    details = content.propertyCollector.RetrievePropertiesEx([vm_details_spec(session, vm._moId)],
                                                             vmodl.query.PropertyCollector.RetrieveOptions())
    return len(details.objects)


def vm_details_fewer(session: VSphereSession, name: str) -> int:
    """The older, smaller floor: the name sweep, then only the VM's own properties (no traversal to the
    host, cluster, folders, datastores and networks whose names the answer carries)."""
    pc: Any = vmodl.query.PropertyCollector
    vm = _vm_named(session, name)
    paths = ["name", "parent", "resourcePool", "runtime.host", "runtime.powerState", *_VM_DETAIL_PATHS]
    details = session.content.propertyCollector.RetrievePropertiesEx([pc.FilterSpec(
        objectSet=[pc.ObjectSpec(obj=vm, skip=False)],
        propSet=[pc.PropertySpec(type=vim.VirtualMachine, pathSet=paths)])], pc.RetrieveOptions())
    return len(details.objects[0].propSet)


def _vm_named(session: VSphereSession, name: str) -> Any:
    """The VM called ``name``, found the way a pyVmomi client does: every VM's name, decoded."""
    pc: Any = vmodl.query.PropertyCollector
    content: Any = session.content
    view, _made = session.views.view(content, content.rootFolder, [vim.VirtualMachine])  # as the gateway
    walk = pc.TraversalSpec(name="view", type=vim.view.ContainerView, path="view", skip=False)
    names = content.propertyCollector.RetrievePropertiesEx([pc.FilterSpec(
        objectSet=[pc.ObjectSpec(obj=view, skip=True, selectSet=[walk])],
        propSet=[pc.PropertySpec(type=vim.VirtualMachine, pathSet=["name"])])], pc.RetrieveOptions())
    return next(o.obj for o in names.objects if o.propSet[0].val == name)
