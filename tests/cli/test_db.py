"""Choosing the engine (GATEWAY_DATABASE_URL / --database-url) and ``gateway db upgrade`` on both engines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from support.postgres import PgServer

from gateway.backends import open_store
from gateway.errors import ConfigError
from gateway.settings import Settings
from gateway.store import SqliteStore
from gateway.store.postgres import SCHEMA_VERSION, PostgresStore, display_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("env", "flag", "expected"), [
    (None, None, None),
    ("", None, None),
    ("postgresql://gw@db:5432/gw", None, "postgresql://gw@db:5432/gw"),
    ("postgresql://gw:pw@db/gw", None, "postgresql://gw:pw@db/gw"),  # the environment is not public
    ("postgresql://gw@env/gw", "postgres://gw@flag/gw", "postgres://gw@flag/gw"),  # the flag wins
])
def test_database_url_from_environment_and_flag(env: str | None, flag: str | None,
                                                expected: str | None) -> None:
    environ = {"GATEWAY_HOME": "/tmp/gw"} | ({"GATEWAY_DATABASE_URL": env} if env is not None else {})
    assert Settings.from_env(environ, database_url=flag).database_url == expected


@pytest.mark.parametrize(("env", "flag", "message"), [
    ("mysql://db/gw", None, "postgresql://"),
    (None, "sqlite:///x.db", "postgresql://"),
    (None, "postgresql://gw:hunter2@db/gw", "process list"),
    (None, "postgresql://gw@db/gw?password=hunter2", "process list"),
])
def test_database_url_refused(env: str | None, flag: str | None, message: str) -> None:
    environ = {"GATEWAY_HOME": "/tmp/gw"} | ({"GATEWAY_DATABASE_URL": env} if env is not None else {})
    with pytest.raises(ConfigError, match=message) as info:
        Settings.from_env(environ, database_url=flag)
    assert "hunter2" not in info.value.message


def test_the_url_is_never_in_the_settings_repr() -> None:
    settings = Settings.from_env({"GATEWAY_HOME": "/tmp/gw", "GATEWAY_DATABASE_URL": "postgresql://u:hunter2@h/d"})
    assert "hunter2" not in repr(settings)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://gw:hunter2@db.example:6432/state", "postgresql://gw@db.example:6432/state"),
    ("postgresql://db.example/state?password=hunter2&user=gw", "postgresql://gw@db.example/state"),
    ("postgresql:///state", "postgresql://localhost/state"),
])
def test_display_url_drops_the_password(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_open_store_picks_the_engine(tmp_path: Path, pg_url: str) -> None:
    embedded = open_store(Settings.from_env({"GATEWAY_HOME": str(tmp_path)}))
    shared = open_store(Settings.from_env({"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url}))
    try:
        assert isinstance(embedded, SqliteStore) and isinstance(shared, PostgresStore)
    finally:
        embedded.close()
        shared.close()


def _gateway(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=False)


def test_db_upgrade_on_postgres_migrates_and_never_prints_the_password(pg_server: PgServer, pg_url: str,
                                                                        tmp_path: Path) -> None:
    done = _gateway("db", "upgrade", env={"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url})
    assert done.returncode == 0, done.stderr
    assert f"schema version {SCHEMA_VERSION}" in done.stdout
    assert pg_server.password not in done.stdout + done.stderr
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
        conn.execute("UPDATE schema_version SET version = 999")
    refused = _gateway("db", "upgrade", env={"GATEWAY_HOME": str(tmp_path), "GATEWAY_DATABASE_URL": pg_url})
    assert refused.returncode == 1
    assert "newer gateway" in refused.stderr and pg_server.password not in refused.stderr


def test_db_upgrade_on_sqlite(tmp_path: Path) -> None:
    done = _gateway("db", "upgrade", env={"GATEWAY_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert f"sqlite:{tmp_path / 'state.db'}" in done.stdout
    with SqliteStore(tmp_path / "state.db") as store:
        assert store.schema_version() >= 2
