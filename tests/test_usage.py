"""Usage counters: one count per finished request, only for the (route, outcome) pairs a route can
have, counted in process, flushed to the shared store, never lost to an outage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.routes import RouteSpec, load_routes, named_limits, payment_methods
from gateway.routing.vocabulary import Outcome
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.store.upstash import UpstashStore
from gateway.telemetry.metrics import Usage, payment_outcomes, usage_key, usage_outcomes
from gateway.web.context import RequestContext
from tests.support.ports import refusing_port
from tests.support.upstash_rest import UpstashRestServer

ROOT = Path(__file__).resolve().parent.parent
EXACT = "solana.mainnet.provider_a.rpc.getBalance"
SIWX = "tokens.curated"
PUBLIC = "health"
PRICE = 2205
LIMITS = named_limits(Settings(base_url="https://gw.example.com"))


@pytest.fixture(scope="module")
def routes() -> list[RouteSpec]:
    return load_routes(PACKAGED_ROUTES_FILE, LIMITS)


def _ctx(
    route: str, access: str, outcome: str, status: int = 200, amount: str | None = None
) -> RequestContext:
    return RequestContext(route=route, access=access, outcome=Outcome(outcome), status=status, amount=amount)


def _payments(route: str, outcome: str) -> float | None:
    return REGISTRY.get_sample_value("x402_payments_total", {"route": route, "outcome": outcome})


def _revenue(route: str) -> float | None:
    return REGISTRY.get_sample_value("x402_revenue_micro_usdc_total", {"route": route})


async def test_every_outcome_of_a_paid_route_is_counted_once_in_its_place(routes: list[RouteSpec]) -> None:
    store = MemoryStore()
    usage = Usage(store, routes)
    before = {o: _payments(EXACT, o) for o in payment_outcomes("exact")}
    revenue = _revenue(EXACT)
    assert None not in before.values() and revenue is not None, (
        "every meaningful series exists from the start"
    )
    for outcome in payment_outcomes("exact"):
        usage.observe(_ctx(EXACT, "exact", outcome, amount=str(PRICE)))
    assert await store.counters([usage_key(EXACT, "unpaid")]) == {usage_key(EXACT, "unpaid"): 0}

    snapshot = await usage.snapshot([EXACT])

    # challenged; paid; rejected + settle_failed + upstream_failed. A replay and a pending
    # settlement are the same payment again: they add nothing to the store.
    assert snapshot == {(EXACT, "unpaid"): 1, (EXACT, "paid"): 1, (EXACT, "failed"): 3}
    assert {o: _payments(EXACT, o) for o in before} == {o: v + 1 for o, v in before.items() if v is not None}
    assert _revenue(EXACT) == revenue + PRICE  # only the paid outcome earns
    assert (await store.counters([usage_key(EXACT, "failed")]))[usage_key(EXACT, "failed")] == 3


async def test_a_probe_for_credit_that_finds_none_is_its_own_series_never_a_failed_payment(
    routes: list[RouteSpec],
) -> None:
    """A wallet without credit that signs in first (as ``pay`` and the SDK hook do) is answered
    with the route's 402: counted ``no_credit``, an unpaid request in the store, never ``rejected``."""
    settings = Settings(base_url="https://gw.example.com", credits_enabled=True)
    usage = Usage(MemoryStore(), routes, lambda route: payment_methods(route, settings))
    before = {o: _payments(EXACT, o) for o in ("no_credit", "rejected", "replayed", "credit_spent")}
    assert None not in before.values(), "the credit series exist from the start"

    usage.observe(_ctx(EXACT, "exact", "no_credit", 402))
    usage.observe(_ctx(EXACT, "exact", "no_credit", 402))

    after = {o: _payments(EXACT, o) for o in before}
    assert after == {**before, "no_credit": (before["no_credit"] or 0) + 2}
    snapshot = await usage.snapshot([EXACT])
    assert snapshot == {(EXACT, "unpaid"): 2, (EXACT, "failed"): 0, (EXACT, "paid"): 0, (EXACT, "credit"): 0}
    assert "no_credit" in {o.value for o in payment_outcomes("credit")}
    assert _payments(SIWX, "no_credit") is None  # a sign-in route has no credit to look for


