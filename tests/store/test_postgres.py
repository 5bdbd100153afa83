"""``PostgresStore``'s parts that need no database (``gateway.store.postgres``): how a URL is recognised and
shown without its password, the migration history, and URLs refused before any connection. The store
against a real PostgreSQL: ``tests/store/test_engines.py``."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigError
from gateway.store import sqlite
from gateway.store.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresStore, display_url, is_postgres_url


@pytest.mark.parametrize(("url", "recognised"), [
    ("postgresql://gw@db/gateway", True),
    ("postgres://gw@db/gateway", True),
    ("  PostgreSQL://gw@db/gateway", True),
    ("mysql://gw@db/gateway", False),
    ("sqlite:///state.db", False),
    ("host=db dbname=gateway", False),
    ("", False),
])
def test_is_postgres_url(url: str, recognised: bool) -> None:
    assert is_postgres_url(url) is recognised


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://gw:s3cret@db.example:5433/gateway", "postgresql://gw@db.example:5433/gateway"),
    ("postgresql://gw@db/gateway?password=s3cret", "postgresql://gw@db/gateway"),
    ("postgresql://db/gateway", "postgresql://db/gateway"),
    ("postgresql:///gateway", "postgresql://localhost/gateway"),
    ("postgresql://gw:pw@db", "postgresql://gw@db/"),
    ("postgresql://gw@%2Fvar%2Frun%2Fpostgresql/gateway", "postgresql://gw@/var/run/postgresql/gateway"),
])
def test_display_url_never_shows_the_password(url: str, shown: str) -> None:
    assert display_url(url) == shown
    assert "s3cret" not in display_url(url)


def test_display_url_of_an_unparseable_url_says_so() -> None:
    assert display_url("postgresql://gw:pw@db:notaport:x/g?sslmode") == "postgresql://(unparseable URL)"


def test_migrations_count_up_from_one() -> None:
    assert [version for version, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert MIGRATIONS[-1][0] == SCHEMA_VERSION
    assert all(statements for _, statements in MIGRATIONS)


def test_both_engines_know_the_same_schema_version() -> None:
    assert SCHEMA_VERSION == sqlite.SCHEMA_VERSION


def test_the_shared_migrations_are_the_same_on_both_engines() -> None:
    from gateway.store.idempotency_keys import KEYS_MIGRATION
    from gateway.store.task_records import TASKS_MIGRATION

    pg = {statement for _, statements in MIGRATIONS for statement in statements}
    lite = {statement for _, statements in sqlite.MIGRATIONS for statement in statements}
    for statement in (*KEYS_MIGRATION, *TASKS_MIGRATION):
        assert statement in pg and statement in lite


@pytest.mark.parametrize("url", ["mysql://gw@db/gateway", "sqlite:///x.db", "db.example"])
def test_a_url_of_another_database_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="must start with postgresql://"):
        PostgresStore(url)


def test_an_unparseable_postgres_url_is_a_config_error_without_its_password() -> None:
    with pytest.raises(ConfigError, match="is not a valid PostgreSQL URL") as caught:
        PostgresStore("postgresql://gw:hunter2@db:notaport:x/g?sslmode")
    assert "hunter2" not in str(caught.value)
