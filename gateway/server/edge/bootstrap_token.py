"""The first token of a fresh state (a new container volume, a new pod): ``GATEWAY_BOOTSTRAP_TOKEN_FILE``.

``gateway serve`` on a network transport refuses to start without a usable token. Where no shell can
run ``gateway token create`` first, set ``GATEWAY_BOOTSTRAP_TOKEN_FILE=PATH``; at start, while the
state holds no usable token:

- PATH holds a token (``gateway bootstrap-token`` prints one; e.g. a Kubernetes Secret): its hash is
  stored as the admin agent token ``bootstrap``, unless that token id is already known (a bootstrap
  token revoked or expired stays so: nothing is adopted, and serve refuses as usual);
- PATH does not exist: a new token is created and written there (mode 0600, never logged); read it
  (``podman exec gateway cat PATH``), then delete the file.

PATH is read as the gateway reads a secret (``gateway.private_files.read_private``): a regular file (a
symbolic link to one is followed) of the gateway's user, mode 0600 or tighter; anything else (a
dangling link, a link loop, a file group or others may read) stops serve with one line naming the file
and the fix (exit 1). Either way it is one ``token_created`` audit row (``caller: gateway``,
``source: bootstrap_file``). Once any usable token exists the file is ignored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from gateway.auth.tokens import new_token, parse_token_id, store_token
from gateway.errors import ConfigError, InvalidArgument
from gateway.private_files import UnsafeFile, read_private, write_private
from gateway.store.base import StateStore, TokenRecord
from gateway.vocabulary import Kind

log = logging.getLogger(__name__)

NAME: Final = "bootstrap"
ROLE: Final = "admin"


def _read(path: Path) -> str | None:
    """The token in ``path``, None when nothing is there; ConfigError for a file not safe to trust
    (``private_files.read_private``: a regular file of the gateway's user, mode 0600 or tighter, no
    dangling link or link loop) or one that cannot be read."""
    try:
        data = read_private(path, "GATEWAY_BOOTSTRAP_TOKEN_FILE")
    except UnsafeFile as exc:
        raise ConfigError(f"{exc}; or unset GATEWAY_BOOTSTRAP_TOKEN_FILE") from None
    except OSError as exc:
        raise ConfigError(f"GATEWAY_BOOTSTRAP_TOKEN_FILE {path} cannot be read ({exc.strerror}); "
                          "fix: make it readable by the gateway's user, or unset GATEWAY_BOOTSTRAP_TOKEN_FILE"
                          ) from None
    if data is None:
        return None
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"GATEWAY_BOOTSTRAP_TOKEN_FILE {path} does not hold a gateway token; put the "
                          "output of `gateway bootstrap-token` in it, or delete it and let serve write "
                          "one") from None


def adopt(store: StateStore, path: Path | None, write: Callable[[dict[str, Any]], None],
          now: float | None = None, *, _again: bool = True) -> TokenRecord | None:
    """Store the bootstrap token (see the module doc) when the state has no usable token, auditing it
    with ``write`` (the gateway's audit trail); its record, or None when nothing was done. Raises
    ConfigError for a file that is not a token or a file that cannot be written."""
    now = time.time() if now is None else now
    if path is None or any(record.usable(now) for record in store.list_tokens()):
        return None
    token = _read(path)
    written = token is None
    if token is None:
        token = new_token()
    token_id = parse_token_id(token)
    if token_id is None:
        raise ConfigError(f"GATEWAY_BOOTSTRAP_TOKEN_FILE {path} does not hold a gateway token; put the "
                          "output of `gateway bootstrap-token` in it, or delete it and let serve write one")
    if store.token_by_id(token_id) is not None or store.token_by_name(NAME) is not None:
        log.warning("GATEWAY_BOOTSTRAP_TOKEN_FILE %s: the bootstrap token was used before (revoked or "
                    "expired since); not adopted again: create one with `gateway token create`", path)
        return None
    if written:
        try:
            write_private(path, (token + "\n").encode(), replace=False)
        except FileExistsError:
            if _again:  # another replica wrote it a moment ago: adopt that one
                return adopt(store, path, write, now, _again=False)
            raise ConfigError(f"GATEWAY_BOOTSTRAP_TOKEN_FILE {path} appeared and vanished while serve "
                              "started; fix: remove whatever keeps replacing it, or put a token from "
                              "`gateway bootstrap-token` there") from None
        except OSError as exc:
            raise ConfigError(f"GATEWAY_BOOTSTRAP_TOKEN_FILE {path} cannot be written ({exc.strerror}); "
                              "point it at a file on the state volume, or put a token from "
                              "`gateway bootstrap-token` there") from None
    try:
        rec = store_token(store, NAME, ROLE, token, expires_in=None, now=now, kind=Kind.AGENT)
    except InvalidArgument:  # the name is taken: another replica adopted it at the same moment
        log.info("GATEWAY_BOOTSTRAP_TOKEN_FILE %s: adopted by another replica", path)
        return None
    write({"phase": "token_created", "caller": "gateway", "surface": "server",
                      "token_name": rec.name, "token_id": rec.token_id, "role": rec.role,
                      "token_kind": rec.kind.value, "source": "bootstrap_file", "path": str(path),
                      "written": written, "expires_at": None})
    log.warning("created the first admin token %r from GATEWAY_BOOTSTRAP_TOKEN_FILE %s (%s); revoke it "
                "once you have your own: gateway token revoke %s", NAME, path,
                "written there now: read it, then delete the file" if written else "read from it", NAME)
    return rec
