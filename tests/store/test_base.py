"""The records the state store keeps and the rows both engines share (``gateway.store.base``): token and
session records, row conversion, name folding, transition checks and schema migrations, as plain values."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import ConfigError, InvalidArgument
from gateway.proposals import Approval, IllegalTransition, Proposal
from gateway.store.base import (
    APPROVAL_COLUMNS,
    JSON_COLUMNS,
    PROPOSAL_COLUMNS,
    TOKEN_COLUMNS,
    TRANSITION_FIELDS,
    TokenRecord,
    WebSessionRecord,
    approval_from_row,
    approval_values,
    approvals_migration,
    check_states,
    check_transition,
    from_json,
    name_refused,
    pending_migrations,
    proposal_from_row,
    proposal_values,
    taken_name,
    to_json,
    token_from_row,
    token_values,
    web_session_from_row,
    with_approvals,
)
from gateway.vocabulary import Kind


def _token(**fields: Any) -> TokenRecord:
    base: dict[str, Any] = dict(token_id="abc123def456", name="ci", role="reader", hash="$argon2id$x",
                                created_at=100.0)
    base.update(fields)
    return TokenRecord(**base)


def _proposal(**fields: Any) -> Proposal:
    base: dict[str, Any] = dict(
        id="p1", token_hash="th", caller="agent", role="admin", surface="https", target="vc1",
        target_host="vc1.example", tool="delete_vm", args={"vm": "web1"}, args_digest="d",
        plan_summary="delete web1", affected=[{"type": "VirtualMachine", "name": "web1"}],
        plan_params={"moid": "vm-1"}, created_at=1.0, expires_at=2.0)
    base.update(fields)
    return Proposal(**base)


@pytest.mark.parametrize(("expires_at", "now", "expired"), [
    (None, 1e12, False), (200.0, 199.9, False), (200.0, 200.0, True), (200.0, 500.0, True)])
def test_token_expiry(expires_at: float | None, now: float, expired: bool) -> None:
    rec = _token(expires_at=expires_at)
    assert rec.expired(now) is expired
    assert rec.usable(now) is not expired


def test_a_revoked_token_is_never_usable() -> None:
    assert not _token(revoked=True).usable(0.0)


def test_a_token_is_an_agents_unless_said_otherwise() -> None:
    assert _token().kind is Kind.AGENT


def test_secrets_stay_out_of_the_records_repr() -> None:
    assert "argon2" not in repr(_token())
    session = WebSessionRecord("k3y", "t1", "alice", "csrf-value", 1.0, 2.0, 1.5)
    assert "k3y" not in repr(session) and "csrf-value" not in repr(session)


def test_a_token_row_round_trips() -> None:
    rec = _token(expires_at=300.0, last_used=150.0, revoked=True, kind=Kind.PERSON)
    values = token_values(rec)
    assert values[TOKEN_COLUMNS.index("kind")] == "person"
    row = dict(zip(TOKEN_COLUMNS, values, strict=True))
    row["revoked"] = 1
    assert token_from_row(row) == rec


def test_a_proposal_row_keeps_json_columns_as_canonical_text() -> None:
    values = dict(zip(PROPOSAL_COLUMNS, proposal_values(_proposal()), strict=True))
    assert values["args"] == '{"vm":"web1"}'
    assert values["plan_params"] == '{"moid":"vm-1"}'
    assert values["result"] is None
    assert all(isinstance(values[c], str | None) for c in JSON_COLUMNS)


def test_a_proposal_row_round_trips_with_its_approvals() -> None:
    proposal = _proposal(require_web_approval=True, approval_rule={"required": 2})
    row = dict(zip(PROPOSAL_COLUMNS, proposal_values(proposal), strict=True))
    row["require_web_approval"] = 1
    approval = Approval("p1", "alice", "person", "admin", 1.5, "ok", "dg", "token::t1")
    back = proposal_from_row(row, [approval])
    assert back == Proposal(**{**proposal.__dict__, "approvals": (approval,)})
    assert back.require_web_approval is True


def test_an_approval_row_round_trips() -> None:
    approval = Approval("p1", "alice", "person", "admin", 1.5, "ok", "dg", None)
    assert approval_from_row(dict(zip(APPROVAL_COLUMNS, approval_values(approval), strict=True))) == approval


def test_a_web_session_row_round_trips() -> None:
    session = WebSessionRecord("k", "t1", "alice", "c", 1.0, 2.0, 1.5, "token::t1")
    assert web_session_from_row({c: getattr(session, c) for c in session.__dataclass_fields__}) == session


def test_with_approvals_gives_each_proposal_its_own_in_order() -> None:
    first, second = _proposal(id="p1", token_hash="a"), _proposal(id="p2", token_hash="b")
    a1 = Approval("p1", "alice", "person", "admin", 1.0, "", "d")
    a2 = Approval("p2", "bob", "person", "admin", 2.0, "", "d")
    a3 = Approval("p1", "carol", "person", "admin", 3.0, "", "d")
    merged = with_approvals([first, second], [a1, a2, a3])
    assert [p.approvals for p in merged] == [(a1, a3), (a2,)]
    assert with_approvals([first], []) == [first]


@pytest.mark.parametrize(("value", "text"), [
    (None, None), ({"b": 1, "a": "é"}, '{"a":"é","b":1}'), ([1, 2], "[1,2]"), ("x", '"x"')])
def test_to_json_is_sorted_compact_utf8(value: Any, text: str | None) -> None:
    assert to_json(value) == text
    assert from_json(text) == value


def test_to_json_refuses_non_finite_floats() -> None:
    with pytest.raises(ValueError):
        to_json({"x": float("inf")})


@pytest.mark.parametrize(("names", "name", "taken"), [
    (["IdPerson"], "idperson", "IdPerson"),
    (["ci", "deploy"], "CI", "ci"),
    (["straße"], "STRASSE", "straße"),
    (["ci"], "ci2", None),
    ([], "anything", None),
])
def test_taken_name_compares_case_folded(names: list[str], name: str, taken: str | None) -> None:
    assert taken_name(names, name) == taken


def test_name_refused_names_both_spellings() -> None:
    exc = name_refused("CI", "ci")
    assert isinstance(exc, InvalidArgument)
    assert exc.details == {"field": "name"}
    assert "a token named 'ci' already exists" in exc.message
    assert "so 'CI' is taken too" in exc.message


def test_check_transition_returns_the_states_to_move_from() -> None:
    assert tuple(check_transition(["pending", "approved"], "expired", {"decided_at": 1.0})) == (
        "pending", "approved")


def test_check_transition_refuses_an_edge_the_table_lacks() -> None:
    with pytest.raises(IllegalTransition):
        check_transition(["executed"], "pending", {})


def test_check_transition_refuses_fields_it_may_not_set() -> None:
    with pytest.raises(TypeError, match="transition\\(\\) cannot set args, state"):
        check_transition(["pending"], "denied", {"state": "x", "args": {}})


def test_transition_fields() -> None:
    assert frozenset({"approved_by", "decided_at", "outcome", "result", "error", "expires_at",
                      "executor"}) == TRANSITION_FIELDS


def test_check_states_accepts_known_states() -> None:
    check_states(["pending", "executed"])
    check_states([])


def test_check_states_refuses_unknown_ones_sorted() -> None:
    with pytest.raises(ValueError, match=r"unknown proposal states: \['done', 'gone'\]"):
        check_states(["gone", "pending", "done"])


MIGRATIONS = ((1, ("a",)), (2, ("b",)), (3, ("c",)))


@pytest.mark.parametrize(("current", "versions"), [(0, [1, 2, 3]), (1, [2, 3]), (3, [])])
def test_pending_migrations_are_those_after_the_current_version(current: int, versions: list[int]) -> None:
    assert [v for v, _ in pending_migrations(current, MIGRATIONS, "db")] == versions


def test_a_schema_newer_than_known_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"db holds schema 4, written by a newer gateway \(this one knows "
                                          r"up to 3\)"):
        pending_migrations(4, MIGRATIONS, "db")


@pytest.mark.parametrize("migrations", [((2, ()), (1, ())), ((1, ()), (1, ())), ((0, ()),)])
def test_migrations_must_increase_from_one(migrations: Any) -> None:
    with pytest.raises(ValueError, match="increasing versions from 1"):
        pending_migrations(0, migrations, "db")


def test_no_migrations_know_schema_zero_only() -> None:
    assert pending_migrations(0, (), "db") == []
    with pytest.raises(ConfigError):
        pending_migrations(1, (), "db")


def test_approvals_migration_uses_the_engines_float_type() -> None:
    statements = approvals_migration("DOUBLE PRECISION")
    assert statements[:3] == ("ALTER TABLE proposals ADD COLUMN approval_rule TEXT",
                              "ALTER TABLE proposals ADD COLUMN blast_radius TEXT",
                              "ALTER TABLE proposals ADD COLUMN shown_digest TEXT")
    assert "at          DOUBLE PRECISION NOT NULL" in statements[3]