async def test_sign_in_routes_count_sign_ins_and_never_payments(routes: list[RouteSpec]) -> None:
    usage = Usage(MemoryStore(), routes)
    signed_in = _payments(SIWX, "signed_in")
    assert signed_in is not None

    usage.observe(_ctx(SIWX, "siwx", "challenged", 402))
    usage.observe(_ctx(SIWX, "siwx", "refused", 402))
    usage.observe(_ctx(SIWX, "siwx", "signed_in", 200))
    usage.observe(_ctx(SIWX, "siwx", "signed_in", 502))  # signed in, but the upstream failed
    usage.observe(_ctx(SIWX, "siwx", "paid", 200, amount="5"))  # no such thing here

    assert await usage.snapshot([SIWX]) == {(SIWX, "unpaid"): 1, (SIWX, "failed"): 2, (SIWX, "signed_in"): 1}
    assert _payments(SIWX, "signed_in") == signed_in + 1
    assert _payments(SIWX, "paid") is None
    assert _revenue(SIWX) is None


async def test_meaningless_pairs_have_no_series_and_no_store_counter(routes: list[RouteSpec]) -> None:
    usage = Usage(MemoryStore(), routes)

    usage.observe(_ctx(PUBLIC, "public", "paid"))
    usage.observe(_ctx(EXACT, "exact", "signed_in"))
    usage.observe(_ctx(EXACT, "exact", "-", 400))  # refused before the payment flow
    usage.observe(_ctx("unmatched", "-", "-", 404))

    assert await usage.snapshot([PUBLIC, "unmatched"]) == {}
    assert (await usage.snapshot([EXACT]))[(EXACT, "paid")] == 0
    assert _payments(PUBLIC, "paid") is None and _revenue(PUBLIC) is None
    assert _payments(EXACT, "signed_in") is None
    assert _payments(EXACT, "-") is None


async def test_the_snapshot_holds_exactly_the_meaningful_pairs_of_the_table(routes: list[RouteSpec]) -> None:
    usage = Usage(MemoryStore(), routes)

    snapshot = await usage.snapshot(r.name for r in routes)

    access = {r.name: r.access for r in routes}
    expected = {(r, o) for r, a in access.items() for o in usage_outcomes(a)}
    assert set(snapshot) == expected
    assert any(a == "exact" for a in access.values()) and any(a == "siwx" for a in access.values())
    assert usage_outcomes("exact") == ("unpaid", "failed", "paid")
    assert usage_outcomes("siwx") == ("unpaid", "failed", "signed_in")
    assert usage_outcomes("public") == usage_outcomes("internal") == ()


async def test_usage_counts_wait_out_a_store_outage(routes: list[RouteSpec]) -> None:
    down = RedisStore(f"redis://127.0.0.1:{refusing_port()}/0", timeout_s=0.2)
    usage = Usage(down, routes)
    usage.observe(_ctx(EXACT, "exact", "settle_failed", 402))
    usage.observe(_ctx(EXACT, "exact", "upstream_failed", 502))
    await usage.flush()  # the store is down: nothing raised, nothing dropped
    await down.close()

    usage.store = store = MemoryStore()
    await usage.flush()

    assert (await store.counters([usage_key(EXACT, "failed")]))[usage_key(EXACT, "failed")] == 2


