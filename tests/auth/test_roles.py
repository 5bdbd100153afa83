"""Roles: the permits table, strict parsing, and the RoleBook following roles.yaml on disk."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auth.roles import RoleBook, load_roles, parse_roles
from gateway.config import ConfigProblems
from gateway.guard.decision import may_read_audit_row
from gateway.role import BUILTIN_ROLES, Role, permits
from gateway.vocabulary import Category

R, W, D = Category.READ, Category.WRITE, Category.DESTRUCTIVE
READER, ADMIN = BUILTIN_ROLES["reader"], BUILTIN_ROLES["admin"]
OPERATOR = Role("vm-operator", tools="read", allow_write=frozenset({"power_on_vm"}),
                allow_destructive=frozenset({"delete_snapshot"}), targets=("lab-*", "dev-vc1"),
                approve="none")
LISTED = Role("janitor", tools=frozenset({"list_vms", "power_off_vm"}), targets="*", approve="others")
EXAMPLE = Path(__file__).resolve().parents[2] / "roles.example.yaml"

PERMITS: list[tuple[Role, str, Category, str | None, bool]] = [
    (READER, "list_vms", R, "vc1", True),
    (READER, "list_vms", R, "all", True),
    (READER, "list_targets", R, None, True),
    (READER, "power_on_vm", W, "vc1", False),
    (READER, "delete_vm", D, "vc1", False),
    (ADMIN, "delete_vm", D, "vc1", True),
    (ADMIN, "anything_new", W, "all", True),
    (OPERATOR, "list_vms", R, "lab-01", True),
    (OPERATOR, "list_vms", R, "dev-vc1", True),
    (OPERATOR, "list_vms", R, "prod-vc1", False),
    (OPERATOR, "list_vms", R, "LAB-01", False),  # globs are case-sensitive
    (OPERATOR, "list_vms", R, "all", False),  # "all" needs targets: "*"
    (OPERATOR, "list_vms", R, "*", False),
    (OPERATOR, "power_on_vm", W, "lab-01", True),
    (OPERATOR, "power_off_vm", W, "lab-01", False),
    (OPERATOR, "delete_snapshot", D, "lab-01", True),
    (OPERATOR, "delete_snapshot", D, "prod-vc1", False),
    (OPERATOR, "delete_vm", D, "lab-01", False),
    (OPERATOR, "power_on_vm", D, "lab-01", False),  # a misfiled name grants nothing
    (OPERATOR, "delete_snapshot", W, "lab-01", False),
    (OPERATOR, "list_targets", R, None, True),
    (LISTED, "list_vms", R, "vc1", True),
    (LISTED, "power_off_vm", W, "all", True),
    (LISTED, "list_hosts", R, "vc1", False),  # a list is exactly those names, not every read tool
]


@pytest.mark.parametrize(("role", "tool", "category", "target", "allowed"), PERMITS,
                         ids=[f"{r.name}-{t}-{c}-{g}" for r, t, c, g, _ in PERMITS])
def test_permits(role: Role, tool: str, category: Category, target: str | None, allowed: bool) -> None:
    assert permits(role, tool, category, target) is allowed


def test_builtins() -> None:
    assert READER.approve == "none" and READER.all_targets and READER.tools == "read"
    assert ADMIN.approve == "any" and ADMIN.all_targets and ADMIN.tools == "*"
    assert not OPERATOR.all_targets


def role_doc(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"tools": "read", "allow_write": ["power_on_vm"], "allow_destructive": [],
                             "targets": ["lab-*"], "approve": "none"}
    entry.update(changes)
    return {"roles": {"ops": {k: v for k, v in entry.items() if v is not ...}}}


def test_parse_a_valid_role() -> None:
    roles = parse_roles(role_doc(), "roles.yaml")
    assert roles == {"ops": Role("ops", "read", frozenset({"power_on_vm"}), frozenset(), ("lab-*",), "none")}


@pytest.mark.parametrize(("changes", "problem"), [
    ({"approve": ...}, "missing key 'approve'"),
    ({"targets": ...}, "missing key 'targets'"),
    ({"allow_destructive": ...}, "missing key 'allow_destructive'"),
    ({"color": "red"}, "unknown key 'color'"),
    ({"approve": False}, "'approve' must be one of none, any, others"),
    ({"approve": "yes"}, "'approve' must be one of"),
    ({"approve": None}, "'approve' must be one of"),
    ({"tools": "all"}, "'tools' must be read"),
    ({"tools": None}, "'tools' must be read"),
    ({"tools": ["list_*"]}, "patterns are not accepted"),
    ({"allow_write": "*"}, "'allow_write' must be a list"),
    ({"allow_write": None}, "'allow_write' must be a list"),
    ({"allow_destructive": ["delete_*"]}, "patterns are not accepted"),
    ({"allow_destructive": [3]}, "not a tool name"),
    ({"targets": "all"}, 'spell every target "*"'),
    ({"targets": [""]}, "'targets' must be"),
    ({"targets": None}, "'targets' must be"),
    ({"queue_weight": 0}, "'queue_weight' must be a number from 0.1 to 100"),
    ({"queue_weight": 101}, "'queue_weight' must be a number"),
    ({"queue_weight": True}, "'queue_weight' must be a number"),
    ({"queue_weight": "3"}, "'queue_weight' must be a number"),
    ({"queue_weight": None}, "'queue_weight' must be a number"),
])
def test_parse_problems(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigProblems) as info:
        parse_roles(role_doc(**changes), "roles.yaml")
    assert any(problem in p for p in info.value.problems), info.value.problems
    assert all(p.startswith("roles.yaml: role 'ops'") for p in info.value.problems)


def test_parse_collects_every_problem() -> None:
    b = {"tools": "read", "allow_write": [], "allow_destructive": [], "targets": "*", "approve": "maybe"}
    data = {"roles": {"a": {"tools": "all"}, "b": b}}
    with pytest.raises(ConfigProblems) as info:
        parse_roles(data, "r.yaml")
    text = "\n".join(info.value.problems)
    assert "role 'a'" in text and "role 'b'" in text and len(info.value.problems) >= 5


@pytest.mark.parametrize(("changes", "weight"), [({}, 1.0), ({"queue_weight": 3}, 3.0),
                                                 ({"queue_weight": 0.5}, 0.5)])
def test_queue_weight_is_optional_and_every_role_alike_by_default(changes: dict[str, Any],
                                                                  weight: float) -> None:
    assert parse_roles(role_doc(**changes), "roles.yaml")["ops"].queue_weight == weight


@pytest.mark.parametrize("name", ["reader", "admin"])
def test_builtins_cannot_be_redefined(name: str) -> None:
    doc = role_doc()
    doc["roles"] = {name: doc["roles"]["ops"]}
    with pytest.raises(ConfigProblems, match="built in"):
        parse_roles(doc, "roles.yaml")


@pytest.mark.parametrize("data", [[1, 2], {"role": {}}, {"roles": {}, "extra": 1}, {"roles": ["ops"]}, "x"])
def test_bad_top_level(data: Any) -> None:
    with pytest.raises(ConfigProblems):
        parse_roles(data, "roles.yaml")


@pytest.mark.parametrize("data", [None, {"roles": None}, {"roles": {}}])
def test_empty_files_define_no_roles(data: Any) -> None:
    assert parse_roles(data, "roles.yaml") == {}


def test_targets_list_with_star_means_every_target() -> None:
    assert parse_roles(role_doc(targets=["lab-*", "*"]), "r")["ops"].all_targets


def test_the_example_file_parses() -> None:
    roles = load_roles(EXAMPLE.read_bytes(), str(EXAMPLE))
    assert {"vm-operator", "change-approver", "snapshot-janitor"} <= set(roles)


def _no_wider(cut: Role, full: Role) -> bool:
    """Every permission of ``cut`` is also one of ``full``."""
    tools_ok = cut.tools == full.tools or full.tools == "*" or (
        isinstance(cut.tools, frozenset) and isinstance(full.tools, frozenset) and cut.tools <= full.tools)
    targets_ok = full.all_targets or (not cut.all_targets and set(cut.targets) <= set(full.targets))
    rank = ["none", "others", "any"]
    return (tools_ok and targets_ok and cut.allow_write <= full.allow_write
            and cut.allow_destructive <= full.allow_destructive
            and rank.index(cut.approve) <= rank.index(full.approve))


BLOCK_STYLE = """\
roles:
  ops:
    approve: others
    allow_write:
      - power_on_vm
      - power_off_vm
    allow_destructive:
      - delete_snapshot
    targets:
      - lab-1
      - lab-2
    tools:
      - list_vms
      - list_hosts
  viewer:
    tools: read
    allow_write: []
    allow_destructive: []
    targets: "*"
    approve: none
