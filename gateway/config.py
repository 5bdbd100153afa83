"""The strict YAML loader every configuration file uses, and ``targets.yaml`` loaded into ``Target``.

``load_yaml`` refuses repeated keys and merge keys (``<<``) and keeps where each key stood, so a parser can
say ``file:line:column`` (``located``). ``load_targets`` reports every problem of a file at once.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from gateway.errors import ConfigError

# --------------------------------------------------------------------------- the strict YAML loader


@dataclass(frozen=True, order=True)
class Mark:
    """A place in a file, 1-based like editors count."""

    line: int
    column: int

    @classmethod
    def of(cls, mark: yaml.Mark) -> Mark:
        return cls(mark.line + 1, mark.column + 1)


class YamlMap(dict[Any, Any]):
    """A mapping read by ``load_yaml``: ``start`` is where it begins, ``marks[key]`` where ``key`` is."""

    start: Mark = Mark(1, 1)
    marks: dict[Any, Mark]


class YamlList(list[Any]):
    """A list read by ``load_yaml``: ``start`` is where it begins, ``marks[i]`` where item ``i`` is."""

    start: Mark = Mark(1, 1)
    marks: list[Mark]


def builtin_name(value: object) -> str:
    """The built-in type of ``value`` (``list``, ``dict``), not the loader's ``YamlList``/``YamlMap``."""
    return next(t.__name__ for t in type(value).__mro__ if t.__module__ == "builtins")


def position(container: Any, key: Any = None) -> Mark | None:
    """Where ``key`` of ``container`` (or ``container`` itself, with no key) stood in its file; None
    for values that did not come from ``load_yaml``."""
    if key is None:
        return getattr(container, "start", None)
    if isinstance(container, YamlMap):
        return container.marks.get(key)
    if isinstance(container, YamlList) and isinstance(key, int) and 0 <= key < len(container.marks):
        return container.marks[key]
    return None


