"""Read rules that bite: which objects a read may show, decided by the rules file, pure.

Each object an answer shows is judged as if it were the call's one affected object: a listing leaves
out the denied ones and says how many (``withheld``); a read about a denied object is refused. The
filter runs after the mirror or sweep answered, so the mirror's answers stay the same for every caller.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from gateway.guard.policy.evaluate import evaluate
from gateway.guard.policy.model import OBJECT_FIELDS, CallFacts, Policy, Rule
from gateway.vocabulary import AffectedObject, Category

#: object fields that match VMs (by name, folder path, resource pool); ``names`` matches any object
VM_FIELDS: Final = ("vm_patterns", "folders", "resource_pools")

#: listings: the key of their rows and the kind of object each row is
LISTINGS: Final[Mapping[str, tuple[str, str]]] = {
    "list_vms": ("vms", "vm"), "list_hosts": ("hosts", "host"), "list_clusters": ("clusters", "cluster"),
    "list_datastores": ("datastores", "datastore"),
}
#: answers about one object: its kind and the keys of its moid and name
SINGLES: Final[Mapping[str, tuple[str, str, str]]] = {
    "get_vm_details": ("vm", "moid", "name"),
    "get_vm_performance": ("vm", "vm_moid", "vm"),
    "list_snapshots": ("vm", "vm_moid", "vm"),
    "get_customization_status": ("vm", "vm_moid", "vm"),
    "get_host_details": ("host", "moid", "name"),
    "get_cluster_details": ("cluster", "moid", "name"),
    "get_datastore_details": ("datastore", "moid", "name"),
}
#: lists inside answers about one object that name other objects: key -> (kind, key of the name in
#: a row, or None for a list of names)
NESTED: Final[Mapping[str, tuple[str, str | None]]] = {
    "vms": ("vm", None), "datastores": ("datastore", None), "networks": ("network", None),
    "hosts": ("host", "name"),
}
#: event fields naming an entity, and its kind (``vm`` also carries ``vm_moid``)
_EVENT_ENTITIES: Final = (("vm", "vm"), ("host", "host"), ("compute_resource", "cluster"),
                          ("datastore", "datastore"), ("datacenter", "datacenter"), ("network", "network"),
                          ("dvs", "dvs"))
#: records: the key of their list, and the entities one record names
RECORDS: Final[Mapping[str, str]] = {"get_events": "events", "get_tasks": "tasks"}
_ANY_KIND: Final = frozenset({"vm", "host", "cluster", "datastore", "datacenter", "network", "dvs", "object"})


def read_subjects(tool: str) -> frozenset[str]:
    """The kinds of inventory object a read tool shows (empty: none, e.g. list_targets)."""
    if tool in LISTINGS:
        return frozenset({LISTINGS[tool][1]})
    if tool in SINGLES:
        kinds = {SINGLES[tool][0]}
        return frozenset(kinds | ({"vm"} if tool in ("get_host_details", "get_datastore_details") else set()))
    return _ANY_KIND if tool in RECORDS else frozenset()


@dataclass(frozen=True)
class Subject:
    """One object a read shows, with what rules match on (unknown facts None)."""

    kind: str
    name: str | None
    moid: str | None = None
    folder: str | None = None
    resource_pool: str | None = None

    def affected(self) -> AffectedObject:
        return AffectedObject(type=self.kind, name=self.name or "", moid=self.moid or "",
                              folder=self.folder, resource_pool=self.resource_pool)


@dataclass(frozen=True)
class VmFacts:
    """Every VM of a target as the rules see it, by moid and by name."""

    by_moid: Mapping[str, Subject]
    by_name: Mapping[str, tuple[Subject, ...]] = field(default_factory=dict)

    @classmethod
    def of_rows(cls, rows: Iterable[Mapping[str, Any]]) -> VmFacts:
        """From list_vms rows with the columns moid, name, folder and resource_pool."""
        by_moid = {str(r["moid"]): Subject("vm", r.get("name"), str(r["moid"]), r.get("folder"),
                                           r.get("resource_pool")) for r in rows if r.get("moid")}
        by_name: dict[str, list[Subject]] = {}
        for subject in by_moid.values():
            by_name.setdefault(subject.name or "", []).append(subject)
        return cls(by_moid, {name: tuple(found) for name, found in by_name.items()})

    def vms(self, moid: str | None, name: str | None) -> tuple[Subject, ...]:
        """The VM a row names: by moid, else every VM of that name (all are judged: fail closed)."""
        if moid and moid in self.by_moid:
            return (self.by_moid[moid],)
        if name is not None and name in self.by_name:
            return self.by_name[name]
        return (Subject("vm", name, moid),)


#: VM columns the facts are read with (the server reads them from the mirror or a sweep)
VM_FACT_FIELDS: Final = ("moid", "name", "folder", "resource_pool")


@dataclass(frozen=True)
class ReadFilter:
    """What one read may show: the rules in force and the read as a call. ``needs_vm_facts`` when the
    read shows VMs (hand ``VmFacts`` to ``filter_answer``: a row or record may lack a VM's folder,
    pool, even its name)."""

    policy: Policy
    call: CallFacts
    now: datetime
    needs_vm_facts: bool = False

    def hides(self, subject: Subject) -> str | None:
        """The rule that hides ``subject`` from this read, or None when it may be shown."""
        decision = evaluate(replace(self.call, affected=(subject.affected(),)), self.policy, self.now)
        return None if decision.allowed else (decision.rule or "policy")

    def hides_any(self, subjects: Iterable[Subject]) -> str | None:
        return next((rule for s in subjects if (rule := self.hides(s)) is not None), None)


def read_filter(policy: Policy | None, call: CallFacts, now: datetime) -> ReadFilter | None:
    """The filter of one read, or None when no rule with object fields may apply to it (the read
    shows everything it found). Pure."""
    if policy is None or call.category is not Category.READ:
        return None
    # Only rules whose call fields fit this read can match one of its objects, and none after the
    # first of them without object fields (it matches every object). The objects are then decided
    # by ``evaluate`` over those rules alone: the read itself was allowed, so no rule matching means
    # shown, as under the whole policy; the reduced policy only saves time per object.
    active: list[Rule] = []
    for rule in policy.rules:
        if rule.match.fits_call(call):
            active.append(rule)
            if not rule.match.object_fields:
                break
    if not any(rule.match.object_fields for rule in active):
        return None
    reduced = Policy(policy.source, rules=tuple(active))
    return ReadFilter(reduced, call, now, needs_vm_facts="vm" in read_subjects(call.tool))


@dataclass(frozen=True)
class Shaping:
    """How a filtered listing is read and finished: read without the caller's ``limit`` (cut after
    filtering), with a ``moid`` column added when the caller did not ask for it (dropped again)."""

    limit: int | None = None
    drop_moid: bool = False

    @property
    def changes(self) -> bool:
        return self.limit is not None or self.drop_moid


def read_args(tool: str, args: Mapping[str, Any], filtered: bool) -> tuple[dict[str, Any], Shaping]:
    """The arguments to read with when some target's answer will be ``filtered``, and how to finish
    the answers. Only list_vms changes: its rows must name their VM, and its limit must count only
    what is shown. Pure."""
    if not filtered or tool != "list_vms":
        return dict(args), Shaping()
    out = {k: v for k, v in args.items() if k != "limit"}
    fields = list(args.get("fields") or ())
    drop = bool(fields) and "moid" not in fields
    if drop:
        out["fields"] = [*fields, "moid"]
    return out, Shaping(args.get("limit"), drop)


@dataclass(frozen=True)
class Filtered:
    """A filtered answer (``answer``, with ``withheld`` set), or the refusal of a read about one hidden
    object (``denied``: the rule; ``subject``: what it hid)."""

    answer: dict[str, Any] | None
    withheld: int = 0
    denied: str | None = None
    subject: Subject | None = None


def filter_answer(tool: str, answer: Mapping[str, Any], rules: ReadFilter | None,
                  vms: VmFacts | None = None, shaping: Shaping = Shaping()) -> Filtered:
    """``answer`` of read ``tool`` as ``rules`` let it be shown (None: everything, no ``withheld``),
    finished as ``shaping`` says (``read_args``). Pure; ``answer`` is never changed."""
    if rules is None:
        return Filtered(_finish(tool, answer, shaping))
    facts = vms or VmFacts({})
    if tool in SINGLES:
        kind, moid_key, name_key = SINGLES[tool]
        moid, name = answer.get(moid_key), answer.get(name_key)
        about = facts.vms(moid, name) if kind == "vm" else (Subject(kind, name, moid),)
        rule = rules.hides_any(about)
        if rule is not None:
            return Filtered(None, denied=rule, subject=about[0])
        return _nested(answer, rules, facts)
    if tool in LISTINGS:
        key, kind = LISTINGS[tool]
        rows = answer.get(key) or []
        kept, withheld = _keep(rows, lambda r: rules.hides_any(_row_subjects(kind, r, facts)))
        out = {**answer, key: kept, "withheld": withheld}
        if isinstance(answer.get("count"), int):
            out["count"] = answer["count"] - withheld
        return Filtered(_finish(tool, out, shaping), withheld)
    if tool in RECORDS:
        key = RECORDS[tool]
        kept, withheld = _keep(answer.get(key) or [], lambda r: rules.hides_any(_record_subjects(r, facts)))
        out = {**answer, key: kept, "withheld": withheld}
        for counter in ("count", "matched"):
            if isinstance(answer.get(counter), int):
                out[counter] = max(answer[counter] - withheld, 0)
        return Filtered(out, withheld)
    return Filtered(dict(answer))


def _nested(answer: Mapping[str, Any], rules: ReadFilter, facts: VmFacts) -> Filtered:
    """An answer about one shown object, with the objects its lists name (a host's VMs, a cluster's
    hosts, a datastore's mounts) filtered too; ``withheld`` when it has such lists."""
    out, withheld, lists = dict(answer), 0, False
    for key, (kind, name_key) in NESTED.items():
        items = answer.get(key)
        if not isinstance(items, list):
            continue
        lists = True

        def hidden(item: Any, kind: str = kind, name_key: str | None = name_key) -> str | None:
            if isinstance(item, Mapping):
                name = item.get(name_key or "name", item.get(kind))
                return rules.hides_any(_row_subjects(kind, {"name": name, "moid": item.get("moid")}, facts))
            return rules.hides_any(facts.vms(None, item) if kind == "vm" else (Subject(kind, str(item)),))

        out[key], cut = _keep(items, hidden)
        withheld += cut
    if lists:
        out["withheld"] = withheld
    return Filtered(out, withheld)


def _finish(tool: str, answer: Mapping[str, Any], shaping: Shaping) -> dict[str, Any]:
    """A listing cut at the caller's limit and without the columns added to filter it."""
    if tool not in LISTINGS or not shaping.changes:
        return dict(answer)
    key = LISTINGS[tool][0]
    rows = list(answer.get(key) or [])
    out = dict(answer)
    if shaping.limit is not None and len(rows) > shaping.limit:
        rows, out["truncated"] = rows[: shaping.limit], True
    if shaping.drop_moid:
        rows = [{k: v for k, v in row.items() if k != "moid"} for row in rows]
    out[key] = rows
    return out


def _keep(items: Sequence[Any], hidden_by: Callable[[Any], str | None]) -> tuple[list[Any], int]:
    kept = [item for item in items if hidden_by(item) is None]
    return kept, len(items) - len(kept)


def _row_subjects(kind: str, row: Mapping[str, Any], facts: VmFacts) -> tuple[Subject, ...]:
    if kind == "vm":
        return facts.vms(row.get("moid"), row.get("name"))
    return (Subject(kind, row.get("name"), row.get("moid")),)


def _record_subjects(record: Mapping[str, Any], facts: VmFacts) -> list[Subject]:
    """Every entity an event or task record names."""
    found: list[Subject] = []
    for key, kind in _EVENT_ENTITIES:
        if isinstance(record.get(key), str):
            if kind == "vm":
                found += facts.vms(record.get("vm_moid"), record[key])
            else:
                found.append(Subject(kind, record[key]))
    entity, moid = record.get("entity"), record.get("entity_moid")
    if entity is not None or moid is not None:  # a task: its entity, a VM when the facts know it
        known = facts.by_moid.get(moid or "")
        found.append(known or Subject("vm" if str(moid or "").startswith("vm-") else "object", entity, moid))
    if isinstance(record.get("object_name"), str):
        found.append(Subject("object", record["object_name"]))
    return found


# --------------------------------------------------------------------------- rules that cannot apply


def unreachable_rules(policy: Policy, tools: Mapping[str, Category]) -> list[str]:
    """One problem per rule whose object fields can never apply to any tool it names: ``vm_patterns``,
    ``folders`` or ``resource_pools`` on tools that show no VM, ``names`` on tools that show no object.
    Write and destructive tools carry objects of every kind. Pure."""
    problems = []
    for index, rule in enumerate(policy.rules):
        named = _named_tools(rule, tools)
        if named is None or not rule.match.object_fields:
            continue
        for name in rule.match.object_fields:
            wanted = {"vm"} if name in VM_FIELDS else _ANY_KIND
            if not any(_carries(tool, tools[tool]) & wanted for tool in named):
                what = "no VM" if name in VM_FIELDS else "no inventory object"
                problems.append(
                    f"{rule.where or policy.source}: rules[{index}].match.{name}: can never apply: "
                    f"{', '.join(sorted(named)) or 'no tool'} show{'s' if len(named) == 1 else ''} {what}; "
                    f"remove '{name}' or name a tool that shows {'VMs' if name in VM_FIELDS else 'objects'} "
                    "(e.g. list_vms, get_vm_details, get_events, or a write)")
    return problems


def _named_tools(rule: Rule, tools: Mapping[str, Category]) -> set[str] | None:
    """The tools ``rule`` names (None: it names none, so it may apply to every tool)."""
    items = rule.match.fields.get("tools")
    if items is None:
        return None
    categories = {c.value for c in Category}

    def named(tool: str, kind: Category) -> bool:
        return any(item == kind.value if item in categories
                   else fnmatch.fnmatchcase(tool.casefold(), item.casefold()) for item in items)

    return {tool for tool, kind in tools.items() if named(tool, kind)}


def _carries(tool: str, kind: Category) -> frozenset[str]:
    if kind is not Category.READ:
        return _ANY_KIND
    return read_subjects(tool)


__all__ = ["OBJECT_FIELDS", "Filtered", "ReadFilter", "Subject", "VmFacts", "filter_answer", "read_filter",
           "unreachable_rules"]
