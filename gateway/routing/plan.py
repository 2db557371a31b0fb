"""The mount plan: which routes of the table start-up serves under the settings, and what stops
it. A provider group the operator switched off (``ROUTE_GROUPS``) is left out with a warning;
a served group that lacks a variable it needs, prices whose settlement fee cannot pay the fee
payer's worst case, or credit on a store that forgets are problems, all listed at once, so
start-up never looks healthy while it cannot sell."""

from __future__ import annotations

import msgspec

from gateway.config import ConfigError, Settings
from gateway.routing.routes import RouteSpec, provider_groups
from gateway.routing.settlement_cost import worst_case_lamports
from gateway.routing.vocabulary import CREDITS_GROUP, is_provider_group


def required_variables(route: RouteSpec, settings: Settings) -> list[str]:
    """Every variable ``route`` needs that is unset (empty when it can be served)."""
    missing: list[str] = []
    if route.upstream_variable is not None and not settings.upstream_url(str(route.upstream)):
        missing.append(route.upstream_variable)
    if route.handler == "tokens" and not settings.asset_api_key:
        missing.append("ASSET_API_KEY")
    if route.paid:
        if not settings.pay_to:
            missing.append("X402_PAY_TO_WALLET")
        if settings.uses_internal_facilitator and not settings.facilitator_wallet:
            missing.append("FACILITATOR_WALLET_BASE58")
        if settings.uses_external_facilitator:
            if not settings.facilitator_api_key_id:
                missing.append("FACILITATOR_API_KEY_ID")
            if not settings.facilitator_api_key_secret:
                missing.append("FACILITATOR_API_KEY_SECRET")
    return missing


class RoutePlan(msgspec.Struct, frozen=True):
    """What start-up does with the table: the routes it serves, one warning per group the
    operator switched off, and one problem per required variable a served group lacks."""

    mounted: list[RouteSpec]
    warnings: list[str]
    problems: list[str]


def route_plan(routes: list[RouteSpec], settings: Settings) -> RoutePlan:
    """Decide which routes to serve; never raises (see :func:`plan_routes`)."""
    switchable = provider_groups(routes)
    chosen = settings.route_groups
    problems: list[str] = []
    if chosen is None:
        served, why_off = set(switchable), ""
    else:
        unknown = [g for g in chosen if g not in switchable]
        if unknown:
            problems.append(
                f"ROUTE_GROUPS names unknown group(s) {', '.join(unknown)} "
                f"(the route groups are {', '.join(switchable)}; or all, or none)"
            )
        served = set(chosen) & set(switchable)
        why_off = f"ROUTE_GROUPS={','.join(chosen) or 'none'} leaves it out"
    mounted: list[RouteSpec] = []
    missing: dict[str, set[str]] = {}
    off: dict[str, int] = {}
    for route in routes:
        if route.group == CREDITS_GROUP and not settings.credits_enabled:
            continue  # credit is an option the operator turns on, not a group switched off
        if is_provider_group(route.group) and route.group not in served:
            off[route.group] = off.get(route.group, 0) + 1
            continue
        for variable in required_variables(route, settings):
            missing.setdefault(variable, set()).add(route.group)
        mounted.append(route)
    for variable, groups in missing.items():
        names = ", ".join(sorted(groups))
        problems.append(
            f"{variable} is required by route group {names} "
            f"(set it, or switch the group off with ROUTE_GROUPS, now {_shown_groups(chosen)})"
        )
    problems.extend(_uncovered_settlement(mounted, settings))
    if settings.credits_enabled and not (settings.persistent_store or settings.credit_kept_in_state_dir):
        problems.append(
            "CREDITS_ENABLED needs a shared store that survives restarts (STATE_STORE_REST_URL=redis://... "
            "or an Upstash REST URL): prepaid credit is money the operator owes"
        )
    warnings = [
        f"route group {group} is off ({count} route(s) not served): {why_off}" for group, count in off.items()
    ]
    mounted.sort(key=lambda r: r.has_path_params)
    return RoutePlan(mounted=mounted, warnings=warnings, problems=problems)


def _uncovered_settlement(routes: list[RouteSpec], settings: Settings) -> list[str]:
    """With the internal facilitator, a problem when the compute caps let one settlement cost
    our fee payer more than the settlement fee its prices carry earns: every such sale would
    lose the operator money. An external facilitator pays its own Solana fees."""
    if not settings.uses_internal_facilitator:
        return []
    worst = worst_case_lamports(settings.exact_policy)
    terms = {r.internal_settlement for r in routes if r.paid}
    caps = (
        f"X402_MAX_COMPUTE_UNIT_LIMIT={settings.max_compute_unit_limit} and "
        f"X402_MAX_COMPUTE_UNIT_PRICE={settings.max_compute_unit_price}"
    )
    return [
        f"one settlement can cost the fee payer {worst} lamports under {caps}, but the internal "
        f"facilitator's settlement fee of {term.fee_micro_usdc} micro-USDC earns only "
        f"{term.fee_lamports} lamports at the SOL price routes.yaml states: lower the caps or "
        "raise pricing.settlement_fee_micro_usdc"
        for term in sorted(terms, key=lambda t: t.fee_micro_usdc)
        if term.fee_lamports is not None and worst > term.fee_lamports
    ]


def _shown_groups(chosen: tuple[str, ...] | None) -> str:
    if chosen is None:
        return "unset: every group"
    return ",".join(chosen) or "none"


def plan_routes(routes: list[RouteSpec], settings: Settings) -> tuple[list[RouteSpec], list[str]]:
    """The routes to serve and the warnings to log; :class:`ConfigError` lists every required
    variable a served group lacks (start-up must not look healthy while it cannot sell)."""
    plan = route_plan(routes, settings)
    if plan.problems:
        raise ConfigError(plan.problems)
    return plan.mounted, plan.warnings
