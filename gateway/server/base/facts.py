"""The facts now: caller, proposer, role, target, rules and time, as the stores say at this moment.

They are gathered into the inputs of ``gateway.guard.decision``; nothing here decides."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from gateway.auth.principal import parse_key
from gateway.auth.roles import RoleBook
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.guard import confirm
from gateway.guard.callers import key_of, person_of
from gateway.guard.decision import (
    PROPOSAL_TOOLS,
    Entry,
    Facts,
    Party,
    Proposed,
    TokenState,
    token_state,
    tool_permitted,
)
from gateway.guard.policy.store import PolicyStore
from gateway.proposals import Proposal
from gateway.role import Role
from gateway.server.base.context import off_loop
from gateway.store.base import StateStore, TokenRecord
from gateway.tools.registry import Registry
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category, Kind, Plan

#: how long the edge's read of a token (``Principal.as_read``) stands for the store's, within one request
EDGE_READ_SECONDS: Final = 1.0


class FactsNow:
    """Reads the facts a decision needs, fresh on every call (nothing cached between calls)."""

    def __init__(self, registry: Registry, targets: Mapping[str, Target], policy: PolicyStore,
                 roles: RoleBook, store: StateStore, clock: Callable[[], float]) -> None:
        self.registry = registry
        self.targets = targets
        self.policy = policy
        self.roles = roles
        self.store = store
        self.clock = clock

    def role_of(self, principal: Principal) -> Role | None:
        """The caller's role now (blocking: the roles file is reloaded when it changed); on the event loop,
        ``role_now``."""
        return self.roles.get(principal.role)

    async def role_now(self, principal: Principal) -> Role | None:
        """``role_of`` for code on the event loop: the roles in memory while the file is as they were loaded
        from it (one ``stat``), else read off the loop (a reload parses the file and audits it)."""
        current, role = self.roles.get_loaded(principal.role)
        return role if current else await off_loop(self.roles.get, principal.role)

    @functools.cached_property
    def change_tools(self) -> tuple[tuple[str, Category], ...]:
        """The tools that change something, proposal tools aside (the registry is fixed at start)."""
        return tuple(
            (s.name, s.kind)
            for s in self.registry
            if s.kind is not Category.READ and s.name not in PROPOSAL_TOOLS
        )

    def permits(self, role: Role, spec: ToolSpec) -> bool:
        return tool_permitted(role, spec.name, spec.kind, self.change_tools)

    def tools_for(self, principal: Principal) -> list[ToolSpec]:
        return self.tools_of(self.role_of(principal))

    def tools_of(self, role: Role | None) -> list[ToolSpec]:
        """The tools ``role`` may call (none for an undefined role)."""
        if role is None:
            return []
        return [spec for spec in self.registry if self.permits(role, spec)]

    def visible_targets(self, role: Role) -> list[Target]:
        return [t for t in self.targets.values() if role.permits_target(t.name)]

    def party(self, principal: Principal) -> Party:
        """The caller as the store says it is now: a token's current state, role and kind (a principal
        without a token, from stdio or the CLI, is the role and kind its surface gave it), with its
        keys (``guard.callers``)."""
        if principal.token_id is None:
            return self._tokenless(principal, self.roles.get(principal.role))
        record = self.store.token_by_id(principal.token_id)
        if record is None:
            return Party(principal.name, TokenState.UNKNOWN, None, key=key_of(principal),
                         person_key=person_of(principal))
        return self._party_of(principal, record, self.roles.get(record.role))

    @staticmethod
    def _tokenless(principal: Principal, role: Role | None) -> Party:
        return Party(principal.name, TokenState.USABLE, role, principal.kind, key=key_of(principal),
                     person_key=person_of(principal))

    def _party_of(self, principal: Principal, record: TokenRecord, role: Role | None) -> Party:
        key, person_key = key_of(principal), person_of(principal)
        state = token_state(record, self.clock())
        person = key if record.kind is Kind.PERSON else person_key
        return Party(principal.name, state, role, record.kind, key=key, person_key=person)

    def party_known(self, principal: Principal) -> Party | None:
        """``party`` when it needs no read of the store: a principal without a token, or one whose record
        the edge read for this request (``Principal.as_read``, at most ``EDGE_READ_SECONDS`` ago; the
        edge reads the store's token generation on every request, so a change made before the request
        arrived is in it). The roles file is never read here (``RoleBook.get_loaded``): edited since it was
        loaded, it is reloaded by ``party``. None: ask ``party``, off the event loop."""
        record = principal.as_read
        if principal.token_id is not None and (
                record is None or record.token_id != principal.token_id
                or not 0 <= time.monotonic() - principal.read_at <= EDGE_READ_SECONDS):
            return None
        current, role = self.roles.get_loaded(principal.role if record is None else record.role)
        if not current:
            return None
        return self._tokenless(principal, role) if record is None else self._party_of(principal, record, role)

    def owner(self, p: Proposal) -> Party:
        """The proposer as they are now: for a token, its current state and role, found by the token id
        its key holds (never by name: another caller may show the same name); a proposal without a key
        (stored before keys were kept) has an owner nobody matches."""
        key = parse_key(p.caller_key)
        if key is None:
            return Party(p.caller, TokenState.UNKNOWN, None)
        if key.space != "token":
            return Party(p.caller, TokenState.USABLE, self.roles.get(p.role), key=p.caller_key,
                         person_key=p.acting_for_key)
        record = self.store.token_by_id(key.value)
        if record is None:
            return Party(p.caller, TokenState.UNKNOWN, None, key=p.caller_key, person_key=p.acting_for_key)
        return Party(p.caller, token_state(record, self.clock()), self.roles.get(record.role),
                     key=p.caller_key, person_key=p.acting_for_key)

    def of_proposal(self, entry: Entry, actor: Party, spec: ToolSpec, proposal: Proposal,
                    owner: Party) -> Facts:
        """The gate's facts about an existing proposal (cancel, confirm, approve, deny, the page's
        buttons): its call as made, its target and proposer, before anything is resolved."""
        facts = self.facts(entry, actor, spec, proposal.args, target=proposal.target, owner=owner,
                           proposal=proposal, resolved=False)
        return replace(facts, proposed=Proposed.of(proposal))

    def facts(
        self,
        entry: Entry,
        actor: Party,
        spec: ToolSpec,
        args: Mapping[str, Any],
        *,
        target: str | None = None,
        plan: Plan | None = None,
        owner: Party | None = None,
        proposal: Proposal | None = None,
        resolved: bool = True,
    ) -> Facts:
        """Everything ``authorize`` looks at, gathered now (rules re-read, target looked up)."""
        known = self.targets.get(target) if target is not None else None
        rules, rules_error = self.policy.snapshot() if resolved else (None, None)
        reaches = tuple((name, s.kind) for name in spec.reaches(args) if (s := self.registry.get(name)))
        missing = [name for name in spec.reaches(args) if self.registry.get(name) is None]
        reaches += tuple((name, Category.DESTRUCTIVE) for name in missing)  # unknown reach: strictest
        return Facts(
            entry=entry,
            actor=actor,
            tool=spec.name,
            category=spec.kind,
            risk=spec.risk,
            now=datetime.fromtimestamp(self.clock(), UTC),
            target=target,
            target_known=known is not None,
            target_tags=known.tags if known is not None else (),
            reaches=reaches,
            affected=plan.affected if plan is not None else (),
            object_count=plan.count if plan is not None else 0,
            override=bool(args.get("override", False)),
            owner=owner,
            rules=rules,
            rules_error=rules_error,
            proposal_problem=confirm.proposal_problem(proposal, self.clock()) if proposal else None,
            unmet=plan.unmet if plan is not None else (),
            proposal_id=proposal.id if proposal else None,
            resolved=resolved,
            change_tools=self.change_tools,
        )
