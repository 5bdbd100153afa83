"""Write tools: changes to one target that policy may allow directly (no two-phase confirmation).

The parameters here are the whole surface (``reconfigure_vm`` takes no raw spec, by design).
"""

from __future__ import annotations

from functools import partial

from gateway.guard import datastore_path
from gateway.tools.spec import TARGET, Param, ToolSpec
from gateway.vocabulary import Category, Risk
from gateway.vsphere.actions import hardware, placement, power, snapshots

VM = Param("vm", "string", "VM name (exact, case-sensitive) or moid such as vm-123.", required=True)
TIMEOUT = Param(
    "timeout_seconds", "number",
    "How long to wait for each vSphere task (default 600). Past it the call reports a timeout with the task "
    "id; the task may still finish, so check get_tasks before retrying.", minimum=1, maximum=86400)


def _power(name: str, op: str, description: str, risk: Risk, privilege: str,
           extra: tuple[Param, ...] = ()) -> ToolSpec:
    return ToolSpec(
        name=name, description=description, category=Category.WRITE, risk=risk,
        params=(TARGET, VM, *extra, TIMEOUT),
        plan=partial(power.plan_power, op),
        execute=power.execute_power_off if op == "power_off" else partial(power.execute_power, op),
        privileges=(privilege,),
    )


POWER_ON = _power(
    "power_on_vm", "power_on",
    "Power on a powered-off or suspended VM and wait until it is on.", Risk.MEDIUM,
    "VirtualMachine.Interact.PowerOn")
POWER_OFF = _power(
    "power_off_vm", "power_off",
    "Power off a VM: asks the guest to shut down when VMware Tools runs, then powers off hard if it is still "
    "on after guest_timeout_seconds. Without running Tools (or from suspended) it powers off hard at once "
    "and says so in the result.", Risk.HIGH, "VirtualMachine.Interact.PowerOff",
    (Param("guest_timeout_seconds", "number",
           "Seconds to wait for the guest shutdown before the hard power-off (0: power off hard at once).",
           default=120, minimum=0, maximum=3600),))
SUSPEND = _power(
    "suspend_vm", "suspend", "Suspend a powered-on VM (its memory is saved to disk).", Risk.MEDIUM,
    "VirtualMachine.Interact.Suspend")
RESET = _power(
    "reset_vm", "reset", "Hard-reset a powered-on VM, like pressing its reset button (no guest shutdown).",
    Risk.HIGH, "VirtualMachine.Interact.Reset")

CREATE_SNAPSHOT = ToolSpec(
    name="create_snapshot",
    description="Take a snapshot of a VM. The name must be new among the VM's snapshots, so later deletes "
                "and reverts by name are unambiguous.",
    category=Category.WRITE, risk=Risk.LOW,
    params=(TARGET, VM,
            Param("name", "string", "Snapshot name (1-80 characters).", required=True),
            Param("description", "string", "Free text stored with the snapshot."),
            Param("memory", "boolean", "Include the VM's memory (powered-on VMs only).", default=False),
            Param("quiesce", "boolean", "Quiesce the guest file systems first (needs VMware Tools).",
                  default=False),
            TIMEOUT),
    plan=snapshots.plan_create_snapshot, execute=snapshots.execute_create_snapshot,
    privileges=("VirtualMachine.State.CreateSnapshot",),
)

RECONFIGURE = ToolSpec(
    name="reconfigure_vm",
    description="Change a VM's CPU count or memory, add one disk, or add one network adapter; nothing else. "
                "Values are checked against the VM's host first; a powered-on VM needs hot add enabled to "
                "grow CPU or memory and cannot shrink them.",
    category=Category.WRITE, risk=Risk.MEDIUM,
    params=(TARGET, VM,
            Param("cpu_count", "integer", "New number of virtual CPUs.", minimum=1, maximum=768),
            Param("memory_mb", "integer", "New memory size in MB (a multiple of 4).", minimum=4,
                  maximum=24 * 1024 * 1024),
            Param("add_disk_gb", "integer", "Add a new thin-provisioned disk of this many GB.", minimum=1,
                  maximum=62 * 1024),
            Param("datastore", "string", "Datastore for the new disk (default: the VM's home datastore)."),
            Param("add_nic_network", "string",
                  "Add a vmxnet3 network adapter on this network or distributed port group (name or moid)."),
            TIMEOUT),
    plan=hardware.plan_reconfigure, execute=hardware.execute_reconfigure,
    privileges=("VirtualMachine.Config.CPUCount", "VirtualMachine.Config.Memory",
                "VirtualMachine.Config.AddNewDisk", "VirtualMachine.Config.AddRemoveDevice",
                "Datastore.AllocateSpace", "Network.Assign"),
)

