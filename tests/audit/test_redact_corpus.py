"""Secrets as people write them never reach the audit file, and ordinary text passes unchanged.

A corpus of phrased credentials (after creds, login, api key, token, secret, passphrase, pwd, in the
common forms of several languages) is written as rows through the real file sink; none of the secrets
is anywhere in the file's bytes. A corpus of innocent texts (VM names, datastore paths, moids, the audit
chain's own hashes, ISO paths, UUIDs, sentences about credentials) is written the same way and read back
unchanged. The other exits of the same step (what people and models are shown, log lines) mask the same
secrets and keep the same texts.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.audit.file_sink import AuditSink
from gateway.audit.readers import FileAuditReader
from gateway.audit.redact import displayable, displayable_text, redact, redact_text
from gateway.logs import configure_logging, flush_logs

#: phrasings: ``{s}`` is the secret, ``{pin}`` a PIN's digits
PHRASED = [
    # the issue's own cases
    "my vcenter creds are admin/{s}", "creds: {s}", "api key {s}", "login admin with {s}", "p4ssword: {s}",
    "pw {s}",
    # English
    "password {s}", "the password is {s}", "password for root is {s}", "passwd: {s}", "pwd={s}", "pwd {s}",
    "my pwd is {s}", "pwd: {s}", "my token is {s}", "token: {s}", "use token {s} for the API", "api key: {s}",
    "API-Key = {s}", "apikey {s}", "api token {s}", "access key {s}", "secret key: {s}", "client secret {s}",
    "the secret is {s}", "secret: {s}", "secret={s}", "passphrase {s}", "the passphrase is '{s}'",
    "passcode: {s}", "credentials: admin / {s}", "credentials are root/{s}", "cred {s}", "credentials {s}",
    "login: root / {s}", "log in as admin with {s}", "logon administrator using {s}", "sign in with {s}",
    "login with {s}", "license key {s}", "private key {s}", "refresh token: {s}", "access token {s}",
    "auth token={s}", 'Password: "{s}"', "password = '{s}'", "pass: {s}", "root password {s}",
    "vcenter admin password: {s}", "the vcenter password for administrator@vsphere.local is {s}",
    "creds for vc1: admin/{s}", "login admin/{s}", "user admin, password {s}", "username=admin password={s}",
    "ssh root@esx-01 with password {s}", "PASSWORD IS {s}", "Passw0rd: {s}", "pa55word {s}",
    "passwrod: {s}", "Secret for the webhook: {s}", "token for agent-7 is {s}", "here are the creds: {s}",
    "new password: {s}", "temporary password {s}", "default creds admin/{s}", "API key for vc2 = {s}",
    "X-API-Key: {s}", "apiKey: {s}", "secret token {s}", "s3cret: {s}", "t0ken {s}",
    "the password for the service account svc-backup is {s}.", "creds (admin/{s}) for the lab",
    # German, French, Spanish, Portuguese, Dutch, Polish, Czech, Nordic, Finnish, Turkish, Italian
    "Passwort: {s}", "das Passwort ist {s}", "Kennwort für admin ist {s}", "Zugangsdaten: admin/{s}",
    "mein Passwort lautet {s}", "Kennwort {s}", "passwort={s}", "mot de passe: {s}",
    "le mot de passe est {s}", "mdp {s}", "identifiants: admin / {s}", "mot de passe pour root : {s}",
    "contraseña: {s}", "la contraseña es {s}", "mi contraseña {s}", "credenciales: root/{s}",
    "contrasena {s}",
    "senha: {s}", "a senha é {s}", "minha senha {s}", "senha do admin: {s}", "wachtwoord: {s}",
    "het wachtwoord is {s}", "wachtwoord voor root is {s}", "hasło: {s}", "moje hasło to {s}",
    "hasło dla admina: {s}", "heslo: {s}", "lösenord: {s}", "passord {s}", "salasana on {s}", "şifre: {s}",
    "parola d'ordine: {s}",
    # Russian, Greek, Japanese, Chinese, Korean
    "пароль: {s}", "мой пароль {s}", "κωδικός: {s}", "パスワード: {s}", "密码: {s}", "비밀번호: {s}",
    # PINs and one-time codes
    "otp {pin}", "pin: {pin}", "PIN code {pin}", "pincode={pin}", "the otp is {pin}",
]
#: after a credential word and a separator even a plain word is the secret
PLAIN_AFTER_SEPARATOR = ["creds: {w}", "password is {w}", "Passwort: {w}", "senha: {w}", "token = {w}",
                         "secret: {w}", "hasło: {w}", "mot de passe : {w}"]
_SHAPES = ["Leak{n:03d}aa", "Sup3r-S3cret{n}", "x9#{n}Qz!t", "P@ss{n}word", "hunter{n}x", "c0rrect{n}horse",
           "Tr0ub4dor&{n}", "zQ{n}vX7pLm"]
_WORDS = ["bluemoonriver", "quietharbour", "silverfalcon", "orangemeadow", "copperlantern",
          "velvetcanyon", "ambertundra", "crimsonglacier"]


def phrased_cases() -> list[tuple[str, str]]:
    """(text, the secret in it): each secret unique, so finding it in the file names its phrasing."""
    cases = []
    for n, template in enumerate(PHRASED):
        secret = str(4821000 + n) if "{pin}" in template else _SHAPES[n % len(_SHAPES)].format(n=n)
        cases.append((template.format(s=secret, pin=secret), secret))
    for n, template in enumerate(PLAIN_AFTER_SEPARATOR):
        cases.append((template.format(w=_WORDS[n]), _WORDS[n]))
    return cases


def _chain_hashes(tmp: Path) -> list[str]:
    """Hashes the audit chain really holds (row hashes and prev), to be quoted in texts."""
    path = tmp / "hashes.jsonl"
    with AuditSink(path, durable=False) as sink:
        rows = [sink.write({"phase": "call", "n": n}) for n in range(4)]
    return [row["hash"] for row in rows] + [rows[0]["prev"]]


def innocent_texts(hashes: list[str]) -> list[str]:
    uuids = [str(uuid.UUID(int=n * 0x1234567890ABCDEF1234567 + 17)) for n in range(1, 6)]
    return [
        # VM, host, cluster and datastore names
        "DC0_C0_RP0_VM0", "DC0_H0_VM1", "web-01", "db-prod-02", "token-service-01", "secret-garden-vm",
        "pass-through-gw", "login-portal-03", "apikey-proxy", "pinned-build-agent", "credit-scoring-7",
        "esx-01.lab.example.com", "vc1.example.com", "LocalDS_0", "LocalDS_1", "DC0_C0", "cluster-prod-a",
        # datastore and ISO paths
        "[LocalDS_0] web-01/web-01.vmx", "[LocalDS_1] db-prod-02/db-prod-02_1.vmdk",
        "[ISO] images/ubuntu-22.04.3-live-server-amd64.iso", "[datastore1] iso/VMware-VCSA-all-8.0.2.iso",
        "/vmfs/volumes/LocalDS_0/web-01/web-01.vmx", "ds:///vmfs/volumes/5f1c2a7e-3b9d4c1e/",
        # moids
        "vm-42", "host-12", "datastore-11", "group-v3", "resgroup-8", "network-7", "domain-c7",
        "moid vm-1042 on host-33",
        # the audit chain's own hashes, checkpoints and UUIDs
        *hashes, *(f"prev {h}" for h in hashes[:2]), f"checkpoint at tree size 42 root {hashes[0][:44]}",
        *uuids, f"instance uuid {uuids[0]}", "cid=9f1c2a7e-41d2", "correlation_id 7c0e3f1a2b4d",
        "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        # sentences about credentials that hold none
        "the password policy requires 12 characters", "login failed for admin", "the token was revoked",
        "rotate the API key every 90 days", "pin the VM to host-12", "the token expires in 3600 s",
        "password is required", "Passwort ist erforderlich", "mot de passe incorrect",
        "la contraseña es incorrecta", "senha inválida", "wachtwoord vereist", "hasło wymagane",
        "creds rotated yesterday by alice", "credentials expired", "apikey rotation done",
        "auth method: oidc", "password change requested by alice", "login banner updated",
        "token count: 12", "OTP sent to the approver", "the secret sauce is patience",
        "pass 2 of 3 finished", "sign in at https://gw.example.com/ui", "login to vc1.example.com",
        "token_id=tok-01 revoked", "secret_name: vc-cred", "the bootstrap token file is missing",
        "each token has a role", "the password field is empty", "use your own token, never a shared one",
        "api key id 42 was created", "login as reader to list the VMs", "a passphrase protects the key file",
        # operations and ordinary sentences
        "power on DC0_H0_VM1 with 4 CPUs", "clone web-01 to web-02 on LocalDS_1", "snapshot before-upgrade-3",
        "reconfigure web-01: 8 GB memory, 4 vCPUs", "migrate db-prod-02 to host-12", "delete vm-42",
        "the approval needs 2 of 3 admins", "list_vms on vc1 returned 120 VMs in 0.4 s",
        "guest OS: Ubuntu Linux (64-bit)", "tools running, version 12352", "alice approved p-7f3a9c",
        "Maintenance window Saturday 02:00-04:00 UTC", "ticket CHG0012345: patch the ESXi hosts",
        "backup job nightly-07 finished", "the quick brown fox jumps over the lazy dog",
        "Der Host esx-01 ist im Wartungsmodus", "La VM web-01 est arrêtée", "El datastore está lleno",
        "A VM db-02 está ligada", "De VM staat uit", "Maszyna web-01 jest wyłączona",
        "192.168.10.25:443", "https://vc1.example.com/sdk", "ops@example.com", "v8.0.2-22385739",
        "build 22617221", "timeout after 30 s", "fan-out over all targets", "proposal p-1 expired",
    ]


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, str]]:
    return phrased_cases()


def test_the_corpus_is_large_and_its_secrets_unique(cases: list[tuple[str, str]], tmp_path: Path) -> None:
    assert len(cases) >= 100
    assert len({secret for _, secret in cases}) == len(cases)
    texts = innocent_texts(_chain_hashes(tmp_path))
    assert len(texts) >= 100 and len(set(texts)) == len(texts)


def _write_all(path: Path, texts: list[str]) -> list[dict[str, object]]:
    with AuditSink(path, durable=False) as sink:
        for n, text in enumerate(texts):
            sink.write({"phase": "call", "tool": "reset_vm", "caller": "ann", "n": n,
                        "args": {"reason": text}, "note": text, "words": [text]})
    return FileAuditReader(path).rows()


def test_no_phrased_secret_survives_into_the_audit_file(cases: list[tuple[str, str]], tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _write_all(path, [text for text, _ in cases])
    data = path.read_bytes()
    escaped = {secret: json.dumps(secret)[1:-1].encode() for _, secret in cases}
    leaked = [text for text, secret in cases if secret.encode() in data or escaped[secret] in data]
    assert leaked == [], f"{len(leaked)} of {len(cases)} phrased secrets reached the file: {leaked}"


def test_innocent_texts_pass_through_the_audit_file_unchanged(tmp_path: Path) -> None:
    texts = innocent_texts(_chain_hashes(tmp_path))
    rows = _write_all(tmp_path / "audit.jsonl", texts)
    changed = [(text, row["note"]) for text, row in zip(texts, rows, strict=True)
               if (row["note"], row["args"], row["words"]) != (text, {"reason": text}, [text])]
    assert changed == [], f"{len(changed)} of {len(texts)} innocent texts changed: {changed}"


def test_the_other_exits_mask_the_same_secrets(cases: list[tuple[str, str]]) -> None:
    """Proposal summaries, pending cards, notifications (``shown``), log lines: the same step."""
    for text, secret in cases:
        assert secret not in redact_text(text), text
        assert secret not in displayable_text(text), text
        bounded = displayable({"summary": text, "objects": [text]})
        assert secret not in json.dumps(bounded, ensure_ascii=False), text
        assert secret not in json.dumps(redact({"message": text}), ensure_ascii=False), text


def test_the_other_exits_keep_innocent_texts(tmp_path: Path) -> None:
    for text in innocent_texts(_chain_hashes(tmp_path)):
        assert displayable_text(text) == text
        assert displayable({"summary": text}) == {"summary": text}


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    yield stream
    root.setLevel(before[0])
    for handler in root.handlers:
        if handler not in before[1]:
            handler.close()  # a LogWriter's thread stops with it
    root.handlers[:] = before[1]


@pytest.mark.parametrize("form", ["text", "json"])
def test_log_lines_mask_phrased_secrets(form: str, cases: list[tuple[str, str]],
                                        captured: io.StringIO) -> None:
    configure_logging(form, "INFO", stream=captured)
    log = logging.getLogger("gateway.test_redact_corpus")
    for text, _ in cases:
        log.info("operator note: %s", text)
    assert flush_logs()
    out = captured.getvalue()
    assert len(out.splitlines()) == len(cases)
    leaked = [text for text, secret in cases if secret in out or json.dumps(secret)[1:-1] in out]
    assert leaked == [], leaked


def test_every_lexicon_word_holds_a_needle() -> None:
    """The cheap test before the detector (``NEEDLES``) lets no credential word through unread."""
    from gateway.audit import phrasing

    missing = [w for w in phrasing.STRONG_WORDS | phrasing.WEAK_WORDS
               if not any(needle in w for needle in phrasing.NEEDLES)]
    assert missing == []
