"""gateway.web.requests: what the approval page reads from a request, bounded and checked."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from starlette.requests import Request

from gateway.errors import InvalidArgument, NotFound
from gateway.guard.approvals import MAX_REASON_CHARS
from gateway.web.requests import (
    MAX_FILTER_CHARS,
    MAX_TOKEN_CHARS,
    proposal_id,
    query_count,
    query_text,
    reason_from,
    token_from,
)


def request(*, query: str = "", pid: str | None = None, body: bytes = b"") -> Request:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": [],
                             "query_string": query.encode(),
                             "path_params": {} if pid is None else {"pid": pid}}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


@pytest.mark.parametrize("pid", ["abcdef123456", "000000000000"])
def test_a_proposal_id(pid: str) -> None:
    assert proposal_id(request(pid=pid)) == pid


@pytest.mark.parametrize("pid", ["ABCDEF123456", "abc", "abcdef1234567", "abcdef-23456", "", "x" * 100])
def test_a_proposal_id_that_cannot_exist_is_not_found(pid: str) -> None:
    with pytest.raises(NotFound) as raised:
        proposal_id(request(pid=pid))
    assert raised.value.message == (f"no proposal {pid[:40]!r}; proposal ids are 12 lowercase letters and "
                                    "digits")


@pytest.mark.parametrize(("query", "value"), [
    ("tool=delete_vm", "delete_vm"), ("tool=%20x%20", "x"), ("tool=", None), ("", None), ("tool=+", None),
    ("tool=" + "a" * MAX_FILTER_CHARS, "a" * MAX_FILTER_CHARS),
])
def test_query_text(query: str, value: str | None) -> None:
    assert query_text(request(query=query), "tool") == value


def test_query_text_too_long() -> None:
    with pytest.raises(InvalidArgument) as raised:
        query_text(request(query="tool=" + "a" * (MAX_FILTER_CHARS + 1)), "tool")
    assert raised.value.message == "tool: at most 128 characters"


@pytest.mark.parametrize(("query", "count"), [("", 50), ("limit=", 50), ("limit=1", 1), ("limit=200", 200),
                                              ("limit=%2010", 10)])
def test_query_count(query: str, count: int) -> None:
    assert query_count(request(query=query), "limit", 50, 200) == count


@pytest.mark.parametrize("raw", ["0", "201", "-1", "1.5", "ten", "1e2", "%2B5", "%205%206"])
def test_query_count_refuses(raw: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        query_count(request(query=f"limit={raw}"), "limit", 50, 200)
    assert raised.value.message == "limit: a whole number from 1 to 200"


def reason(body: bytes) -> str:
    return anyio.run(reason_from, request(body=body))


@pytest.mark.parametrize(("body", "text"), [
    (b"", ""), (b"  \n", ""), (b'{"reason": "change window"}', "change window"), (b"{}", ""),
    (b'{"reason": ""}', ""), ('{"reason": "é"}'.encode(), "é"),
])
def test_reason_from(body: bytes, text: str) -> None:
    assert reason(body) == text


@pytest.mark.parametrize("body", [b"not json", b'"text"', b"[1]", b'{"reason": 5}', b'{"reason": null}',
                                  ('{"reason": "%s"}' % ("x" * (MAX_REASON_CHARS * 4 + 1))).encode()])
def test_reason_from_refuses(body: bytes) -> None:
    with pytest.raises(InvalidArgument) as raised:
        reason(body)
    assert raised.value.message == (f"reason: send the reason as JSON: {{\"reason\": \"...\"}}, at most "
                                    f"{MAX_REASON_CHARS} characters")


def token(body: bytes, limit: int = MAX_TOKEN_CHARS) -> str:
    return anyio.run(token_from, request(body=body), limit)


@pytest.mark.parametrize(("body", "text"), [(b'{"token": "gwt_abc"}', "gwt_abc"),
                                            (b'{"token": "  gwt_abc  "}', "gwt_abc")])
def test_token_from(body: bytes, text: str) -> None:
    assert token(body) == text


@pytest.mark.parametrize("body", [b"", b"nope", b'{"token": ""}', b'{"token": "  "}', b'{"token": 1}', b"[]",
                                  b'{"tok": "x"}', ('{"token": "%s"}' % ("x" * 257)).encode()])
def test_token_from_refuses(body: bytes) -> None:
    with pytest.raises(InvalidArgument) as raised:
        token(body)
    assert raised.value.message == 'token: send the token as JSON: {"token": "gwt_..."}'


def test_token_from_with_a_larger_limit() -> None:
    assert token(('{"token": "%s"}' % ("x" * 1000)).encode(), limit=4096) == "x" * 1000
