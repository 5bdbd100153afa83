"""Credentials as people write them: a word-level detector for secrets in phrases.

Patterns miss "my vcenter creds are admin/Sup3rS3cret"; this reads words: a lexicon of credential
words in several languages, then the value by its shape. After a strong word with a separator,
anything but a word about the credential is a secret; otherwise only a secret-shaped value, never a
host, address, path, moid or UUID. It runs only on text holding a stem (``NEEDLES``) and is linear.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator

#: credential words whose value follows a separator whatever its shape (normalised: lower case, digits
#: read as letters, ``-``/``_``/``.`` removed); several words are one entry with spaces
STRONG_WORDS = frozenset({
    # English
    "password", "passwd", "passw", "pword", "pwd", "pw", "passphrase", "passcode", "passkey",
    "creds", "cred", "credential", "credentials", "secret", "secrets", "token", "apikey", "api key",
    "api token", "access key", "secret key", "private key", "license key", "auth token", "access token",
    "refresh token", "client secret", "otp", "pincode", "pin code",
    # German, Dutch, Scandinavian, Finnish
    "passwort", "kennwort", "zugangsdaten", "geheimnis", "wachtwoord", "inloggegevens", "losenord",
    "lösenord", "passord", "adgangskode", "salasana",
    # French, Spanish, Portuguese, Italian
    "mot de passe", "mdp", "identifiants", "contraseña", "contrasena", "credenciales", "senha",
    "credenciais", "parola d'ordine",
    # Polish, Czech, Turkish, Russian, Greek, Japanese, Chinese, Korean
    "hasło", "haslo", "heslo", "şifre", "sifre", "пароль", "κωδικός", "パスワード", "密码", "密碼",
    "비밀번호",
})
#: credential words whose value is masked only when shaped like a secret
WEAK_WORDS = frozenset({"login", "logon", "log in", "signin", "sign in", "anmeldung", "connexion",
                        "inicio de sesion", "inloggen", "logowanie", "auth", "pass", "pin", "clave",
                        "chiave", "parola"})
_PHRASE_TEXT = STRONG_WORDS | WEAK_WORDS
_LONGEST = max(len(p.split()) for p in _PHRASE_TEXT)
_FIRST_LETTERS = frozenset(p[0] for p in _PHRASE_TEXT)
#: strong words that end compounds naming a credential too ("X-API-Key", "adminpassword", "authtoken")
_COMPOUND_ENDINGS = ("password", "passwd", "apikey", "token", "secret", "passwort", "kennwort",
                     "wachtwoord", "passphrase")
#: words whose value may be digits alone
_PIN_WORDS = frozenset({"pin", "pincode", "pin code", "otp", "passcode"})
#: a value already masked (by the patterns before this detector): nothing left to find there
MASKED = "***"
_NAME = "name"
#: tokens read after a credential word before giving up on a value
_WINDOW = 8
#: lower-case stems one of which any text holding a lexicon word contains (the cheap test first)
NEEDLES = ("pass", "p4ss", "pa55", "pas", "pw", "pword", "cred", "secret", "s3cret", "token", "t0ken",
           "key", "login", "log in", "logon", "inlog", "zugang", "sign", "pin", "otp", "auth", "wort",
           "wachtwoord", "gegevens", "losen", "lösen", "passord", "kode", "salasana", "mot de", "mdp",
           "identifiant", "contrase", "clave", "credencia", "senha", "parola", "chiave", "has", "heslo",
           "şifre", "sifre",
           "geheim", "anmeld", "connexion", "sesion", "logowanie", "пароль", "κωδικ", "パスワード", "密码",
           "密碼", "비밀번호")

#: words between a credential word and its value ("creds are X", "Passwort ist X", "mot de passe: X")
_SEPARATOR_WORDS = frozenset({"is", "are", "was", "were", "ist", "sind", "war", "est", "sont", "es", "son",
                              "é", "são", "e", "è", "sono", "zijn", "jest", "to", "je", "är", "er", "on",
                              "ise", "это", "=", ":", "->", "=>", "-", "now", "lautet", "vaut", "será",
                              "wird"})
_FILLER_WORDS = frozenset({"my", "our", "your", "his", "her", "their", "the", "a", "an", "new", "old",
                           "current", "temporary", "temp", "default", "mein", "meine", "unser", "das",
                           "der", "die", "neue", "neues", "mon", "ma", "mes", "le", "la", "les", "nouveau",
                           "mi", "mis", "el", "nuevo", "nueva", "meu", "minha", "o", "nova", "novo", "il",
                           "mio", "mia", "nuova", "mijn", "het", "nieuwe", "moje", "mój", "moja", "nowe",
                           "nowy", "mitt", "min", "yeni", "мой", "новый", "as", "als", "comme", "como",
                           "jako", "here", "below", "please", "use", "try"})
#: words linking a credential word to whose it is ("password for root", "Passwort für admin")
_OWNER_WORDS = frozenset({"for", "of", "für", "von", "pour", "de", "du", "para", "del", "da", "do", "per",
                          "voor", "van", "dla", "för", "til", "için", "для"})
#: words linking a user name to the secret after it ("login admin with X", "admin / X")
_WITH_WORDS = frozenset({"with", "using", "and", "mit", "und", "avec", "et", "con", "y", "com", "met",
                         "en", "z", "i", "med", "ile", "\u0441", "/", ":"})
#: words after a credential word that say something about it, not what it is: the phrase ends there
NOT_A_SECRET = frozenset({
    "required", "wrong", "incorrect", "invalid", "missing", "empty", "not", "too", "expired", "changed",
    "set", "unset", "needed", "correct", "ok", "none", "null", "redacted", "hidden", "id", "ids", "name",
    "names", "file", "files", "field", "fields", "path", "type", "kind", "count", "ttl", "age", "length",
    "policy", "rotation", "rotated", "revoked", "created", "deleted", "reset", "manager", "store", "vault",
    "prompt", "failed", "failure", "succeeded", "success", "successful", "page", "screen", "form", "dialog",
    "button", "method", "mode", "role", "roles", "scope", "scopes", "issuer", "audience", "endpoint", "url",
    "server", "service", "provider", "header", "cache", "check", "expiry", "expires", "valid", "accepted",
    "refused", "denied", "works", "working", "error", "errors", "request", "requests", "attempt",
    "attempts", "change", "update", "updated", "hash", "hashes", "digest", "fingerprint",
    "erforderlich", "falsch", "requis", "incorrecto", "obrigatória", "vereist", "wymagane", "true", "false",
    "yes", "no", "off", "enabled", "disabled", "unknown", "n/a", "***", "incorrecta", "incorrecte",
    "obligatoria", "obligatoire", "requerida", "falso", "falsa", "inválida", "invalide", "ungültig",
    "abgelaufen", "expirée", "expirado", "expirada", "verlopen", "nieprawidłowe", "onjuist", "errata",
    "sbagliata", "vazia", "vacía", "leer", "vide", "pusty", "sent", "sending", "shared", "given",
})
_LEET = str.maketrans({"4": "a", "@": "a", "0": "o", "3": "e", "5": "s", "$": "s", "7": "t", "-": None,
                       "_": None, ".": None})
#: around a value: quotes and brackets; after it also "," ";" "." (a sentence's end, not the secret)
_QUOTES = "\"'`“”„«»()[]{}<>"
_TRIM = _QUOTES + ",.;!?"
_TOKEN = re.compile(r"[^\s:=]+|[:=]")
_SECRET_SYMBOLS = frozenset("!#$%^&*+?~|@")
_NOT_SECRET_SHAPES = re.compile(
    r"(?ix)^(?:"
    r"[a-z][a-z0-9+.\-]*://\S*"                                      # a URL
    r"|[^@\s]+@[a-z0-9\-]+(?:\.[a-z0-9\-]+)+"                       # an email address
    r"|(?:[a-z0-9\-]+\.)+[a-z]{2,}"                                  # a host name
    r"|\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?"                             # an IPv4 address
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # a UUID
    r"|[a-z]+-[a-z]?\d+"                                             # a managed object id: vm-42, group-v3
    r"|[./~\\\[].*|.*[/\\].*[/\\].*"                                 # a path or datastore path
    r"|.*\.(?:iso|vmx|vmdk|ova|ovf|log|ya?ml|json|txt|pem|crt|key|cfg|conf|ini|zip|gz|sh|py)"  # a file
    r")$")


@functools.lru_cache(maxsize=8192)
def normalised(word: str) -> str:
    """A token as the lexicon spells it: trimmed, lower case, digits read as letters, ``-_.`` dropped."""
    return word.strip(_TRIM).lower().translate(_LEET)


def _near_password(word: str) -> bool:
    """One letter off "password" (a typo: pasword, passwrod, passwort is a word of its own)."""
    target = "password"
    if not 7 <= len(word) <= 9 or word[:2] != "pa":
        return False
    if len(word) == len(target):
        diffs = [i for i, (a, b) in enumerate(zip(word, target, strict=True)) if a != b]
        if len(diffs) == 1:
            return True
        first, second = [*diffs, 0, 0][:2]
        return len(diffs) == 2 and second == first + 1 and word[first] == target[second] \
            and word[second] == target[first]
    short, long_ = (word, target) if len(word) < len(target) else (target, word)
    return any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _phrase_at(words: list[str], index: int) -> tuple[int, bool]:
    """(how many tokens, strong) of the credential word starting at ``index``; (0, False) when none."""
    if words[index][:1] not in _FIRST_LETTERS and not words[index].endswith(_COMPOUND_ENDINGS):
        return 0, False
    for width in range(min(_LONGEST, len(words) - index), 0, -1):
        phrase = " ".join(words[index:index + width])
        if phrase in _PHRASE_TEXT:
            return width, phrase in STRONG_WORDS
    word = words[index]
    if _near_password(word) or _compound(word):
        return 1, True  # a typo of "password", or a compound: X-API-Key, rootpassword, x-auth-token
    return 0, False


def _compound(word: str) -> bool:
    for ending in _COMPOUND_ENDINGS:
        if word.endswith(ending):
            prefix = word[:-len(ending)]
            return prefix.isalpha() and len(prefix) <= 16
    return False


def secret_shaped(value: str) -> bool:
    """Letters with digits or symbols, six characters or more, and not a name, address, path or id."""
    if len(value) < 6 or len(value) > 256 or _NOT_SECRET_SHAPES.match(value):
        return False
    letters = any(c.isalpha() for c in value)
    return letters and (any(c.isdigit() for c in value) or not _SECRET_SYMBOLS.isdisjoint(value))


def _plain_name(token: str) -> bool:
    """A user name between a credential word and its value ("login admin with X", "creds root/X")."""
    return 0 < len(token) <= 64 and token.replace("-", "").replace("_", "").replace(".", "").isalnum()


def _value_span(raw: str, start: int) -> tuple[int, int, str]:
    """Where in ``raw`` (a token at ``start``) the value is: quotes and trailing punctuation left out,
    a user name before ``/`` kept ("admin/***")."""
    lead = len(raw) - len(raw.lstrip(_QUOTES))
    body = raw.lstrip(_QUOTES).rstrip(_QUOTES + ",;.")
    tail = len(raw) - lead - len(body)
    user, slash, secret = body.partition("/")
    if slash and user and secret and "/" not in secret and _plain_name(user):
        lead += len(user) + 1
        body = secret
    return start + lead, start + len(raw) - tail, body


def find(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every phrased secret's value in ``text``, in order, not overlapping."""
    tokens = list(_TOKEN.finditer(text))
    words = [normalised(t.group()) for t in tokens]
    index = 0
    while index < len(tokens):
        width, strong = _phrase_at(words, index)
        if not width:
            index += 1
            continue
        pin = " ".join(words[index:index + width]) in _PIN_WORDS
        found = _Phrase(tokens, words, strong, pin).value_after(index + width)
        if found is None:
            index += width
            continue
        position, span = found
        yield span
        index = position + 1


