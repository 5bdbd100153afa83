"""Credentials as people write them (``gateway.audit.phrasing``): the word-level detector ``redact`` runs
last. Tables of phrases whose value is masked, and of look-alikes that stay as written."""

from __future__ import annotations

import pytest

from gateway.audit.phrasing import (
    NEEDLES,
    STRONG_WORDS,
    WEAK_WORDS,
    find,
    mask_phrased,
    normalised,
    secret_shaped,
)

MASKED = [
    ("my vcenter creds are admin/Sup3rS3cret", "my vcenter creds are admin/***"),
    ("api key Leak04dd", "api key ***"),
    ("login admin with Leak08hh", "login admin with ***"),
    ("p4ssword: Leak11kk", "p4ssword: ***"),
    ("Passwort ist Geheim42", "Passwort ist ***"),
    ("the password is hunter2", "the password is ***"),
    ("password: correcthorsebattery", "password: ***"),
    ("pasword: Leak12ab", "pasword: ***"),
    ("passwrod = Leak13cd", "passwrod = ***"),
    ("token: abc123def", "token: ***"),
    ("secret key: Zz9yy8xx", "secret key: ***"),
    ("mot de passe: Geheim99", "mot de passe: ***"),
    ("senha: segredo123", "senha: ***"),
    ("hasło: tajne123", "hasło: ***"),
    ("пароль: qwerty123", "пароль: ***"),
    ("pin 4711", "pin ***"),
    ("the rootpassword is S3cr3tRoot", "the rootpassword is ***"),
    ("X-API-Key: k3yvalue99", "X-API-Key: ***"),
    ("password is 'Leak21xy'", "password is '***'"),
    ("creds for root are Leak55zz.", "creds for root are ***."),
    ("password for the service account svc-backup: Leak77qq",
     "password for the service account svc-backup: ***"),
]

KEPT = [
    "password is required",
    "the password expired",
    "password field",
    "token id abc123def",
    "password file /etc/secret.pem",
    "login to vc1.example.com",
    "login page",
    "pin the VM to host esx-12",
    "secret sauce",
    "api key rotation",
    "the token was revoked",
    "creds are expired",
    "login admin",
    "nothing to see here",
    "sign in with your account",
    "password: ***",
    "logon vm-42",
    "pin 12",
]


@pytest.mark.parametrize(("text", "masked"), MASKED)
def test_phrased_secrets_are_masked(text: str, masked: str) -> None:
    assert mask_phrased(text, "***") == masked


@pytest.mark.parametrize("text", KEPT)
def test_look_alikes_stay_as_written(text: str) -> None:
    assert mask_phrased(text, "***") == text


def test_find_gives_the_span_of_each_value_in_order() -> None:
    text = "password: Leak11kk and token: abc123def"
    spans = list(find(text))
    assert [text[start:end] for start, end in spans] == ["Leak11kk", "abc123def"]


def test_find_leaves_quotes_and_a_sentence_end_out_of_the_span() -> None:
    text = "the password is 'Leak11kk'."
    ((start, end),) = find(text)
    assert text[start:end] == "Leak11kk"


def test_mask_phrased_without_a_find_returns_the_text_itself() -> None:
    text = "just words"
    assert mask_phrased(text, "***") is text


@pytest.mark.parametrize(("word", "form"), [("P4ssw0rd", "password"), ("Pass-Word", "password"),
                                            ("(token),", "token"), ("S3CR3T", "secret"),
                                            ("api_key", "apikey")])
def test_normalised_reads_digits_as_letters_and_drops_separators(word: str, form: str) -> None:
    assert normalised(word) == form


@pytest.mark.parametrize(("value", "shaped"), [
    ("Leak04dd", True),
    ("hunter2", True),
    ("abc!defg", True),
    ("abc12", False),                  # too short
    ("abcdefgh", False),               # letters only
    ("12345678", False),               # digits only
    ("vc1.example.com", False),        # a host name
    ("10.0.0.1", False),               # an address
    ("https://x.example/a1", False),   # a URL
    ("vm-42", False),                  # a managed object id
    ("admin@example.com", False),      # an email address
    ("/vmfs/volumes/ds1/a.vmx", False),  # a path
    ("backup2024.iso", False),         # a file name
    ("123e4567-e89b-12d3-a456-426614174000", False),  # a UUID
    ("a1" * 200, False),               # too long
])
def test_secret_shaped(value: str, shaped: bool) -> None:
    assert secret_shaped(value) is shaped


def test_every_lexicon_word_holds_a_needle() -> None:
    for phrase in STRONG_WORDS | WEAK_WORDS:
        assert any(needle in phrase for needle in NEEDLES), phrase
