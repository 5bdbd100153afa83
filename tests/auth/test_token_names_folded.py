"""Token names compared case-folded: ``IdPerson`` beside ``idperson`` would be two callers that read as
one, so the second is refused at creation with a clear InvalidArgument, on the CLI and on both engines
(SQLite, and a real PostgreSQL)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.httpserver import FAST_HASH

from gateway import cli
from gateway.auth.tokens import create_token
from gateway.cli import main
from gateway.errors import InvalidArgument
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import SqliteStore
from gateway.vocabulary import Kind


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GATEWAY_HOME", "GATEWAY_ROLES_FILE", "GATEWAY_AUDIT_LOG", "GATEWAY_TARGETS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("token", "roles"))
    return tmp_path / "home"


def test_gateway_token_create_refuses_a_name_that_differs_only_in_case(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    person = ["--role", "admin", "--kind", "person", "--home", str(home)]
    assert main(["token", "create", "idperson", *person]) == 0
    capsys.readouterr()
    assert main(["token", "create", "IdPerson", *person]) == 1
    err = capsys.readouterr().err
    assert "'idperson' already exists" in err and "ignoring case" in err, err
    with SqliteStore(home / "state.db") as store:
        assert [t.name for t in store.list_tokens()] == ["idperson"]


def _both(store: SqliteStore | PostgresStore) -> None:
    create_token(store, "idperson", "admin", expires_in=None, now=time.time(), hasher=FAST_HASH,
                 kind=Kind.PERSON)
    for again in ("IdPerson", "IDPERSON"):
        with pytest.raises(InvalidArgument) as refused:
            create_token(store, again, "admin", expires_in=None, now=time.time(), hasher=FAST_HASH)
        assert "'idperson' already exists" in refused.value.message
    assert [t.name for t in store.list_tokens()] == ["idperson"]


def test_sqlite_refuses_a_case_folded_repeat(tmp_path: Path) -> None:
    with SqliteStore(tmp_path / "state.db") as store:
        _both(store)


def test_postgres_refuses_a_case_folded_repeat(pg_url: str) -> None:
    with PostgresStore(pg_url) as store:
        _both(store)