class _Phrase:
    """Reading the words after one credential word, up to its value (or the sign there is none)."""

    def __init__(self, tokens: list[re.Match[str]], words: list[str], strong: bool, pin: bool) -> None:
        self.tokens, self.words, self.strong, self.pin = tokens, words, strong, pin

    def looks_secret(self, value: str) -> bool:
        return secret_shaped(value) or (self.pin and value.isdigit() and 4 <= len(value) <= 12)

    def links(self, index: int) -> bool:
        """Whether token ``index`` joins a user name to its secret ("with", "/", ":")."""
        return index < len(self.tokens) and (self.words[index] in _WITH_WORDS
                                             or self.tokens[index].group() in (":", "="))

    def separates(self, index: int) -> bool:
        """Whether token ``index`` stands between a credential word and its value (":", "is", "ist")."""
        return self.tokens[index].group() in (":", "=") or self.words[index] in _SEPARATOR_WORDS

    def masked_name(self, index: int, user: bool) -> bool:
        """A token masked already is a user name ("creds: ***" of "creds: admin / X") when a link and
        more follow; otherwise it ends the phrase."""
        return self.tokens[index].group().strip(_TRIM) == MASKED and not user and self.links(index + 1)

    def value_after(self, first: int) -> tuple[int, tuple[int, int]] | None:
        separated = owner = user = linked = False
        for index in range(first, min(first + _WINDOW, len(self.tokens))):
            raw, word = self.tokens[index].group(), self.words[index]
            if MASKED in raw:
                if not self.masked_name(index, user):
                    return None
                user = True
            elif owner and not separated and not self.separates(index):
                pass  # whose it is ("for the service account svc-backup"), up to the separator
            elif word in NOT_A_SECRET:
                return None
            elif user and self.links(index):
                linked = True
            elif self.separates(index):
                separated = True
            elif (word in _FILLER_WORDS or word in _WITH_WORDS) and not user:
                pass
            elif word in _OWNER_WORDS and not (separated or user):
                owner = True
            else:
                verdict = self.judge(index, separated, user, linked)
                if verdict is None or not isinstance(verdict, str):
                    return None if verdict is None else (index, verdict)
                user = True  # a user name; its secret may follow ("admin with X", "root / X")
        return None

    def judge(self, index: int, separated: bool, user: bool, linked: bool) -> tuple[int, int] | str | None:
        """The value's span at token ``index``, ``_NAME`` for a user name before one, or None."""
        start, end, value = _value_span(self.tokens[index].group(), self.tokens[index].start())
        if not value:
            return None
        if user:  # "admin with X": X only when linked, and a secret (or anything, after a strong word)
            return (start, end) if linked and (self.strong or self.looks_secret(value)) else None
        if self.looks_secret(value):
            return start, end
        if _plain_name(value) and self.links(index + 1):
            return _NAME
        return (start, end) if self.strong and separated else None


def mask_phrased(text: str, mask: str) -> str:
    """``text`` with every phrased secret's value (``find``) replaced by ``mask``."""
    pieces: list[str] = []
    position = 0
    for start, end in find(text):
        pieces += [text[position:start], mask]
        position = end
    if not pieces:
        return text
    pieces.append(text[position:])
    return "".join(pieces)