def located(source: str, container: Any = None, key: Any = None) -> str:
    """``file:line:column`` of ``key`` in ``container`` (just ``file`` when unknown)."""
    mark = position(container, key)
    return source if mark is None else f"{source}:{mark.line}:{mark.column}"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with duplicate keys refused and positions kept (see ``load_yaml``)."""

    duplicates: list[str]

    def construct_located_mapping(self, node: yaml.MappingNode) -> YamlMap:
        out = YamlMap()
        out.start, out.marks = Mark.of(node.start_mark), {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys ('<<') are not supported here; write the keys out",
                    key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain value, not a list or mapping",
                    key_node.start_mark) from None
            if key in out:  # noted, and the first value kept, so the file's other problems show too
                first, at = out.marks[key], Mark.of(key_node.start_mark)
                self.duplicates.append(
                    f"{self.name}:{at.line}:{at.column}: the key {key!r} appears twice in one mapping (first "
                    f"at line {first.line}, column {first.column}); keep only one")
                continue
            out[key] = self.construct_object(value_node, deep=True)
            out.marks[key] = Mark.of(key_node.start_mark)
        return out

    def construct_located_list(self, node: yaml.SequenceNode) -> YamlList:
        out = YamlList(self.construct_object(child, deep=True) for child in node.value)
        out.start, out.marks = Mark.of(node.start_mark), [Mark.of(child.start_mark) for child in node.value]
        return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _StrictLoader.construct_located_mapping)
_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG,
                              _StrictLoader.construct_located_list)


def load_yaml(text: str | bytes, source: str, problems: list[str] | None = None) -> Any:
    """Parse one configuration file's text strictly (see the module doc). ``ConfigProblems`` with one
    ``file:line:column: ...`` problem when it is not valid YAML. A repeated key is a problem too, but
    it does not stop the parse (the first value is kept): given ``problems``, each one is appended
    there and the data returned, so the caller reports the file's other problems in the same round
    (and must refuse the file); without it, ``ConfigProblems`` lists every repeated key."""
    loader = _StrictLoader(text)
    loader.name, loader.duplicates = source, []
    try:
        data = loader.get_single_data()
        if problems is None and loader.duplicates:
            raise ConfigProblems(loader.duplicates)
        if problems is not None:
            problems += loader.duplicates
        return data
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        context = f"{exc.context}: " if exc.context and exc.problem else (exc.context or "")
        kind = "" if isinstance(exc, yaml.constructor.ConstructorError) else "not valid YAML: "
        raise ConfigProblems([f"{where}: {kind}{context}{exc.problem or ''}".rstrip()]) from None
    except yaml.YAMLError as exc:
        raise ConfigProblems([f"{source}: not valid YAML: {exc}"]) from None
    finally:
        loader.dispose()


NameKind = Literal["target", "tool", "write tool", "destructive tool", "role"]


@dataclass(frozen=True)
class NameRef:
    """A name (or glob, when ``glob``) that a configuration entry uses for something defined elsewhere.

    ``where`` is ``file:line:column``, ``path`` the entry's path in its file (``rules[0].match.targets``),
    ``fold_case`` whether the name is compared case-insensitively (rules.yaml)."""

    kind: NameKind
    value: str
    where: str
    path: str
    glob: bool = True
    fold_case: bool = False


HTTPS_PORT = 443
MIRROR_MODES = ("off", "lazy", "eager")


@dataclass(frozen=True)
class KeyRule:
    """How targets.yaml writes one key of a target: its YAML type and the values it may take.

    ``positive``: above zero; ``low``/``high``: inclusive bounds; ``note`` ends the out-of-range problem
    (``{default}`` is the key's default)."""

    kind: type | tuple[type, ...]
    low: int | None = None
    high: int | None = None
    positive: bool = False
    choices: tuple[str, ...] = ()
    note: str = ""

    def problem(self, key: str, value: Any, default: Any) -> str | None:
        """The sentence saying ``value`` is out of range for ``key``; None when it is in range."""
        if self.choices and value not in self.choices:
            return f"'{key}' must be one of {', '.join(self.choices)}"
        if self.positive and value <= 0:
            return f"'{key}' must be positive"
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            return f"'{key}' must be between {self.low} and {self.high}{self.note.format(default=default)}"
        if self.low == 0 and self.high is None and value < 0:
            return f"'{key}' must be zero or positive"
        return None


def _rule(kind: type | tuple[type, ...], **bounds: Any) -> dict[str, KeyRule]:
    """The metadata of a ``Target`` field: how targets.yaml writes it."""
    return {"rule": KeyRule(kind, **bounds)}


_NUMBER = (int, float)


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Target:
    """One vSphere endpoint (a vCenter or a standalone ESXi host) that calls name explicitly.

    Each field's default and YAML rule are the only ones: ``parse_targets`` reads both from here."""

    name: str = field(metadata=_rule(str))
    host: str = field(metadata=_rule(str))
    credential_env_prefix: str = field(metadata=_rule(str))
    port: int = field(default=HTTPS_PORT, metadata=_rule(int))
    insecure: bool = field(default=False, metadata=_rule(bool))
    ca_file: str | None = field(default=None, metadata=_rule(str))
    tags: tuple[str, ...] = field(default=(), metadata=_rule(list))
    standalone_host: bool = field(default=False, metadata=_rule(bool))
    pool_size: int = field(default=2, metadata=_rule(int, low=1, high=32))
    max_queued_per_caller: int = field(default=32, metadata=_rule(
        int, low=1, high=10000,
        note=" (calls one caller may have waiting for this target; default {default:g})"))
    """Calls one caller may have waiting for this target's slots; past it a call is refused at once
    as ``busy`` (the queue timeout stays the last resort)."""
    timeout_seconds: float = field(default=60.0, metadata=_rule(_NUMBER, positive=True))
    dry_run: bool | None = field(default=None, metadata=_rule(bool))
    #: how long a proposal on this target waits for confirmation (None: GATEWAY_CONFIRM_TTL_SECONDS)
    proposal_ttl_seconds: float | None = field(default=None, metadata=_rule(
        _NUMBER, low=10, high=7 * 86400, note=" (7 days); gated targets typically want 900-3600"))
    mirror: str = field(default="lazy", metadata=_rule(str, choices=MIRROR_MODES))
    """Live inventory mirror for reads: ``off``, ``lazy`` (started by the first read) or ``eager``."""
    max_staleness_seconds: float | None = field(default=None, metadata=_rule(_NUMBER, low=0))
    """When set, mirror reads skip the freshness poll while the mirror heard from the target this recently."""
    mirror_check_seconds: float = field(default=300.0, metadata=_rule(
        _NUMBER, low=1, high=86400,
        note=" (how often the mirror compares itself with a live read; default {default:g})"))
    """How often the mirror compares everything it holds with a live read (a cheap rolling comparison
    runs in between; see ``gateway.vsphere.mirror_check``)."""

    @property
    def address(self) -> str:
        return self.host if self.port == HTTPS_PORT else f"{self.host}:{self.port}"

    def credentials(self, environ: Mapping[str, str]) -> Credentials:
        user = environ.get(f"{self.credential_env_prefix}_USER", "")
        password = environ.get(f"{self.credential_env_prefix}_PASSWORD", "")
        if not user or not password:
            raise ConfigError(
                f"target '{self.name}': credentials missing; set {self.credential_env_prefix}_USER and "
                f"{self.credential_env_prefix}_PASSWORD in the gateway's environment"
            )
        return Credentials(user, password)


#: every key of a target entry with its rule, in the order its problems are reported
_RULES: dict[str, KeyRule] = {spec.name: spec.metadata["rule"] for spec in fields(Target)}
_DEFAULTS: dict[str, Any] = {spec.name: spec.default for spec in fields(Target)
                             if spec.default is not MISSING}
_TARGET_KEYS = set(_RULES)


class ConfigProblems(ConfigError):
    """Several problems found in one file; ``problems`` lists each as a full sentence, most starting
    with ``file:line:column:``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems), problems=problems)
        self.problems = problems


#: how a value of each expected type is written in YAML (the fix hint of a type error)
_WRITTEN: dict[str, str] = {
    "int": "a whole number without quotes, e.g. {key}: 4",
    "int or float": "a number without quotes, e.g. {key}: 30",
    "bool": "true or false without quotes, e.g. {key}: true",
    "str": "text, quoted if it looks like a number, e.g. {key}: \"value\"",
    "list": "a list, e.g. {key}: [a, b]",
}


def type_problem(where: str, key: str, value: Any, kind: type | tuple[type, ...]) -> str | None:
    """``where: 'key' must be int, got str; write a whole number without quotes, e.g. key: 4`` when
    ``value`` is not of ``kind`` (a bool is no number); None when it is. Pure."""
    ok = False if isinstance(value, bool) and kind in (int, float, (int, float)) else isinstance(value, kind)
    if ok:
        return None
    names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
    form = _WRITTEN.get(names)
    hint = f"; write {form.format(key=key)}" if form else ""
    return f"{where}: '{key}' must be {names}, got {type(value).__name__}{hint}"


def _check_type(problems: list[str], where: str, key: str, value: Any, kind: type | tuple[type, ...]) -> bool:
    problem = type_problem(where, key, value, kind)
    if problem:
        problems.append(problem)
    return problem is None


def parse_targets(data: Any, source: str, environ: Mapping[str, str] | None = None, *,
                  check_files: bool = False) -> tuple[Target, ...]:
    """Turn parsed YAML into targets; raise ``ConfigProblems`` listing every problem found.
    ``check_files``: a ``ca_file`` that does not exist on this machine is a problem too."""
    problems: list[str] = []
    if isinstance(data, Mapping) and set(data) == {"targets"}:
        data = data["targets"]
    if not isinstance(data, list):
        raise ConfigProblems([f"{located(source, data)}: expected a top-level 'targets:' list of target "
                              "entries"])
    targets: list[Target] = []
    seen: dict[str, str] = {}
    for index, entry in enumerate(data):
        if not isinstance(entry, Mapping):
            problems.append(f"{located(source, data, index)}: target #{index + 1}: each target must be a "
                            "mapping with at least name, host, credential_env_prefix")
            continue
        name = entry.get("name")
        label = f"target '{name}'" if isinstance(name, str) and name else f"target #{index + 1}"

        def where(key: str | None = None, entry: Any = entry, index: int = index, label: str = label) -> str:
            at = located(source, entry, key) if key in entry else located(source, data, index)
            return f"{at}: {label}"

        target = _parse_target(entry, where, problems, environ, check_files)
        if target is None:
            continue
        if target.name in seen:
            problems.append(f"{where('name')}: duplicate name (also at {seen[target.name]}); every target "
                            "needs a unique 'name'")
            continue
        seen[target.name] = located(source, entry, "name")
        targets.append(target)
    if problems:
        raise ConfigProblems(problems)
    return tuple(targets)


def _parse_target(
    entry: Mapping[str, Any], where: Callable[..., str], problems: list[str],
    environ: Mapping[str, str] | None, check_files: bool = False,
) -> Target | None:
    before = len(problems)
    _key_problems(entry, where, problems)
    if len(problems) > before:
        return None
    values = {key: _value(key, entry.get(key)) for key in _RULES}
    if not all(isinstance(tag, str) for tag in values["tags"]):
        problems.append(f"{where('tags')}: 'tags' must be a list of strings")
        return None
    _value_problems(values, where, problems, check_files)
    target = Target(**values)
    if target.name in ("all", "*"):
        problems.append(f"{where('name')}: '{target.name}' is reserved (it means every target); pick another "
                        "name")
    if environ is not None:
        try:
            target.credentials(environ)
        except ConfigError as exc:
            problems.append(f"{where('credential_env_prefix')}: "
                            f"{exc.message.removeprefix(f'target {target.name!r}: ')}")
    return None if len(problems) > before else target


def _key_problems(entry: Mapping[str, Any], where: Callable[..., str], problems: list[str]) -> None:
    """Unknown keys, missing required keys and values of the wrong type (null means the default)."""
    for key in sorted(set(entry) - _TARGET_KEYS, key=str):
        hint = suggestion(str(key), _TARGET_KEYS)
        problems.append(f"{where(key)}: unknown key '{key}'{hint}; allowed keys are "
                        f"{', '.join(sorted(_TARGET_KEYS))}")
    for key, rule in _RULES.items():
        required = key not in _DEFAULTS
        if required and key not in entry:
            problems.append(f"{where()}: missing required key '{key}'")
        elif key in entry and (required or entry[key] is not None):
            _check_type(problems, where(key), key, entry[key], rule.kind)


def _value_problems(values: Mapping[str, Any], where: Callable[..., str], problems: list[str],
                    check_files: bool) -> None:
    """Values of the right type that do not fit: out of range, or ``insecure`` beside ``ca_file``."""
    if values["insecure"] and values["ca_file"]:
        problems.append(f"{where('insecure')}: set either 'insecure: true' or 'ca_file', not both")
    elif check_files and values["ca_file"] and not Path(values["ca_file"]).is_file():
        problems.append(f"{where('ca_file')}: ca_file '{values['ca_file']}' does not exist (or is not a "
                        "file); point it at the PEM bundle of the CA that signed the target's certificate "
                        "(a relative path counts from the gateway's working directory)")
    for key, rule in _RULES.items():
        problem = None if values[key] is None else rule.problem(key, values[key], _DEFAULTS.get(key))
        if problem:
            problems.append(f"{where(key)}: {problem}")


def _value(key: str, raw: Any) -> Any:
    """The Target value of ``raw`` (type-checked already): the default for a missing or null key."""
    kind = _RULES[key].kind
    if raw is None:
        return _DEFAULTS[key]
    if kind is list:
        return tuple(raw)
    return float(raw) if kind == _NUMBER else raw


def suggestion(word: str, choices: Any) -> str:
    """``; did you mean 'x'?`` for the closest of ``choices`` to ``word``, or nothing."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def load_targets(path: Path, environ: Mapping[str, str] | None = None) -> tuple[Target, ...]:
    """Load ``targets.yaml``; pass ``environ`` to also require every target's credentials."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigProblems(
            [
                f"{path}: cannot read targets file ({exc.strerror}); create it or set "
                "GATEWAY_TARGETS_FILE / --targets"
            ]
        ) from exc
    problems: list[str] = []
    data = load_yaml(text, str(path), problems)
    try:
        targets = parse_targets(data, str(path), environ, check_files=True)
    except ConfigProblems as exc:
        problems += exc.problems
    if problems:
        raise ConfigProblems(problems)
    return targets