async def test_a_flush_adds_every_counter_in_one_round_trip(
    routes: list[RouteSpec], clean_redis_url: str
) -> None:
    """However many counters are pending, one flush is one request to the store (here over
    Upstash REST, one transaction), and the totals are exact."""
    rest = UpstashRestServer(clean_redis_url, "usage-token")
    store = UpstashStore(await rest.start(), "usage-token")
    try:
        usage = Usage(store, routes)
        for _ in range(3):
            usage.observe(_ctx(EXACT, "exact", "challenged", 402))
        usage.observe(_ctx(EXACT, "exact", "paid", amount=str(PRICE)))
        usage.observe(_ctx(SIWX, "siwx", "signed_in"))
        usage.observe(_ctx(SIWX, "siwx", "refused", 402))

        await usage.flush()
        requests = list(rest.requests)
        totals = await store.counters(
            [
                usage_key(EXACT, "unpaid"),
                usage_key(EXACT, "paid"),
                usage_key(SIWX, "signed_in"),
                usage_key(SIWX, "failed"),
            ]
        )
    finally:
        await store.close()
        await rest.stop()

    assert requests == ["MULTI"]
    assert list(totals.values()) == [3, 1, 1, 1]


def _outcomes_set_in(*files: str) -> set[str]:
    """Every outcome the middlewares in ``files`` assign to ``ctx.outcome`` (alone or in a tuple):
    an ``Outcome`` member, by name."""
    found: set[str] = set()
    for name in files:
        tree = ast.parse((ROOT / "middleware" / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                targets = target.elts if isinstance(target, ast.Tuple) else [target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for slot, value in zip(targets, values, strict=False):
                    if isinstance(slot, ast.Attribute) and slot.attr == "outcome":
                        if isinstance(value, ast.Name) and value.id == "outcome":
                            continue  # a Delivered's own outcome: see _delivered_outcomes
                        if ast.unparse(value) == "refused.outcome":
                            continue  # a Refused's own outcome: see _refused_outcomes
                        if ast.unparse(value) == "passed.outcome":
                            continue  # a Passed's own outcome: see _passed_outcomes
                        assert isinstance(value, ast.Attribute), ast.unparse(node)
                        assert ast.unparse(value.value) == "Outcome", ast.unparse(node)
                        found.add(Outcome[value.attr].value)
    return found


def _outcomes_given(value: str, position: int, default: str) -> set[str]:
    """The outcomes the payment methods and the payment core build ``value``s with (its
    ``outcome`` field, at ``position``; ``default`` where none is given)."""
    found: set[str] = set()
    sources = [*(ROOT / "gateway" / "methods").rglob("*.py")]
    for path in sorted(sources):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == value:
                given = [k.value for k in node.keywords if k.arg == "outcome"] + node.args[position:]
                found |= {Outcome[g.attr].value for g in given if isinstance(g, ast.Attribute)} or {default}
    return found


def _delivered_outcomes() -> set[str]:
    """What ``Delivered`` answers count as (``paid`` unless a method says otherwise)."""
    return _outcomes_given("Delivered", 2, "paid")


def _refused_outcomes() -> set[str]:
    """What ``Refused`` answers count as (``rejected`` unless a method says otherwise)."""
    return _outcomes_given("Refused", 3, "rejected")


def _passed_outcomes() -> set[str]:
    """What ``Passed`` answers count as (a method with nothing to collect names its own)."""
    return _outcomes_given("Passed", 1, "-")


def test_the_outcomes_counted_are_the_ones_the_middlewares_set() -> None:
    """An outcome the access layer or a method sets but the metrics do not know would go
    uncounted. (``upstream_failed`` on a sign-in route is also the telemetry's word for
    ``signed_in`` with a 5xx.)"""
    declared = {o for method in ("exact", "credit", "siwx") for o in payment_outcomes(method)}
    counted = _outcomes_set_in("paid_access.py", "payment_answers.py")
    assert counted | _delivered_outcomes() | _refused_outcomes() | _passed_outcomes() == declared
    assert _delivered_outcomes() == {"paid", "credit_spent"}
    assert _refused_outcomes() == {"rejected", "no_credit", "refused"}
    assert _passed_outcomes() == {"signed_in"}
