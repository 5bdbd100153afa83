"""gateway.guard.policy.store: the rules file in force, re-read on each look, failing closed when broken."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.config import ConfigProblems
from gateway.guard.policy.model import Action, Policy
from gateway.guard.policy.store import PolicyStore, PolicyUnavailable, RulesLoad, unusable_message
from gateway.vocabulary import Category

EMPTY = "defaults: {}\nprotected: []\nrules: []\ntargets: {}\nmaintenance_windows: []\n"
ONE_RULE = EMPTY.replace("rules: []", "rules:\n- {name: no-prod, action: deny}")
BROKEN = EMPTY.replace("rules: []", "rules: [")
MTIME = 1_700_000_000


def write(path: Path, text: str, mtime: int = MTIME) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))


class Reloads:
    """What ``on_reload`` and ``on_load`` were called with."""

    def __init__(self) -> None:
        self.loads: list[RulesLoad] = []
        self.policies: list[Policy] = []

    def store(self, path: Path) -> PolicyStore:
        return PolicyStore(path, on_load=self.policies.append, on_reload=self.loads.append)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "rules.yaml"


def test_a_missing_file_means_the_builtin_strict_defaults(path: Path) -> None:
    reloads = Reloads()
    store = reloads.store(path)
    policy = store.current()
    assert policy.builtin
    assert policy.note == f"no rules file at {path}: the built-in strict defaults apply"
    assert store.broken is None
    assert store.state() == {"status": "ok", "file": str(path)}
    (load,) = reloads.loads
    assert load.sha256 is None and load.first and load.policy is policy and load.problems == ()


def test_a_good_file_is_in_force(path: Path) -> None:
    write(path, ONE_RULE)
    reloads = Reloads()
    store = reloads.store(path)
    assert [r.name for r in store.current().rules] == ["no-prod"]
    assert store.snapshot()[1] is None
    assert reloads.policies == [store.current()]
    (load,) = reloads.loads
    assert load.first and not load.recovered and load.previous is None
    assert load.sha256 is not None and len(load.sha256) == 64


def test_the_same_bytes_are_parsed_once(path: Path) -> None:
    write(path, ONE_RULE)
    reloads = Reloads()
    store = reloads.store(path)
    first = store.current()
    assert store.current() is first
    store.snapshot()
    store.state()
    assert len(reloads.loads) == 1


def test_new_bytes_are_noticed_even_with_the_same_size_and_time(path: Path) -> None:
    write(path, ONE_RULE)
    store = PolicyStore(path)
    store.current()
    write(path, ONE_RULE.replace("no-prod", "no-test"))
    assert [r.name for r in store.current().rules] == ["no-test"]


def test_a_broken_edit_fails_closed_and_names_the_problem(path: Path) -> None:
    write(path, ONE_RULE)
    reloads = Reloads()
    store = reloads.store(path)
    good = store.current()
    write(path, BROKEN, mtime=MTIME + 60)
    with pytest.raises(PolicyUnavailable) as raised:
        store.current()
    assert raised.value.code == "config_error"
    assert all(p.startswith(f"{path}:") for p in raised.value.problems)
    policy, why = store.snapshot()
    assert policy is None
    assert why is not None and why.startswith(f"policy file {path} is unusable: {path}:")
    assert store.broken is not None and store.broken[0] == MTIME + 60
    load = reloads.loads[-1]
    assert load.policy is None and load.problems and load.previous is good and not load.first


def test_broken_since_stays_at_the_first_broken_content(path: Path) -> None:
    write(path, BROKEN, mtime=MTIME)
    store = PolicyStore(path)
    store.snapshot()
    write(path, BROKEN + "# still\n", mtime=MTIME + 3600)
    store.snapshot()
    assert store.broken is not None and store.broken[0] == MTIME


def test_state_says_broken_since_when(path: Path) -> None:
    write(path, BROKEN)
    state = PolicyStore(path).state()
    assert state["status"] == "broken" and state["file"] == str(path)
    assert state["since"] == datetime.fromtimestamp(MTIME, UTC).isoformat(timespec="seconds")
    assert state["error"].startswith(f"policy file {path} is unusable: ")


def test_a_fixed_file_recovers(path: Path) -> None:
    write(path, BROKEN)
    reloads = Reloads()
    store = reloads.store(path)
    assert store.snapshot()[0] is None
    write(path, ONE_RULE)
    assert store.snapshot()[1] is None
    assert store.broken is None
    last = reloads.loads[-1]
    assert last.recovered and last.previous is None and last.policy is not None


def test_no_earlier_rules_stay_in_force_while_broken(path: Path) -> None:
    write(path, EMPTY.replace("defaults: {}", "defaults: {destructive: allow}"))
    store = PolicyStore(path)
    assert store.target_limits("t").categories[Category.DESTRUCTIVE] is Action.ALLOW
    write(path, BROKEN)
    assert store.target_limits("t").categories[Category.DESTRUCTIVE] is Action.DENY


def test_a_file_missing_a_section_is_refused(path: Path) -> None:
    write(path, "rules: []\n")
    with pytest.raises(PolicyUnavailable) as raised:
        PolicyStore(path).current()
    assert len(raised.value.problems) == 4


def test_an_unreadable_rules_file_is_a_problem_not_a_crash(path: Path) -> None:
    path.mkdir()
    store = PolicyStore(path)
    policy, why = store.snapshot()
    assert policy is None
    assert why is not None and "cannot read the rules file" in why
    assert "point GATEWAY_RULES_FILE / --rules at a readable file" in why


def test_on_load_sees_only_valid_policies(path: Path) -> None:
    reloads = Reloads()
    store = reloads.store(path)
    write(path, BROKEN)
    store.snapshot()
    write(path, ONE_RULE)
    store.snapshot()
    assert [len(p.rules) for p in reloads.policies] == [1]
    assert [load.policy is None for load in reloads.loads] == [True, False]


def test_target_limits_under_the_rules_in_force(path: Path) -> None:
    write(path, EMPTY.replace("targets: {}", "targets:\n  prod-*: {max_bulk_objects: 4}"))
    store = PolicyStore(path)
    assert store.target_limits("prod-1").max_bulk_objects == 4
    assert store.target_limits("dev").max_bulk_objects == 20


def test_unusable_message_lists_each_problem(path: Path) -> None:
    message = unusable_message(path, ConfigProblems(["a: one", "b: two"]))
    assert message == f"policy file {path} is unusable: a: one; b: two"