"""


@pytest.mark.parametrize("text", [BLOCK_STYLE, EXAMPLE.read_text()], ids=["block-style", "example"])
def test_a_file_cut_anywhere_never_widens_a_role(text: str) -> None:
    full = load_roles(text.encode(), "full")
    parsed_roles = 0
    for cut_at in range(len(text)):
        try:
            roles = load_roles(text[:cut_at].encode(), "cut")
        except ConfigProblems:
            continue
        parsed_roles += len(roles)
        for name, role in roles.items():
            assert name in full, (cut_at, name)
            assert _no_wider(role, full[name]), (cut_at, role, full[name])
    assert parsed_roles > 0  # some cuts do parse: the property was exercised


def test_a_file_cut_mid_role_is_refused() -> None:
    text = "roles:\n  ops:\n    tools: \"*\"\n    allow_write: []\n"
    with pytest.raises(ConfigProblems, match="missing key 'allow_destructive'"):
        load_roles(text.encode(), "roles.yaml")


def test_a_file_without_its_final_newline_is_refused() -> None:
    text = yaml.safe_dump(role_doc())
    assert load_roles(text.encode(), "roles.yaml")
    with pytest.raises(ConfigProblems, match="newline"):
        load_roles(text.rstrip("\n").encode(), "roles.yaml")


def test_invalid_yaml_is_a_problem() -> None:
    with pytest.raises(ConfigProblems, match="not valid YAML"):
        load_roles(b"roles: [unclosed\n", "roles.yaml")


# -- RoleBook --------------------------------------------------------------------------------------

def write(path: Path, data: Any) -> str:
    text = data if isinstance(data, str) else yaml.safe_dump(data)
    path.write_text(text)
    os.chmod(path, 0o600)
    return hashlib.sha256(text.encode()).hexdigest()


def test_rolebook_without_a_file_serves_builtins(tmp_path: Path) -> None:
    book = RoleBook(tmp_path / "roles.yaml")
    assert book.get("reader") is READER and book.get("admin") is ADMIN
    assert book.get("ops") is None
    assert book.check() == []
    assert set(book.roles()) == {"reader", "admin"}
    assert book.sha256 is None


def test_rolebook_reloads_on_change_and_reports_each_valid_content(tmp_path: Path) -> None:
    path = tmp_path / "roles.yaml"
    reloads: list[tuple[str, list[str]]] = []
    book = RoleBook(path, on_reload=lambda sha, names: reloads.append((sha, names)))
    first = write(path, role_doc())
    role = book.get("ops")
    assert role is not None and role.targets == ("lab-*",)
    assert book.get("ops") == role
    assert reloads == [(first, ["ops"])]
    # same size, same second: found by content, not by size or mtime
    second = write(path, role_doc(targets=["lab-+"]))
    assert len(path.read_bytes()) == len(yaml.safe_dump(role_doc()))
    changed = book.get("ops")
    assert changed is not None and changed.targets == ("lab-+",)
    assert reloads == [(first, ["ops"]), (second, ["ops"])]
    assert book.sha256 == second


def test_broken_file_disables_custom_roles_but_not_builtins(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "roles.yaml"
    reloads: list[str] = []
    book = RoleBook(path, on_reload=lambda sha, names: reloads.append(sha))
    write(path, role_doc())
    assert book.get("ops") is not None
    with caplog.at_level(logging.ERROR, logger="gateway.auth.roles"):
        write(path, "roles:\n  ops:\n    tools: read\n")
        assert book.get("ops") is None
    assert "missing key" in caplog.text
    assert book.get("reader") is READER and book.get("admin") is ADMIN
    assert any("missing key 'approve'" in p for p in book.check())
    assert len(reloads) == 1  # a broken file is not announced as a reload
    write(path, role_doc(approve="any"))
    fixed = book.get("ops")
    assert fixed is not None and fixed.approve == "any"
    assert len(reloads) == 2 and book.check() == []


def test_a_file_others_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "roles.yaml"
    write(path, role_doc())
    os.chmod(path, 0o666)
    book = RoleBook(path)
    assert book.get("ops") is None
    assert any("chmod 600" in p for p in book.check())
    os.chmod(path, 0o600)
    assert book.get("ops") is not None


def test_a_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give the file away")
    path = tmp_path / "roles.yaml"
    write(path, role_doc())
    os.chown(path, 54321, -1)
    assert RoleBook(path).get("ops") is None


def test_a_failing_reload_hook_keeps_the_previous_roles_and_retries(tmp_path: Path) -> None:
    path = tmp_path / "roles.yaml"
    fail = {"on": False}
    seen: list[str] = []

    def hook(sha: str, names: list[str]) -> None:
        if fail["on"]:
            raise RuntimeError("audit down")
        seen.append(sha)

    book = RoleBook(path, on_reload=hook)
    write(path, role_doc())
    assert book.get("ops") is not None
    fail["on"] = True
    new_sha = write(path, role_doc(targets="*"))
    kept = book.get("ops")  # the roles before stay in force while the new content cannot be recorded
    assert kept is not None and not kept.all_targets
    assert book.get("reader") is READER
    fail["on"] = False
    role = book.get("ops")
    assert role is not None and role.all_targets
    assert seen[-1] == new_sha


def test_removing_the_file_turns_custom_roles_off(tmp_path: Path) -> None:
    path = tmp_path / "roles.yaml"
    write(path, role_doc())
    book = RoleBook(path)
    assert book.get("ops") is not None
    path.unlink()
    assert book.get("ops") is None and book.get("reader") is READER
    assert book.sha256 is None


# --------------------------------------------------------------------------- repeated keys, positions


@pytest.mark.parametrize(("text", "position", "key", "first"), [
    ("roles:\n  ops:\n    tools: read\n    allow_write: []\n    allow_destructive: []\n"
     "    targets: [lab-1]\n    approve: none\n    targets: \"*\"\n",
     "roles.yaml:8:5", "targets", "line 6, column 5"),
    ("roles:\n  ops:\n    tools: read\n    allow_write: []\n    allow_destructive: []\n"
     "    targets: [lab-1]\n    approve: none\n    approve: any\n",
     "roles.yaml:8:5", "approve", "line 7, column 5"),
    ("roles:\n  ops: {tools: read, allow_write: [], allow_destructive: [], targets: [a], approve: none}\n"
     "  ops: {tools: \"*\", allow_write: [], allow_destructive: [], targets: \"*\", approve: any}\n",
     "roles.yaml:3:3", "ops", "line 2, column 3"),
])
def test_a_repeated_key_is_refused_not_silently_widening(text: str, position: str, key: str,
                                                         first: str) -> None:
    with pytest.raises(ConfigProblems) as info:
        load_roles(text.encode(), "roles.yaml")
    assert info.value.problems == [f"{position}: the key '{key}' appears twice in one mapping (first at "
                                   f"{first}); keep only one"]


def test_meaning_problems_carry_file_line_and_column() -> None:
    text = ("roles:\n  ops:\n    tools: read\n    allow_write: [power_on_vm]\n    allow_destructive: []\n"
            "    targets: all\n    approve: maybe\n")
    with pytest.raises(ConfigProblems) as info:
        load_roles(text.encode(), "roles.yaml")
    assert [p.split(": role")[0] for p in info.value.problems] == ["roles.yaml:6:5", "roles.yaml:7:5"]
    assert "'targets'" in info.value.problems[0] and "'approve'" in info.value.problems[1]
    with pytest.raises(ConfigProblems) as info:
        load_roles(text.replace("approve: maybe", "aprove: none").encode(), "roles.yaml")
    assert info.value.problems[0].startswith("roles.yaml:7:5: role 'ops': unknown key 'aprove'; did you mean "
                                             "'approve'?")


# --------------------------------------------------------------------------- the audit right


def test_builtin_audit_rights_and_the_safe_default() -> None:
    assert (READER.audit, ADMIN.audit) == ("own", "all")
    assert parse_roles(role_doc(), "roles.yaml")["ops"].audit == "none"
    assert parse_roles(role_doc(audit="own"), "roles.yaml")["ops"].audit == "own"
    with pytest.raises(ConfigProblems) as info:
        parse_roles(role_doc(audit="everything"), "roles.yaml")
    assert "'audit' must be one of none, own, all" in info.value.message


LAB_ALL = Role("lab", tools="read", targets=("lab-*",), audit="all")


@pytest.mark.parametrize(("role", "viewer", "row", "shown"), [
    (READER, "rita", {"caller": "rita", "target": "prod"}, True),
    (READER, "rita", {"caller": "agent", "target": "prod"}, False),
    (READER, "rita", {"phase": "roles_reload", "caller": "gateway"}, False),
    (ADMIN, "alice", {"caller": "agent", "target": "prod"}, True),
    (ADMIN, "alice", {"phase": "roles_reload"}, True),
    (LAB_ALL, "lara", {"target": "lab-vc", "caller": "agent"}, True),
    (LAB_ALL, "lara", {"target": "prod-vc"}, False),
    (LAB_ALL, "lara", {"target": "lab-vc,prod-vc"}, False),
    (LAB_ALL, "lara", {"phase": "web_sign_in", "caller": "lara"}, False),
    (LAB_ALL, "lara", {"target": ""}, False),
    (OPERATOR, "olga", {"caller": "olga", "target": "lab-1"}, False),  # audit: none (the default)
])
def test_who_may_read_an_audit_row(role: Role, viewer: str, row: dict[str, Any], shown: bool) -> None:
    assert may_read_audit_row(role, viewer, row) is shown


def test_roles_list_shows_what_admin_really_allows() -> None:
    catalog = {"list_vms": R, "power_off_vm": W, "delete_vm": D}
    admin = ADMIN.describe(catalog)
    assert (admin["allow_write"], admin["allow_destructive"], admin["audit"]) == ("*", "*", "all")
    reader = READER.describe(catalog)
    assert (reader["allow_write"], reader["allow_destructive"]) == ([], [])
    listed = LISTED.describe(catalog)
    assert listed["allow_write"] == ["power_off_vm"]
