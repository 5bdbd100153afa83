"""Deciding one call: ``evaluate`` is a pure function of the call's facts, the policy and the clock.

The order: protected objects, the bulk limit, the first matching rule, per-target settings over
defaults, then maintenance windows on top of any allow. ``override=true`` only skips a deny rule with
``unless_override``: it never grants more than the rest of the policy does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gateway.guard.limits import bulk_denial
from gateway.guard.policy.model import Action, CallFacts, Decision, Policy, Rule, TargetPolicy
from gateway.vocabulary import Category

# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class _Verdict:
    action: Action
    rule: str
    reason: str
    overridden: tuple[str, ...] = ()
    #: the rule that decided, when one did (its N of M keys and confirm_by layer over the target's)
    decided_by: Rule | None = None


def evaluate(facts: CallFacts, policy: Policy, now: datetime) -> Decision:
    """Decide one call. Pure: the same facts, policy and ``now`` (timezone-aware) give the same answer."""
    if now.utcoffset() is None:
        raise ValueError("evaluate needs a timezone-aware 'now', e.g. datetime.now(UTC)")
    settings = policy.target_settings(facts.target)
    dry, snap = settings.dry_run, settings.auto_snapshot_before_destroy
    verdict = _protected(facts, policy) or _bulk(facts, settings) or _first_rule(facts, policy, settings)
    rule_confirm = verdict.decided_by.confirm_by if verdict.decided_by is not None else None
    confirm_by = (rule_confirm or settings.confirm_by).value
    if verdict.action is Action.ALLOW or verdict.action is Action.REQUIRE_APPROVAL:
        verdict = _window(facts, policy, now, verdict.overridden) or verdict
    if verdict.action is Action.DENY:
        return Decision(False, verdict.reason, verdict.rule, overridden=verdict.overridden, dry_run=dry,
                        auto_snapshot=snap, confirm_by=confirm_by)
    web = facts.category is Category.DESTRUCTIVE and settings.require_web_approval
    reason = verdict.reason + (f"; target '{facts.target}' requires a human approval for destructive "
                               "calls (require_web_approval)" if web else "")
    if not (verdict.action is Action.REQUIRE_APPROVAL or web):
        return Decision(True, reason, verdict.rule, False, overridden=verdict.overridden, dry_run=dry,
                        auto_snapshot=snap, confirm_by=confirm_by)
    count, roles, why = _n_of_m(settings, verdict.decided_by)
    return Decision(True, reason + _n_of_m_note(count, roles, why), verdict.rule, True,
                    overridden=verdict.overridden, dry_run=dry, auto_snapshot=snap,
                    approvals_required=count, approver_roles=roles, reason_required=why,
                    confirm_by=confirm_by)


def _n_of_m(settings: TargetPolicy, rule: Rule | None) -> tuple[int, tuple[str, ...], bool]:
    """The target's N of M with what the deciding rule sets over it: the larger count, the rule's
    approver roles, a reason if either asks for one."""
    count, roles, why = settings.approvals_required, settings.approver_roles, settings.reason_required
    if rule is not None:
        count = max(count, rule.approvals_required or 1)
        roles = rule.approver_roles if rule.approver_roles is not None else roles
        why = why or bool(rule.reason_required)
    return count, roles, why


def _n_of_m_note(count: int, roles: tuple[str, ...], why: bool) -> str:
    parts = [f"; {count} distinct approvals needed"] if count > 1 else []
    if roles:
        parts.append(f"; approvers of role {', '.join(roles)}")
    if why:
        parts.append("; a reason is required")
    return "".join(parts)


def _protected(facts: CallFacts, policy: Policy) -> _Verdict | None:
    for entry in policy.protected:
        if not entry.covers(facts):
            continue
        for obj in facts.affected:
            if entry.protects(obj):
                why = f": {entry.reason}" if entry.reason else ""
                return _Verdict(Action.DENY, f"protected:{entry.name}",
                                f"{obj.type} '{obj.name}' ({obj.moid}) is protected by '{entry.name}'{why}; "
                                "override does not apply (change 'protected' in rules.yaml to allow it)")
    return None


def _bulk(facts: CallFacts, settings: TargetPolicy) -> _Verdict | None:
    if facts.category is Category.READ:
        return None
    reason = bulk_denial(facts.count, settings.max_bulk_objects, facts.target)
    return None if reason is None else _Verdict(Action.DENY, settings.origins["max_bulk_objects"], reason)


def _first_rule(facts: CallFacts, policy: Policy, settings: TargetPolicy) -> _Verdict:
    overridden: list[str] = []
    for rule in policy.rules:
        if not rule.matches(facts):
            continue
        if rule.action is Action.DENY and rule.unless_override and facts.override:
            overridden.append(rule.name)
            continue
        return _rule_verdict(rule, tuple(overridden))
    return _category_verdict(facts, settings, tuple(overridden))


def _rule_verdict(rule: Rule, overridden: tuple[str, ...]) -> _Verdict:
    why = f": {rule.reason}" if rule.reason else ""
    reasons = {
        Action.DENY: f"denied by rule '{rule.name}'{why}"
                     + ("; override=true skips this rule (the rest of the policy still applies)"
                        if rule.unless_override else ""),
        Action.ALLOW: f"allowed by rule '{rule.name}'{why}",
        Action.REQUIRE_APPROVAL: f"rule '{rule.name}' requires a human approval{why}",
    }
    return _Verdict(rule.action, f"rule:{rule.name}", reasons[rule.action] + _override_note(overridden),
                    overridden, rule)


def _category_verdict(facts: CallFacts, settings: TargetPolicy, overridden: tuple[str, ...]) -> _Verdict:
    category, target = facts.category.value, facts.target
    action = settings.categories[facts.category]
    origin = settings.origins[category]
    reasons = {
        Action.ALLOW: f"{category} calls are allowed on target '{target}' ({origin})",
        Action.DENY: f"{category} calls are denied on target '{target}' ({origin}); to permit them set "
                     f"'{category}: allow' under defaults or targets.{target} in rules.yaml",
        Action.REQUIRE_APPROVAL: f"{category} calls on target '{target}' require a human approval ({origin})",
    }
    return _Verdict(action, origin, reasons[action] + _override_note(overridden), overridden)


def _override_note(overridden: tuple[str, ...]) -> str:
    if not overridden:
        return ""
    return f" (override=true skipped deny rule{'s' if len(overridden) > 1 else ''} " \
           f"{', '.join(repr(n) for n in overridden)})"


def _window(facts: CallFacts, policy: Policy, now: datetime, overridden: tuple[str, ...]) -> _Verdict | None:
    windows = [w for w in policy.maintenance_windows if w.applies(facts.target, facts.risk)]
    if not windows or any(w.is_open(now) for w in windows):
        return None
    opening, window = min(((w.next_opening(now), w) for w in windows), key=lambda pair: pair[0])
    return _Verdict(
        Action.DENY, f"window:{window.name}",
        f"{facts.risk.value}-risk calls on target '{facts.target}' may run only inside a maintenance "
        f"window; the next is '{window.name}' ({window.describe()}), opening "
        f"{opening:%Y-%m-%d %H:%M %Z} (in {_span(opening - now)})",
        overridden,
    )


def _span(delta: timedelta) -> str:
    minutes = max(int(delta.total_seconds() // 60), 0)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m"]
    return " ".join(p for p in parts if p)
