"""Destructive tools: registered only when destructive operations are enabled, always two-phase."""

from __future__ import annotations

from gateway.tools.spec import TARGET, Param, ToolSpec
from gateway.tools.write import VM
from gateway.vocabulary import Category, Risk
from gateway.vsphere.actions import bulk, hardware, removal, snapshots

TIMEOUT = Param(
    "timeout_seconds", "number",
    "How long to wait for each vSphere task (default 600). Past it the outcome is reported as unknown with "
    "the task id: it is never retried; check get_tasks or read the objects again.", minimum=1, maximum=86400)
FORCE_POWER_OFF = Param(
    "force_power_off", "boolean",
    "Power off a powered-on VM (hard) before deleting it; otherwise one is refused.", default=False)

DELETE_SNAPSHOT = ToolSpec(
    name="delete_snapshot",
    description="Permanently delete one snapshot of a VM (by name or moid), optionally with its children. "
                "The VM's current state is kept; only the ability to go back to the snapshot is lost.",
    category=Category.DESTRUCTIVE, risk=Risk.HIGH,
    params=(TARGET, VM,
            Param("snapshot", "string", "Snapshot name (exact) or moid (snapshot-12).", required=True),
            Param("remove_children", "boolean", "Also delete every snapshot below it.", default=False),
            TIMEOUT),
    plan=snapshots.plan_delete_snapshot, execute=snapshots.execute_delete_snapshot,
    privileges=("VirtualMachine.State.RemoveSnapshot",),
)

REVERT_SNAPSHOT = ToolSpec(
    name="revert_snapshot",
    description="Revert a VM to a snapshot (by name or moid; default: its current snapshot), discarding "
                "every change since. Policy may take a safety snapshot first; it is named in the result.",
    category=Category.DESTRUCTIVE, risk=Risk.HIGH,
    params=(TARGET, VM,
            Param("snapshot", "string", "Snapshot name (exact) or moid; omit for the current snapshot."),
            TIMEOUT),
    plan=snapshots.plan_revert_snapshot, execute=snapshots.execute_revert_snapshot,
    privileges=("VirtualMachine.State.RevertToSnapshot", "VirtualMachine.State.CreateSnapshot"),
    snapshot_before=True,
)

DELETE_VM = ToolSpec(
    name="delete_vm",
    description="Permanently delete a VM and its files from disk. Refuses a powered-on VM unless "
                "force_power_off, and an orphaned, inaccessible or invalid VM (use unregister_vm for those).",
    category=Category.DESTRUCTIVE, risk=Risk.CRITICAL,
    params=(TARGET, VM, FORCE_POWER_OFF, TIMEOUT),
    plan=removal.plan_delete_vm, execute=removal.execute_delete_vm,
    privileges=("VirtualMachine.Inventory.Delete", "VirtualMachine.Interact.PowerOff"),
)

UNREGISTER_VM = ToolSpec(
    name="unregister_vm",
    description="Remove a VM from the inventory but keep its files on the datastore. The way to clear an "
                "orphaned, inaccessible or invalid VM record, which delete_vm cannot touch.",
    category=Category.DESTRUCTIVE, risk=Risk.HIGH,
    params=(TARGET, VM, TIMEOUT),
    plan=removal.plan_unregister_vm, execute=removal.execute_unregister_vm,
    privileges=("VirtualMachine.Inventory.Unregister",),
)

REMOVE_DISK = ToolSpec(
    name="remove_disk",
    description="Detach one disk from a VM (by label such as 'Hard disk 2', or device key). With "
                "delete_files its file is destroyed too. Policy may take a safety snapshot first, but only "
                "when the file is kept: a snapshot cannot protect a deleted file.",
    category=Category.DESTRUCTIVE, risk=Risk.HIGH,
    params=(TARGET, VM,
            Param("disk", "string", "Disk label (exact, e.g. 'Hard disk 2') or device key (e.g. '2001').",
                  required=True),
            Param("delete_files", "boolean", "Also delete the disk's file from the datastore.",
                  default=False),
            TIMEOUT),
    plan=hardware.plan_remove_disk, execute=hardware.execute_remove_disk,
    privileges=("VirtualMachine.Config.RemoveDisk", "VirtualMachine.State.CreateSnapshot"),
    snapshot_before=True,
)

BULK_VM_ACTION = ToolSpec(
    name="bulk_vm_action",
    description="Apply one action to every VM whose whole name matches name_regex (optionally under a "
                "folder): delete_vm, delete_all_snapshots or revert_to_current_snapshot. The proposal lists "
                "every VM; bulk limits apply to the number of matches. For reverts, safety snapshots (when "
                "policy asks) are all taken first and nothing is reverted if any fails; the run stops at the "
                "first failure.",
    category=Category.DESTRUCTIVE, risk=Risk.CRITICAL,
    params=(TARGET,
            Param("action", "string", "What to do to each matching VM.", required=True,
                  enum=bulk.BULK_ACTIONS),
            Param("name_regex", "string",
                  "Regular expression the whole VM name must match, e.g. 'test-\\d+'.", required=True),
            Param("folder", "string", "Only VMs in this folder or below (moid, path or name)."),
            FORCE_POWER_OFF,
            TIMEOUT),
    plan=bulk.plan_bulk, execute=bulk.execute_bulk, reach=bulk.bulk_reach,
    privileges=("VirtualMachine.Inventory.Delete", "VirtualMachine.Interact.PowerOff",
                "VirtualMachine.State.RemoveSnapshot", "VirtualMachine.State.RevertToSnapshot",
                "VirtualMachine.State.CreateSnapshot"),
    snapshot_before=True,
)

DESTRUCTIVE_TOOLS: tuple[ToolSpec, ...] = (
    DELETE_SNAPSHOT, REVERT_SNAPSHOT, DELETE_VM, UNREGISTER_VM, REMOVE_DISK, BULK_VM_ACTION,
)
