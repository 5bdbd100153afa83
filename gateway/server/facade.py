"""What the surfaces call on a gateway (MCP, the HTTPS app, the web page, the CLI): ``GatewayFacade``,
one-line hand-offs to the collaborator that does each job; ``gateway.server.runtime`` composes them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.answer import Answer
from gateway.auth.tokens import Principal
from gateway.config import Target
from gateway.guard.decision import Party, Verdict
from gateway.proposals import Proposal
from gateway.role import Role
from gateway.server.base.context import ProgressSink
from gateway.server.base.facts import FactsNow
from gateway.server.base.moves import EXECUTION_GRACE_SECONDS, LifecycleListener
from gateway.server.call_path import CallPath
from gateway.tools.spec import ToolSpec
from gateway.vocabulary import Category


class GatewayFacade:
    """The entry points of one gateway process, each handed to the class whose job it is."""

    facts: FactsNow
    path: CallPath
    clock: Callable[[], float]

    def role_of(self, principal: Principal) -> Role | None:
        return self.facts.role_of(principal)

    @property
    def change_tools(self) -> tuple[tuple[str, Category], ...]:
        return self.facts.change_tools

    def tools_for(self, principal: Principal) -> list[ToolSpec]:
        return self.facts.tools_for(principal)

    def visible_targets(self, role: Role) -> list[Target]:
        return self.facts.visible_targets(role)

    def party(self, principal: Principal) -> Party:
        return self.facts.party(principal)

    async def call(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        client: str | None = None,
    ) -> dict[str, Any]:
        """``answer`` as plain JSON values (the web page and the tests read these)."""
        answer = await self.answer(principal, name, args, progress=progress, correlation_id=correlation_id,
                                   client=client)
        return answer.value

    async def answer(
        self,
        principal: Principal,
        name: str,
        args: Mapping[str, Any] | None,
        *,
        progress: ProgressSink | None = None,
        correlation_id: str | None = None,
        client: str | None = None,
    ) -> Answer:
        """One tool call (``Calls.answer``): the answer is encoded once, its text goes to the caller as is."""
        return await self.path.calls.answer(principal, name, args, progress=progress,
                                            correlation_id=correlation_id, client=client)

    async def approve(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None, reason: str = ""
    ) -> dict[str, Any]:
        """A human's approval; its answer as plain JSON values (``approve_answer``: as sent)."""
        return (await self.approve_answer(proposal_id, human, correlation_id=correlation_id,
                                          reason=reason)).value

    async def approve_answer(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None, reason: str = ""
    ) -> Answer:
        """A human's approval, its answer encoded once: the bytes the audit row fingerprints. It runs the
        proposal when it is the last approval its rule needs; before that it is recorded only."""
        return await self.path.proposals.approve(proposal_id, human, correlation_id=correlation_id,
                                                 reason=reason)

    async def deny(
        self, proposal_id: str, human: Principal, *, correlation_id: str | None = None, reason: str = ""
    ) -> dict[str, Any]:
        return await self.path.proposals.deny(proposal_id, human, correlation_id=correlation_id,
                                              reason=reason)

    def decision_rights(self, proposal: Proposal, human: Principal) -> tuple[Verdict, Verdict]:
        return self.path.proposals.decision_rights(proposal, human)

    def add_lifecycle_listener(self, fn: LifecycleListener) -> None:
        self.path.moves.add_lifecycle_listener(fn)

    def revoke_token(self, name: str, *, by: Principal) -> list[str]:
        return self.path.moves.revoke_token(name, by=by)

    def settle_interrupted(self, older_than: float = EXECUTION_GRACE_SECONDS) -> list[str]:
        return self.path.moves.settle_interrupted(older_than)

    def expire_due(self) -> None:
        self.path.moves.expire_due()

    def cancel_orphaned(self) -> list[str]:
        return self.path.moves.cancel_orphaned()

    def flush_waiting(self) -> int:
        return self.path.trail.flush_waiting()
