"""The read tools: a table of ``ToolSpec`` whose handlers parse arguments and call ``gateway.vsphere``.

Argument parsing fails with ``InvalidArgument`` before any request is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.config import Target
from gateway.errors import InvalidArgument
from gateway.guard.patterns import UserRegex, compile_user_regex
from gateway.tools.spec import TARGETS, Param, ToolSpec
from gateway.vocabulary import Category, Risk
from gateway.vsphere import access, details, history, listings, mirror, perf

ReadFn = Callable[[Any, Mapping[str, Any]], dict[str, Any]]

"""Longest regular expression accepted (patterns run in the target's worker thread)."""

VM_POWER_STATES = ("poweredOn", "poweredOff", "suspended")
VM_CONNECTION_STATES = ("connected", "disconnected", "orphaned", "inaccessible", "invalid")
TASK_STATES = ("queued", "running", "success", "error")


# --------------------------------------------------------------------------------------------------
# Argument parsing


def parse_time(field: str, value: str | None) -> datetime | None:
    """An ISO-8601 timestamp (``2025-01-31T14:00:00Z``); without an offset it is taken as UTC."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            field, f"'{value}' is not an ISO-8601 timestamp such as 2025-01-31T14:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_regex(field: str, value: str | None) -> UserRegex | None:
    """A regular expression searched anywhere in a name (anchor with ^ and $), on the linear-time
    engine of ``gateway.guard.patterns``."""
    return None if value is None else compile_user_regex(field, value)


def vm_query(args: Mapping[str, Any]) -> listings.VmQuery:
    """list_vms arguments as an ``listings.VmQuery``."""
    fields = tuple(args.get("fields") or listings.DEFAULT_VM_FIELDS)
    unknown = [f for f in fields if f not in listings.VM_COLUMNS]
    if unknown:
        raise InvalidArgument("fields", f"unknown column(s) {', '.join(unknown)}; choose from "
                                        f"{', '.join(listings.VM_COLUMNS)}")
    return listings.VmQuery(
        name=args.get("name"), regex=parse_regex("regex", args.get("regex")), folder=args.get("folder"),
        resource_pool=args.get("resource_pool"), power_state=args.get("power_state"),
        connection_state=args.get("connection_state"),
        created_before=parse_time("created_before", args.get("created_before")),
        created_after=parse_time("created_after", args.get("created_after")),
        fields=fields, limit=args.get("limit"),
    )


def window(args: Mapping[str, Any], now: datetime | None = None) -> history.Window:
    """The ``start``/``end``/``minutes`` arguments as a window (``minutes`` back from ``end``)."""
    return history.make_window(parse_time("start", args.get("start")), parse_time("end", args.get("end")),
                               float(args.get("minutes", 60)), now or datetime.now(UTC))


def event_query(args: Mapping[str, Any], now: datetime | None = None) -> history.EventQuery:
    return history.EventQuery(
        window=window(args, now), event_types=(args["event_type"],) if args.get("event_type") else (),
        user=args.get("user"), entity_name=parse_regex("entity_name", args.get("entity_name")),
        max_scan=int(args.get("max_scan", 5000)), max_results=int(args.get("max_results", 500)),
    )


def task_query(args: Mapping[str, Any], now: datetime | None = None) -> history.TaskQuery:
    return history.TaskQuery(
        window=window(args, now), states=(args["state"],) if args.get("state") else (),
        task_id=args.get("task_id"), user=args.get("user"),
        entity_name=parse_regex("entity_name", args.get("entity_name")),
        max_scan=int(args.get("max_scan", 5000)), max_results=int(args.get("max_results", 500)),
    )


# --------------------------------------------------------------------------------------------------
# Handlers (session, args) -> dict


def _list_vms(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    return listings.list_vms(session, vm_query(args))


def _by(ref_param: str, fn: Callable[[Any, str], dict[str, Any]]) -> ReadFn:
    """A handler calling ``fn(session, args[ref_param])``."""
    return lambda session, args: fn(session, args[ref_param])


def _vm_details(session: Any, args: Mapping[str, Any],
                lookup: details.Lookup | None = None) -> dict[str, Any]:
    """get_vm_details; with a mirror's ``lookup`` it may skip the name sweep (``details.Lookup``)."""
    return details.get_vm_details(session, args["vm"], lookup)


def _list_hosts(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    return listings.list_hosts(session, args.get("cluster"))


def _vm_performance(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    return perf.get_vm_performance(session, args["vm"], int(args.get("samples", 15)))


def _events(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    return history.get_events(session, event_query(args))


def _tasks(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    return history.get_tasks(session, task_query(args))


# --------------------------------------------------------------------------------------------------
# Reads a live inventory mirror can answer (gateway.vsphere.mirror): the same shaping functions as the
# sweeps above, over the mirrored objects instead of swept ones.


def _mirror_list_vms(view: mirror.View, args: Mapping[str, Any]) -> dict[str, Any]:
    return listings.vm_rows(view.objects, vm_query(args), view.root_folder)


MIRROR_READS: dict[str, mirror.MirrorRead] = {
    "list_vms": _mirror_list_vms,
    "list_hosts": lambda view, args: listings.host_rows(view, view.objects, args.get("cluster")),
    "list_clusters": lambda view, _args: listings.cluster_rows(view.objects, view.root_folder),
    "list_datastores": lambda view, _args: listings.datastore_rows(view.objects),
}


# --------------------------------------------------------------------------------------------------
# Parameters


def _ref(name: str, what: str) -> Param:
    return Param(name, "string", f"{what}: exact name or moid.", required=True)


_VM = _ref("vm", "The VM")
_WINDOW = (
    Param("start", "string", "Window start, ISO-8601 (e.g. 2025-01-31T14:00:00Z; no offset means UTC)."),
    Param("end", "string", "Window end, ISO-8601; defaults to now."),
    Param("minutes", "number", "Look back this many minutes from end when start is not given.", default=60,
          minimum=1, maximum=60 * 24 * 31),
    Param("user", "string", "Only records of this user (exact)."),
    Param("entity_name", "string", "Regular expression searched in the entity names each record carries "
                                   "(finds records about deleted objects too); RE2 syntax, at most 200 "
                                   "characters."),
    Param("max_scan", "integer", "Most records to read from the window; a busier window is an error "
                                 "(scan_limit_reached), never a silently partial list.", default=5000,
          minimum=1, maximum=100000),
    Param("max_results", "integer", "Most matching records to return (newest first); 'truncated' marks "
                                    "a cut.", default=500, minimum=1, maximum=5000),
)

_LIST_VMS_PARAMS = (
    TARGETS,
    Param("name", "string", "Only the VM with exactly this name."),
    Param("regex", "string", "Regular expression searched in VM names (anchor with ^ and $); RE2 syntax, "
                                   "at most 200 characters."),
    Param("folder", "string", "A folder path (/DC0/vm/prod: that folder and below) or a folder name "
                              "(VMs directly in a folder of that name)."),
    Param("resource_pool", "string", "Resource pool name or moid."),
    Param("power_state", "string", "Power state.", enum=VM_POWER_STATES),
    Param("connection_state", "string", "Connection state: orphaned, inaccessible or invalid VMs keep "
                                        "reporting stale power states and refuse most operations.",
          enum=VM_CONNECTION_STATES),
    Param("created_before", "string", "Created before this ISO-8601 time (VMs without a creation date "
                                      "never match)."),
    Param("created_after", "string", "Created after this ISO-8601 time (VMs without a creation date never "
                                     "match)."),
    Param("fields", "array", "Columns to return; default: " + ", ".join(listings.DEFAULT_VM_FIELDS)
          + "; also: " + ", ".join(c for c in listings.VM_COLUMNS if c not in listings.DEFAULT_VM_FIELDS)
          + "."),
    Param("limit", "integer", "Return at most this many rows (sorted by name); 'truncated' marks a cut.",
          minimum=1),
)


def _read_tool(name: str, description: str, read: ReadFn, *params: Param,
               privileges: tuple[str, ...] = ("System.View",),
               read_with_lookup: Callable[[Any, Mapping[str, Any], Any], Any] | None = None) -> ToolSpec:
    return ToolSpec(name=name, description=description, category=Category.READ, risk=Risk.LOW,
                    params=(TARGETS, *params), target_mode="fanout", read=read, privileges=privileges,
                    read_with_lookup=read_with_lookup)


READ_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="list_vms",
        description="List VMs with power and connection state, creation time, host, guest IP, CPU and "
                    "memory. Filters combine (all must hold); rows are sorted by name.",
        category=Category.READ, risk=Risk.LOW, params=_LIST_VMS_PARAMS, target_mode="fanout", read=_list_vms,
    ),
    _read_tool("get_vm_details", "One VM in depth: placement (folder, pool, host, cluster), hardware, disks, "
               "NICs, CD-ROMs, guest information, storage use and snapshot pointer.",
               _vm_details, _VM, read_with_lookup=_vm_details),
    _read_tool("get_vm_performance", "Realtime CPU, memory, disk and network statistics of one VM (20-second "
               "samples): latest, average and maximum. Counters the target does not collect are listed as "
               "unavailable.", _vm_performance, _VM,
               Param("samples", "integer", "How many 20-second samples to summarise.", default=15, minimum=1,
                     maximum=180),
               privileges=("System.View", "System.Read")),
    _read_tool("list_hosts", "List ESXi hosts with cluster, connection and power state, maintenance mode, "
               "capacity, usage, version and VM count.", _list_hosts,
               Param("cluster", "string", "Only hosts of this cluster (name or moid).")),
    _read_tool("get_host_details", "One ESXi host in depth: hardware, product and build, states, usage, and "
               "the names of its datastores, networks and VMs.",
               _by("host", details.get_host_details), _ref("host", "The host")),
    _read_tool("list_clusters", "List clusters with capacity, host and datastore counts, and whether DRS and "
               "HA are enabled.", lambda session, _args: listings.list_clusters(session)),
    _read_tool("get_cluster_details", "One cluster: capacity, DRS/HA settings, its hosts with their states, "
               "datastores and resource pools.",
               _by("cluster", details.get_cluster_details), _ref("cluster", "The cluster")),
    _read_tool("list_datastores", "List datastores with type, capacity, free and provisioned space, "
               "accessibility, maintenance mode and VM count.",
               lambda session, _args: listings.list_datastores(session)),
    _read_tool("get_datastore_details", "One datastore: space, type, URL, the hosts that mount it and the "
               "VMs on it.", _by("datastore", details.get_datastore_details),
               _ref("datastore", "The datastore")),
    _read_tool("get_events", "Events in a time window (start/end, or minutes back from now), newest first, "
               "read by scrolling the whole window. Filters: event_type (an exact type such as "
               "VmPoweredOnEvent), user, entity_name.", _events,
               Param("event_type", "string", "Exact event type (class name such as VmPoweredOnEvent, or an "
                                             "extended event's type id)."), *_WINDOW),
    _read_tool("get_tasks", "Tasks queued in a time window (start/end, or minutes back from now), newest "
               "first. Filters: state, task_id, user, entity_name.", _tasks,
               Param("state", "string", "Task state.", enum=TASK_STATES),
               Param("task_id", "string", "One task by its key (task-123)."), *_WINDOW),
    _read_tool("get_customization_status", "Whether guest customization of a VM finished and succeeded, "
               "folding the guest's own customization report and the Customization events into one answer.",
               _by("vm", history.get_customization_status), _VM),
    _read_tool("list_snapshots", "A VM's snapshot tree, flattened: id, name, description, creation time, "
               "power state, parent, depth and which one is current.",
               _by("vm", details.list_snapshots), _VM),
)


LIST_TARGETS = ToolSpec(
    name="list_targets",
    description="List the configured vSphere targets you may use: address, tags, connectivity, product and "
                "version, instance uuid, last error, and entries that point at the same vCenter "
                "(shares_instance_with).",
    category=Category.READ, risk=Risk.LOW, target_mode="none",
)


# --------------------------------------------------------------------------------------------------
# list_targets


def target_about(session: Any) -> dict[str, Any]:
    """Product facts of one target (read at login; no extra request)."""
    return access.about(session)


def summarize_targets(
    targets: Sequence[Target], results: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per target from fan-out ``results`` (``{"ok": about}`` or ``{"error": {...}}`` by name).

    Entries whose endpoints report the same instance uuid list each other in ``shares_instance_with``:
    they are the same vCenter reached twice (an alias, or a linked-mode member listed again).
    ``circuit`` is ``open`` while the scheduler's breaker makes the target's calls fail fast (the
    error then carries ``retry_after_seconds``), else ``closed``.
    """
    rows = [_target_row(t, results.get(t.name)) for t in targets]
    by_uuid: dict[str, list[str]] = {}
    for row in rows:
        if row["instance_uuid"]:
            by_uuid.setdefault(row["instance_uuid"], []).append(row["name"])
    for row in rows:
        twins = [n for n in by_uuid.get(row["instance_uuid"] or "", []) if n != row["name"]]
        if twins:
            row["shares_instance_with"] = twins
    return rows


def _target_row(target: Target, result: Mapping[str, Any] | None) -> dict[str, Any]:
    about = (result or {}).get("ok") or {}
    error = (result or {}).get("error") if result is not None else {
        "code": "unreachable", "message": "no answer from this target"}
    return {
        "name": target.name, "host": target.host, "port": target.port, "address": target.address,
        "tags": list(target.tags), "standalone_host": target.standalone_host,
        "connectivity": "error" if error else "ok",
        "product": about.get("product"), "full_name": about.get("full_name"),
        "version": about.get("version"), "build": about.get("build"), "api_type": about.get("api_type"),
        "instance_uuid": about.get("instance_uuid"),
        "last_error": dict(error) if error else None,
        "circuit": (error or {}).get("circuit") or "closed",
    }


# --------------------------------------------------------------------------------------------------
# get_access_info

_STATUS = {True: "granted", False: "not_granted_at_root", None: "undetermined"}


def access_report(check: access.PrivilegeCheck, tools: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Per privilege and per tool: granted / not granted at the root folder / undetermined.

    A tool is ``ready`` when every privilege it needs is granted, ``missing`` when one is known not to
    be (listing them), else ``undetermined``. Undetermined is never reported as granted.
    """
    per_tool = []
    for name in sorted(tools):
        held = [check.held.get(p) for p in tools[name]]
        missing = [p for p, h in zip(tools[name], held, strict=True) if h is False]
        status = "missing" if missing else "ready" if all(h is True for h in held) else "undetermined"
        entry: dict[str, Any] = {"tool": name, "privileges": list(tools[name]), "status": status}
        if missing:
            entry["missing"] = missing
        per_tool.append(entry)
    out: dict[str, Any] = {
        "user": check.user, "checked_on": "root folder",
        "privileges": {p: _STATUS[h] for p, h in sorted(check.held.items())}, "tools": per_tool,
        "note": "Checked at the root folder only: privileges granted on individual objects are not covered, "
                "so 'not_granted_at_root' does not mean no access.",
    }
    if check.error:
        out["lookup_error"] = check.error
    return out


def access_info_reader(privileges_by_tool: Mapping[str, Sequence[str]]) -> ReadFn:
    """The get_access_info handler over a fixed table of tool -> privileges."""
    table = {name: tuple(privs) for name, privs in privileges_by_tool.items()}

    def read(session: Any, args: Mapping[str, Any]) -> dict[str, Any]:
        tool = args.get("tool")
        if tool is not None and tool not in table:
            raise InvalidArgument("tool", f"unknown tool '{tool}'; known: {', '.join(sorted(table))}")
        tools = {tool: table[tool]} if tool else table
        wanted = sorted({p for privs in tools.values() for p in privs})
        return access_report(access.check_privileges(session, wanted), tools)

    return read


ACCESS_INFO_PRIVILEGES = ("System.View",)


def access_info_tool(specs: Sequence[ToolSpec]) -> ToolSpec:
    """get_access_info over ``specs`` (tools that talk to vSphere) plus itself."""
    table = {s.name: s.privileges for s in specs if s.target_mode != "none"}
    table["get_access_info"] = ACCESS_INFO_PRIVILEGES
    return _read_tool(
        "get_access_info", "The account the gateway uses on a target, the vSphere privileges each tool "
        "needs, and whether the account holds them at the root folder.", access_info_reader(table),
        Param("tool", "string", "Only this tool's privileges."), privileges=ACCESS_INFO_PRIVILEGES)
