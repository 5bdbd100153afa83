"""The principals of the gateway's own host (``gateway.auth.local``): the OS user at the shell is the person
``os:<user>`` with the admin role, keyed in the system namespace."""

from __future__ import annotations

import getpass
import os
import pwd

import pytest

from gateway.auth.local import os_person, os_user
from gateway.auth.principal import CallerKey
from gateway.vocabulary import Kind


def _expected_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"


def test_os_user_is_the_user_running_this_process() -> None:
    assert os_user() == _expected_user()


def test_os_user_follows_the_login_name_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGNAME", "operator-7")
    assert os_user() == "operator-7"


def test_os_user_without_any_name_is_the_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    try:
        expected = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        expected = f"uid{os.getuid()}"
    assert os_user() == expected


def test_os_person_is_a_person_with_the_admin_role() -> None:
    person = os_person()
    assert person.name == f"os:{os_user()}"
    assert (person.role, person.kind, person.surface) == ("admin", Kind.PERSON, "cli")
    assert person.token_id is None


def test_os_person_is_keyed_in_the_system_namespace() -> None:
    person = os_person()
    assert person.key == CallerKey.system(f"os:{os_user()}")
    assert person.person_key == person.key


@pytest.mark.parametrize("surface", ["cli", "web", "stdio"])
def test_os_person_carries_the_surface_given(surface: str) -> None:
    assert os_person(surface).surface == surface
