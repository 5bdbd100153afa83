"""Assemble the tool table for one server: capability gating, then read-only mode.

Read-only mode removes every non-read tool, then proves none survived, or the server refuses to start.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.errors import ConfigError
from gateway.guard.idempotency_rules import DEFAULT_WINDOW_SECONDS, KEY_FIELD, checked_key
from gateway.tools.destructive import DESTRUCTIVE_TOOLS
from gateway.tools.pending import PENDING_TOOLS
from gateway.tools.read import LIST_TARGETS, READ_TOOLS, access_info_tool
from gateway.tools.spec import Param, ToolSpec, by_name
from gateway.tools.write import WRITE_TOOLS
from gateway.vocabulary import Category

log = logging.getLogger(__name__)


class ReadOnlyGateError(ConfigError):
    """Read-only mode was requested but could not be proven."""


@dataclass(frozen=True)
class Registry:
    tools: dict[str, ToolSpec]
    withheld: tuple[str, ...]

    def get(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.tools.values())


OVERRIDE = Param(
    "override", "boolean",
    "Ask policy to skip deny rules marked unless_override (protected objects and the rest of the policy "
    "still apply). Use only when a person asked for it.", default=False)


IDEMPOTENCY_KEY = Param(
    KEY_FIELD, "string",
    "A key of your choice (a UUID) naming this call: a retry with the same key and the same arguments, "
    f"within {DEFAULT_WINDOW_SECONDS / 3600:g} h by default, returns the first call's outcome and never runs "
    "again (also while the first still runs). Without it, the request's _meta.idempotency_key is used.",
    normalize=checked_key)


def _with_override(spec: ToolSpec) -> ToolSpec:
    """A change's tool with the parameters every change takes: ``override`` and the idempotency key."""
    if spec.target_mode == "none" or any(p.name == "override" for p in spec.params):
        return spec
    # the key opens the outcome kept for it (``server.call.idempotency``): audited as *** like a secret
    return replace(spec, params=(*spec.params, OVERRIDE, IDEMPOTENCY_KEY),
                   sensitive_params=(*spec.sensitive_params, KEY_FIELD))


def all_tools(*, destructive: bool) -> list[ToolSpec]:
    """Every tool this build offers; destructive ones (and the proposal tools) only when enabled."""
    changes = [*WRITE_TOOLS, *(DESTRUCTIVE_TOOLS if destructive else ())]
    specs: list[ToolSpec] = [LIST_TARGETS, *READ_TOOLS, *(_with_override(s) for s in changes)]
    if destructive:
        specs += PENDING_TOOLS
    specs.append(access_info_tool(specs))
    return specs


def tool_categories() -> dict[str, Category]:
    """Every tool this build offers, destructive ones included (a server may enable them later), with
    its category: what names in rules.yaml and roles.yaml are checked against."""
    return {spec.name: spec.kind for spec in all_tools(destructive=True)}


def _allowed(spec: ToolSpec, allow_write: Sequence[str]) -> bool:
    return spec.kind is Category.WRITE and spec.name in allow_write


def apply_read_only(specs: Sequence[ToolSpec], allow_write: Sequence[str] = ()) -> tuple[list[ToolSpec],
                                                                                          list[str]]:
    """Keep the read tools (and the write tools named in ``allow_write``); return them and the sorted
    names of the tools withheld."""
    kept = [s for s in specs if s.kind is Category.READ or _allowed(s, allow_write)]
    return kept, sorted(s.name for s in specs if s not in kept)


def verify_read_only(offered: Sequence[ToolSpec], allow_write: Sequence[str] = ()) -> None:
    """Prove read-only mode on what will actually be offered: every tool must be a read, by category
    and by its MCP annotation, or a write tool named in ``allow_write`` (``gateway.tools.exposure``).
    Raises ``ReadOnlyGateError`` (the server refuses to start) otherwise."""
    survivors = sorted(s.name for s in offered if not _allowed(s, allow_write)
                       and (s.kind is not Category.READ or not s.annotations()["readOnlyHint"]))
    if survivors:
        raise ReadOnlyGateError(f"read-only mode is on but {', '.join(survivors)} would still be offered; "
                                "refusing to start")


def build_registry(*, destructive: bool, read_only: bool, allow_write: Sequence[str] = ()) -> Registry:
    specs = all_tools(destructive=destructive)
    withheld: list[str] = []
    if allow_write and not read_only:
        raise ConfigError("--allow-write narrows --read-only (reads plus those writes); without --read-only "
                          "every write tool is offered already: add --read-only or drop --allow-write")
    if read_only:
        specs, withheld = apply_read_only(specs, allow_write)
        verify_read_only(specs, allow_write)
        log.warning("read-only mode: withholding %d tools: %s%s", len(withheld), ", ".join(withheld),
                    f" (writes allowed: {', '.join(allow_write)})" if allow_write else "")
    return Registry(by_name(specs), tuple(withheld))
