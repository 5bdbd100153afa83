"""Every per-caller decision and the key it compares, as one table of plain values; and a scan of the
package so that a new per-caller comparison cannot quietly use the display name.

``gateway.guard.callers.DECISIONS`` names each per-caller decision; ``CHECKS`` below holds one check per
name, and ``test_every_decision_has_a_row`` fails when the two differ (a decision added to the registry
without a row, or a row for a decision nobody registered). Each check runs the real code with two
callers that show the *same name* under *different keys* (they must be two callers) and one caller under
one key showing *two names* (it must stay one caller).

The scan (``test_no_per_caller_comparison_reads_the_name``) parses every module of ``gateway/`` and lists
each comparison (``==``, ``!=``, ``in``, ``not in``) of a caller's name-like attribute
(``principal.name``, ``proposal.caller``, ``approval.approver``, ``row.get("caller")``, ...) and each call
handing ``<...>.principal.name`` to a per-caller store or counter (``check``, ``by_key``, ``of_caller``,
``get``, ``claim``, ``queue_as``, ``cancel_proposals_of``); any site not in ``NAME_SITES`` fails, with
its file and line. ``NAME_SITES`` says why each listed site may read a name. It is a syntactic check:
it cannot see a name copied into a variable first, which is why the decisions above also have rows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.auth.principal import CallerKey, Principal, caller_fields, parse_key
from gateway.guard import callers
from gateway.guard.approvals import ApprovalRule, approval_refusal, tally
from gateway.guard.decision import (
    Entry,
    Facts,
    Party,
    Proposed,
    TokenState,
    authorize,
    may_read_audit_row,
    proposal_rights,
)
from gateway.guard.limits import RateLimiter, RunawayBreaker
from gateway.proposals import Approval
from gateway.role import BUILTIN_ROLES, Role
from gateway.server.edge.middleware import access_token_for, principal_of
from gateway.vocabulary import Category, Kind, Risk

REPO = Path(__file__).resolve().parents[2]
ADMIN = BUILTIN_ROLES["admin"]
OWN = Role("own", "*", targets="*", audit="own")
IDP = "https://idp.example"
NOW = datetime(2026, 1, 1, tzinfo=UTC)

#: one display name, three callers: the local token, an IdP client showing that name, the gateway's own
TOKEN = Principal("idadmin", "admin", token_id="tok1")
CLIENT = Principal("idadmin", "admin", key=CallerKey.client(IDP, "idadmin"))
SYSTEM = Principal("idadmin", "admin", surface="server")
#: one person under two emails (same issuer and sub), and another person showing the first email
ALICE = Principal("alice@old", "admin", kind=Kind.PERSON, key=CallerKey.person(IDP, "u1"))
ALICE_RENAMED = Principal("alice@new", "admin", kind=Kind.PERSON, key=CallerKey.person(IDP, "u1"))
MALLORY = Principal("alice@old", "admin", kind=Kind.PERSON, key=CallerKey.person(IDP, "u2"))
#: an agent acting for alice
AGENT = Principal("alice@old via cc", "admin", key=CallerKey.client(IDP, "cc", for_subject="u1"),
                  acting_for="alice@old", acting_for_key=CallerKey.person(IDP, "u1"))


def party(p: Principal) -> Party:
    return Party(p.name, TokenState.USABLE, ADMIN, p.kind, key=callers.key_of(p),
                 person_key=callers.person_of(p))


def proposed_by(p: Principal, approved: tuple[Principal, ...] = (),
                rule: ApprovalRule | None = None) -> Proposed:
    return Proposed(p.name, "vc1", "p1", proposer_key=callers.key_of(p),
                    acting_for_key=callers.key_text(p.acting_for_key),
                    approved_by=tuple(callers.key_of(a) for a in approved), rule=rule or ApprovalRule())


def _own_proposal() -> None:
    refused = proposal_rights(party(ALICE_RENAMED), proposed_by(AGENT)).approve
    assert refused is not None and refused.details["reason_code"] == "own_proposal"  # acting for her
    assert proposal_rights(party(MALLORY), proposed_by(AGENT)).approve is None  # same email, not her
    assert proposal_rights(party(ALICE), proposed_by(ALICE_RENAMED)).approve is not None  # her own


def _approver_distinct() -> None:
    by = (callers.key_of(ALICE),)
    assert approval_refusal(callers.key_of(ALICE_RENAMED), "admin", ApprovalRule(2), by,
                            deciding="approve") == "already_approved"
    assert approval_refusal(callers.key_of(MALLORY), "admin", ApprovalRule(2), by, deciding="approve") is None
    assert approval_refusal(None, "admin", ApprovalRule(2), (), deciding="approve") == "already_approved"


def _approval(p: Principal, at: float) -> Approval:
    return Approval("p1", p.name, "person", "admin", at, "", "d", approver_key=callers.key_of(p))


def _n_of_m_persons() -> None:
    twice = tally(ApprovalRule(2), [_approval(ALICE, 1), _approval(ALICE_RENAMED, 2)], "d")
    assert (twice.have, twice.complete) == (1, False)
    two = tally(ApprovalRule(2), [_approval(ALICE, 1), _approval(MALLORY, 2)], "d")
    assert (two.have, two.complete) == (2, True)
    unkeyed = Approval("p1", "alice@old", "person", "admin", 1, "", "d")  # stored before keys were kept
    assert tally(ApprovalRule(1), [unkeyed], "d").have == 0


def _confirm(actor: Principal, owner: Principal) -> Facts:
    return Facts(entry=Entry.CONFIRM, actor=party(actor), tool="delete_vm", category=Category.DESTRUCTIVE,
                 risk=Risk.CRITICAL, now=NOW, target="vc1",
                 owner=party(owner), proposal_id="p1", resolved=False,
                 change_tools=(("delete_vm", Category.DESTRUCTIVE),))


def _confirmation_binding() -> None:
    assert authorize(_confirm(TOKEN, TOKEN)).allowed
    for other in (CLIENT, SYSTEM):
        verdict = authorize(_confirm(other, TOKEN))
        assert not verdict.allowed and verdict.rule == "caller:bound"
    keyless = Party("idadmin", TokenState.USABLE, ADMIN)  # a proposal stored before keys: nobody's
    assert not authorize(replace(_confirm(TOKEN, TOKEN), owner=keyless)).allowed


def _proposal_owner() -> None:
    """``FactsNow.owner`` finds the proposer's token by the id in its key: the key's token id."""
    assert parse_key(callers.key_of(TOKEN)) == CallerKey.token("tok1")
    assert parse_key(callers.key_of(CLIENT)) == CLIENT.key and CLIENT.key.space == "client"
    assert parse_key(None) is None and parse_key("idadmin") is None


def _scoped(p: Principal) -> str:
    return callers.scope_of(p)


def _idempotency_scope() -> None:
    assert len({_scoped(TOKEN), _scoped(CLIENT), _scoped(SYSTEM)}) == 3
    assert _scoped(ALICE) == _scoped(ALICE_RENAMED)
    assert "unkeyed:idadmin" not in {_scoped(TOKEN), _scoped(CLIENT), _scoped(SYSTEM)}  # rows from before


def _task_ownership() -> None:
    assert callers.same(callers.key_of(TOKEN), TOKEN.key)
    assert not callers.same(callers.key_of(TOKEN), CLIENT.key)
    assert not callers.same(None, TOKEN.key)  # a task stored before keys were kept: nobody's


def _rate_limit() -> None:
    limiter = RateLimiter()
    limiter.check("vc1", Category.READ, 1, 0.0, caller=_scoped(TOKEN), shown=TOKEN.name)
    limiter.check("vc1", Category.READ, 1, 0.0, caller=_scoped(CLIENT), shown=CLIENT.name)  # its own budget
    with pytest.raises(Exception, match="caller 'idadmin'"):
        limiter.check("vc1", Category.READ, 1, 0.0, caller=_scoped(TOKEN), shown=TOKEN.name)


def _runaway_breaker() -> None:
    breaker = RunawayBreaker(max_repeats=1)
    breaker.check(_scoped(TOKEN), "delete_vm", "d", Category.DESTRUCTIVE, 0.0)
    breaker.check(_scoped(CLIENT), "delete_vm", "d", Category.DESTRUCTIVE, 0.0)  # not the token's repeat
    with pytest.raises(Exception, match="runaway"):
        breaker.check(_scoped(TOKEN), "delete_vm", "d", Category.DESTRUCTIVE, 0.0, shown=TOKEN.name)


def _busy_audit() -> None:
    assert (_scoped(TOKEN), "vc1") != (_scoped(CLIENT), "vc1")  # ``BusyAudit.record`` keys bursts so


def _web_session() -> None:
    from gateway.web.session import SessionStore

    sessions = SessionStore()
    mine = sessions.create(Principal("alice@old", "admin", "sso:admin", kind=Kind.PERSON, key=ALICE.key))
    assert mine.keyed_to(ALICE_RENAMED.key) and not mine.keyed_to(MALLORY.key)
    token = sessions.create(TOKEN)
    assert token.keyed_to(CallerKey.token("tok1")) and not token.keyed_to(CLIENT.key)


def _mcp_session() -> None:
    token, client = access_token_for(TOKEN), access_token_for(CLIENT, idp=True)
    assert token.subject != client.subject and client.subject == f"idp:{CLIENT.key}"
    back = principal_of(client)
    assert back is not None and back.key == CLIENT.key  # never the system key of its name


def _audit_own() -> None:
    rows = [{"caller": "idadmin", **caller_fields(p)} for p in (TOKEN, CLIENT, SYSTEM)]
    for p, row in zip((TOKEN, CLIENT, SYSTEM), rows, strict=True):
        assert [r for r in rows if may_read_audit_row(OWN, p.name, r, viewer_key=callers.key_of(p))] == [row]
    assert not may_read_audit_row(OWN, "idadmin", {"caller": "idadmin"}, viewer_key=callers.key_of(TOKEN))


def _fair_queue_share() -> None:
    from dataclasses import replace as with_

    from gateway.auth.fair_share import share_of
    from gateway.role import Role

    caller, person = Role("ops", "*", fair_share="caller"), Role("ops", "*", fair_share="person")
    assert share_of(TOKEN, caller) != share_of(CLIENT, caller)  # one name, two keys: two shares
    assert share_of(ALICE, caller) == share_of(ALICE_RENAMED, caller)  # one key, two names: one share
    assert share_of(ALICE, caller) != share_of(MALLORY, caller)
    other_client = with_(AGENT, name="alice@new via other",
                         key=CallerKey.client(IDP, "other", for_subject="u1"))
    assert share_of(AGENT, person) == share_of(other_client, person) == str(ALICE.key)
    assert share_of(AGENT, caller) != share_of(other_client, caller)


CHECKS: dict[str, Callable[[], None]] = {
    "own_proposal": _own_proposal,
    "approver_distinct": _approver_distinct,
    "n_of_m_persons": _n_of_m_persons,
    "confirmation_binding": _confirmation_binding,
    "proposal_owner": _proposal_owner,
    "idempotency_scope": _idempotency_scope,
    "task_ownership": _task_ownership,
    "rate_limit": _rate_limit,
    "runaway_breaker": _runaway_breaker,
    "busy_audit": _busy_audit,
    "web_session": _web_session,
    "mcp_session": _mcp_session,
    "audit_own": _audit_own,
    "fair_queue_share": _fair_queue_share,
}


def test_every_decision_has_a_row() -> None:
    assert set(CHECKS) == set(callers.DECISIONS)


@pytest.mark.parametrize("decision", sorted(CHECKS))
def test_the_decision_compares_keys_not_names(decision: str) -> None:
    CHECKS[decision]()


def test_keys_live_in_namespaces_no_claim_crosses() -> None:
    texts = {callers.key_of(p) for p in (TOKEN, CLIENT, SYSTEM)}
    assert len(texts) == 3 and {t.split(":")[0] for t in texts} == {"token", "client", "system"}
    assert caller_fields(ALICE) == {"caller": "alice@old", "caller_key": str(ALICE.key), "issuer": IDP,
                                    "subject": "u1"}
    assert caller_fields(AGENT)["subject"] == "u1"


# ------------------------------------------------------------------ the scan

#: (file, function, the comparison's source) that may read a name, and why
NAME_SITES: dict[tuple[str, str, str], str] = {
    ("gateway/web/app.py", "_viewer", "record.name != session.name"):
        "a second check beside session.keyed_to (the token's key): a renamed token's session ends",
    ("gateway/guard/decision.py", "may_read_audit_row", "row.get('caller') == viewer"):
        "asked without a key (tests of role rights); every surface passes viewer_key",
    ("gateway/guard/callers.py", "same_row_caller", "row.get('caller') == name"):
        "a token key the log masked (token:***): token names are unique among tokens",
    ("gateway/web/app.py", "audit_tail", "filters['caller'] not in (None, name)"):
        "an own-rows viewer asking for another caller's rows gets none; may_read_audit_row decides by key",
}
#: ``<who>.name`` of a caller, and any ``.caller``/``.approver``/... attribute (records name callers so)
_WHO = r"(?:principal|actor|owner|viewer|party|person|caller|session|record|by|who)"
_NAME_ATTR = re.compile(rf"(?:(?:^|[^\w.]){_WHO}|principal)\.name$"
                        r"|\.(?:caller|approver|proposer|acting_for)$")
_NAME_ITEM = re.compile(r"\.get\('(?:caller|approver|requested_by)'\)$|\['(?:caller|approver)'\]$")
_PER_CALLER_CALLS = frozenset({"check", "by_key", "of_caller", "get", "claim", "queue_as",
                               "cancel_proposals_of"})


def _name_like(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return bool(_NAME_ATTR.search(text) or _NAME_ITEM.search(text))


def name_sites(root: Path) -> list[tuple[str, str, str, int]]:
    """Every comparison of a caller's name-like value and every per-caller call handed a principal's
    name, in the package under ``root``: (file, function, source, line)."""
    found: list[tuple[str, str, str, int]] = []
    for path in sorted((root / "gateway").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Compare) and any(
                        isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
                    if any(_name_like(side) for side in (node.left, *node.comparators)):
                        found.append((rel, fn.name, ast.unparse(node), node.lineno))
                elif isinstance(node, ast.Call):
                    func = node.func
                    callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    # ``shown=``: the name a refusal message shows, never what is counted or compared
                    values = [*node.args, *(k.value for k in node.keywords if k.arg != "shown")]
                    if callee in _PER_CALLER_CALLS and any(ast.unparse(v).endswith("principal.name")
                                                           for v in values):
                        found.append((rel, fn.name, f"{callee}(principal.name, ...)", node.lineno))
    return found


def test_no_per_caller_comparison_reads_the_name() -> None:
    new = [f"{file}:{line} in {fn}: {source}" for file, fn, source, line in name_sites(REPO)
           if (file, fn, source) not in NAME_SITES]
    assert not new, ("a per-caller comparison reads a display name; compare keys through "
                     "gateway.guard.callers (or list the site in NAME_SITES with why it is not a "
                     "per-caller decision):\n"
                     + "\n".join(new))


def test_the_scan_finds_a_comparison_by_name(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "x.py").write_text(
        "def mine(rec, principal):\n    return rec.caller == principal.name\n"
        "def count(limiter, ctx):\n    limiter.check(ctx.principal.name, 'x')\n"
        "def shown(spec):\n    return spec.name == 'delete_vm'\n")
    assert [(fn, line) for _, fn, _, line in name_sites(tmp_path)] == [("mine", 2), ("count", 4)]


def test_every_listed_site_still_exists() -> None:
    """A listed site that is gone is taken off the list (so the list cannot hide a new one later)."""
    sites = {(file, fn, source) for file, fn, source, _ in name_sites(REPO)}
    gone = [site for site in NAME_SITES if site not in sites]
    assert not gone, gone


def test_reasons_need_visible_text() -> None:
    from gateway.guard.approvals import reason_missing, visible
    from gateway.server.proposals.views import clean_reason

    for invisible in ("\u200b\u200b", " \u200d\ufeff ", "\u2060\u00ad", "\u202e"):
        assert not visible(invisible) and clean_reason(invisible) == ""
        assert reason_missing(ApprovalRule(reason_required=True), invisible)
    assert clean_reason("\u200bticket OPS-1") != "" and visible("ok")