MOUNT_ISO = ToolSpec(
    name="mount_iso",
    description="Insert an ISO image from a datastore into the VM's first CD-ROM drive (adding a drive if it "
                "has none) and connect it.",
    category=Category.WRITE, risk=Risk.LOW,
    params=(TARGET, VM,
            Param("iso_path", "string", "Datastore path of the image, e.g. '[datastore1] isos/ubuntu.iso' "
                  "(inside that datastore: a path that leaves it with '..' is refused).",
                  required=True, normalize=datastore_path.canonical_iso_path),
            TIMEOUT),
    plan=hardware.plan_mount_iso, execute=hardware.execute_mount_iso,
    privileges=("VirtualMachine.Interact.SetCDMedia", "VirtualMachine.Config.AddRemoveDevice",
                "Datastore.Browse"),
)

UNMOUNT_ISO = ToolSpec(
    name="unmount_iso",
    description="Eject every ISO image mounted on the VM's CD-ROM drives (the drives stay, empty).",
    category=Category.WRITE, risk=Risk.LOW,
    params=(TARGET, VM, TIMEOUT),
    plan=hardware.plan_unmount_iso, execute=hardware.execute_unmount_iso,
    privileges=("VirtualMachine.Interact.SetCDMedia",),
)

MIGRATE = ToolSpec(
    name="migrate_vm",
    description="Move a VM to another host, datastore and/or resource pool of the same target (vMotion / "
                "storage vMotion). A host in another cluster without a pool means that cluster's root pool.",
    category=Category.WRITE, risk=Risk.MEDIUM,
    params=(TARGET, VM,
            Param("host", "string", "Destination host (name or moid)."),
            Param("datastore", "string", "Destination datastore (name or moid)."),
            Param("resource_pool", "string", "Destination resource pool (name, cluster/name, or moid)."),
            TIMEOUT),
    plan=placement.plan_migrate, execute=placement.execute_migrate,
    privileges=("Resource.HotMigrate", "Resource.ColdMigrate", "Resource.AssignVMToPool",
                "Datastore.AllocateSpace"),
)

CLONE = ToolSpec(
    name="clone_vm",
    description="Clone a VM within the same target under a name no VM has yet, into the source's folder and "
                "resource pool unless others are given; optionally power the clone on.",
    category=Category.WRITE, risk=Risk.MEDIUM,
    params=(TARGET, VM,
            Param("name", "string", "Name of the new VM (must not exist on the target).", required=True),
            Param("folder", "string", "VM folder for the clone (moid, path such as /DC0/vm/prod, or name)."),
            Param("resource_pool", "string", "Resource pool for the clone (name, cluster/name, or moid)."),
            Param("datastore", "string", "Datastore for the clone's files (default: the source's)."),
            Param("power_on", "boolean", "Power the clone on once it exists.", default=False),
            TIMEOUT),
    plan=placement.plan_clone, execute=placement.execute_clone,
    privileges=("VirtualMachine.Provisioning.Clone", "VirtualMachine.Inventory.CreateFromExisting",
                "Resource.AssignVMToPool", "Datastore.AllocateSpace", "VirtualMachine.Interact.PowerOn"),
)

WRITE_TOOLS: tuple[ToolSpec, ...] = (
    POWER_ON, POWER_OFF, SUSPEND, RESET, CREATE_SNAPSHOT, RECONFIGURE, MOUNT_ISO, UNMOUNT_ISO, MIGRATE, CLONE,
)
