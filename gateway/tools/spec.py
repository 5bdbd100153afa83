"""What a tool is: a value in a table, not a decorated function.

Its category and risk decide its MCP annotations and how the guard treats it; its parameters decide
the input schema and validation. A write's ``plan`` resolves and changes nothing; ``execute`` changes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.audit.redact import redact_text
from gateway.errors import InvalidArgument
from gateway.vocabulary import Category, Plan, ProgressFn, Risk

__all__ = ["TARGET", "TARGETS", "Param", "ToolSpec", "by_name", "looks_like_moid"]


ParamType = Literal["string", "integer", "number", "boolean", "array", "target", "targets"]


@dataclass(frozen=True)
class Param:
    """One tool parameter. ``type='targets'`` accepts a name, a list of names or "all"."""

    name: str
    type: ParamType
    description: str
    required: bool = False
    default: Any = None
    enum: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    items: str = "string"
    #: a string's canonical form, applied when arguments are validated (raises ``InvalidArgument``),
    #: so policy, audit, proposals and vSphere see only that form (datastore paths, say)
    normalize: Callable[[str], str] | None = None

    def schema(self) -> dict[str, Any]:
        if self.type == "target":
            out: dict[str, Any] = {"type": "string"}
        elif self.type == "targets":
            out = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        elif self.type == "array":
            out = {"type": "array", "items": {"type": self.items}}
        else:
            out = {"type": self.type}
        out["description"] = self.description
        if self.enum:
            out["enum"] = list(self.enum)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.default is not None:
            out["default"] = self.default
        return out


TARGET = Param("target", "target", "Target name from targets.yaml (exactly one).", required=True)
TARGETS = Param("target", "targets", 'Target name, a list of names, or "all".', required=True)
_MOID = re.compile(r"^[a-z][a-zA-Z-]*-\d+$|^\d+$")


def looks_like_moid(ref: str) -> bool:
    return bool(_MOID.match(ref))


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    #: a tool that declares no category is treated as destructive (see __post_init__)
    category: Category | None = None
    risk: Risk = Risk.CRITICAL
    params: tuple[Param, ...] = ()
    target_mode: Literal["fanout", "single", "none"] = "single"
    read: Callable[[Any, Mapping[str, Any]], Any] | None = None
    #: the same read given a live inventory mirror's name index (``details.Lookup``, or None when
    #: the target has no synced mirror): it may skip its name search, checking the hint live
    read_with_lookup: Callable[[Any, Mapping[str, Any], Any], Any] | None = None
    plan: Callable[[Any, Mapping[str, Any]], Plan] | None = None
    execute: Callable[[Any, Plan, ProgressFn], Any] | None = None
    #: vSphere privileges the call needs (reported by get_access_info)
    privileges: tuple[str, ...] = ("System.View",)
    #: keys whose values are secrets: never audited, never echoed
    sensitive_params: tuple[str, ...] = ()
    #: execute this kind of change against a safety snapshot first (revert-type destructive actions)
    snapshot_before: bool = False
    #: the other tools a call with these arguments runs on the caller's behalf (bulk_vm_action with
    #: action=delete_vm runs delete_vm): the caller's role must hold every one of them as well
    reach: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        # Fail closed: an unclassified tool gets the strictest treatment rather than the laxest.
        if not isinstance(self.category, Category):
            object.__setattr__(self, "category", Category.DESTRUCTIVE)
            object.__setattr__(self, "risk", Risk.CRITICAL)

    @property
    def kind(self) -> Category:
        """The effective category (never None after construction)."""
        assert isinstance(self.category, Category)
        return self.category

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }

    def annotations(self) -> dict[str, Any]:
        return {
            "readOnlyHint": self.category is Category.READ,
            "destructiveHint": self.category is Category.DESTRUCTIVE,
            "idempotentHint": self.category is Category.READ,
            "openWorldHint": self.target_mode != "none",
        }

    def validate(self, args: Mapping[str, Any] | None) -> dict[str, Any]:
        """Check ``args`` against the declared parameters; return them with defaults filled in."""
        args = dict(args or {})
        known = {p.name for p in self.params}
        for extra in sorted(set(args) - known):
            raise InvalidArgument(
                extra, f"unknown parameter for {self.name}; accepted: {', '.join(sorted(known))}"
            )
        out: dict[str, Any] = {}
        for p in self.params:
            if args.get(p.name) is None:
                if p.required:
                    raise InvalidArgument(p.name, f"required by {self.name}")
                if p.default is not None:
                    out[p.name] = p.default
                continue
            out[p.name] = _check_value(p, args[p.name])
        if self.keeps_arguments:
            _refuse_credentials(out)
        return out

    @property
    def keeps_arguments(self) -> bool:
        """A call of this tool becomes a proposal, which keeps its arguments until it is confirmed,
        approved or settled (to plan it again then) and shows what they resolved to to people."""
        return self.category is Category.DESTRUCTIVE and self.plan is not None

    def reaches(self, args: Mapping[str, Any]) -> tuple[str, ...]:
        return self.reach(args) if self.reach is not None else ()


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "target": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
}


def _is_instance(value: Any, kinds: tuple[type, ...]) -> bool:
    # a plain predicate, so that the caller's value stays typed as Any for the range checks
    return isinstance(value, kinds)


#: input bounds: a target name, any other string, an array's length (larger input is invalid_argument)
MAX_TARGET_CHARS = 256
MAX_STRING_CHARS = 4096
MAX_ARRAY_ITEMS = 1000


def _bounded_string(p: Param, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidArgument(p.name, f"is {len(value)} characters long; at most {limit} are accepted")
    return value


def _finite(p: Param, value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(p.name, "must be a finite number (NaN and Infinity are not accepted)")
    return value


def _refuse_credentials(args: Mapping[str, Any]) -> None:
    """A proposal never keeps a secret: an argument holding credential-shaped text (what the audit's
    redaction would mask: ``password is ...``, an access key, a token) is refused, so neither the
    stored proposal nor anything shown or sent from it can carry one. The refusal names the argument,
    never its value."""
    for name, value in args.items():
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and redact_text(text) != text for text in texts):
            raise InvalidArgument(
                name, "holds text shaped like a credential (a password phrase, a key or a token); a "
                "proposal keeps its arguments and shows what they select to the people who approve it, so "
                "it never takes a secret: remove it from the argument")


def _check_value(p: Param, value: Any) -> Any:  # noqa: C901 - one flat check per JSON-schema keyword
    if p.type == "targets":
        if isinstance(value, str) and value:
            return _bounded_string(p, value, MAX_TARGET_CHARS)
        if (isinstance(value, list) and value and len(value) <= MAX_ARRAY_ITEMS
                and all(isinstance(v, str) and v for v in value)):
            for v in value:
                _bounded_string(p, v, MAX_TARGET_CHARS)
            return list(dict.fromkeys(value))
        raise InvalidArgument(p.name, 'expected a target name, a non-empty list of names, or "all"')
    if isinstance(value, str):
        _bounded_string(p, value, MAX_TARGET_CHARS if p.type == "target" else MAX_STRING_CHARS)
    _finite(p, value)
    kinds = _PY_TYPES[p.type]
    if isinstance(value, bool) and p.type in ("integer", "number"):
        raise InvalidArgument(p.name, f"expected {p.type}, got boolean")
    if not _is_instance(value, kinds):
        raise InvalidArgument(p.name, f"expected {p.type}, got {type(value).__name__}")
    if p.type in ("string", "target") and not value:
        raise InvalidArgument(p.name, "must not be empty")
    if p.normalize is not None and isinstance(value, str):
        value = p.normalize(value)
    if p.enum and value not in p.enum:
        raise InvalidArgument(p.name, f"must be one of {', '.join(p.enum)}")
    if p.minimum is not None and value < p.minimum:
        raise InvalidArgument(p.name, f"must be >= {p.minimum:g}")
    if p.maximum is not None and value > p.maximum:
        raise InvalidArgument(p.name, f"must be <= {p.maximum:g}")
    if p.type == "array":
        if len(value) > MAX_ARRAY_ITEMS:
            raise InvalidArgument(p.name, f"has {len(value)} items; at most {MAX_ARRAY_ITEMS} are accepted")
        item_kinds = _PY_TYPES.get(p.items, (object,))
        if not all(_is_instance(v, item_kinds) for v in value):
            raise InvalidArgument(p.name, f"every item must be {p.items}")
        for v in value:
            if isinstance(v, str):
                _bounded_string(p, v, MAX_STRING_CHARS)
            _finite(p, v)
    return value


def by_name(specs: Sequence[ToolSpec]) -> dict[str, ToolSpec]:
    table: dict[str, ToolSpec] = {}
    for spec in specs:
        if spec.name in table:
            raise ValueError(f"tool {spec.name!r} declared twice")
        table[spec.name] = spec
    return table
