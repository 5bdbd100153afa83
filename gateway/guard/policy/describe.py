"""``gateway policy show``: the effective policy per target as plain values, with dead entries marked."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.config import Target
from gateway.errors import ConfigError
from gateway.guard.names import KnownNames, UnknownName, unknown_names
from gateway.guard.policy.model import Policy, glob_fits
from gateway.guard.policy.read_filter import unreachable_rules
from gateway.guard.policy.store import PolicyStore


def describe(store: PolicyStore, targets: Sequence[Target],
             known: KnownNames | None = None) -> dict[str, Any]:
    """The effective policy per target of the rules file ``store`` follows, or that the file is broken,
    since when (its modification time) and why (for ``gateway policy show``). With ``known``, entries
    naming a target, tool, role or tag that matches nothing are marked."""
    try:
        policy = store.current()
    except ConfigError as exc:
        problems = exc.details.get("problems") or [exc.message]
        broken = store.broken
        since = broken[0] if broken is not None else time.time()
        return {"file": str(store.path), "status": "error", "broken": True,
                "broken_since": datetime.fromtimestamp(since, UTC).isoformat(timespec="seconds"),
                "errors": problems,
                "effect": "every call the policy decides is denied until it is fixed; no earlier rules "
                          "stay in force"}
    unknown = unknown_names(policy.refs, known) if known is not None else []
    shown = _describe(policy, store.path, targets, unknown)
    unreachable = unreachable_rules(policy, known.tools) if known is not None else []
    for index, rule in enumerate(shown["rules"]):
        found = [p for p in unreachable if f": rules[{index}]." in p]
        if found:
            rule["warnings"] = [*rule.get("warnings", []), *found]
    if unreachable:
        shown["warnings"] = [*shown.get("warnings", []), *unreachable]
    return shown


def _describe(policy: Policy, path: Path, targets: Sequence[Target],
              unknown: Sequence[UnknownName] = ()) -> dict[str, Any]:
    def warnings(prefix: str) -> list[str]:
        return [u.message for u in unknown if u.ref.path == prefix or u.ref.path.startswith(f"{prefix}.")]

    def marked(entry: dict[str, Any], prefix: str) -> dict[str, Any]:
        found = warnings(prefix)
        return {**entry, "warnings": found} if found else entry

    per_target = {}
    for target in targets:
        settings = policy.target_settings(target.name).to_dict()
        settings["tags"] = list(target.tags)
        settings["rules"] = [rule.name for rule in policy.rules if rule.may_apply_to(target)]
        settings["protected"] = [p.name for p in policy.protected
                                 if not p.targets or glob_fits(target.name, p.targets)]
        settings["maintenance_windows"] = [w.name for w in policy.maintenance_windows
                                           if not w.targets or glob_fits(target.name, w.targets)]
        per_target[target.name] = settings
    out: dict[str, Any] = {
        "file": str(path),
        "status": "builtin" if policy.builtin else "ok",
        "defaults": policy.default_settings().to_dict(),
        "protected": [marked(p.to_dict(), f"protected[{i}]") for i, p in enumerate(policy.protected)],
        "rules": [marked(r.to_dict(), f"rules[{i}]") for i, r in enumerate(policy.rules)],
        "maintenance_windows": [marked(w.to_dict(), f"maintenance_windows[{i}]")
                                for i, w in enumerate(policy.maintenance_windows)],
        "target_entries": {},
        "targets": per_target,
    }
    for entry in policy.targets:
        names = [t.name for t in targets if glob_fits(t.name, (entry.pattern,))]
        shown: dict[str, Any] = {"matches": names,
                                 "settings": {k: getattr(v, "value", v) for k, v in entry.values.items()}}
        found = warnings(f"targets.{entry.pattern}")
        if found:
            shown["warning"] = "; ".join(found)
        out["target_entries"][entry.pattern] = shown
    if unknown:
        out["warnings"] = [str(u) for u in unknown]
    if policy.note:
        out["note"] = policy.note
    return out
