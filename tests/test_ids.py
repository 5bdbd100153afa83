"""Short random ids: twelve lowercase letters or digits, safe on a command line and inside a token."""

from __future__ import annotations

import re

from gateway.ids import ID_LENGTH, new_id


def test_an_id_is_twelve_lowercase_letters_or_digits() -> None:
    for _ in range(200):
        assert re.fullmatch(r"[a-z0-9]{12}", new_id())


def test_id_length_is_twelve() -> None:
    assert ID_LENGTH == 12
    assert len(new_id()) == ID_LENGTH


def test_an_id_never_holds_a_separator_or_starts_with_a_dash() -> None:
    for _ in range(200):
        made = new_id()
        assert "_" not in made
        assert not made.startswith("-")


def test_ids_do_not_repeat() -> None:
    assert len({new_id() for _ in range(1000)}) == 1000
