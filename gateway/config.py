"""Environment -> typed :class:`Settings`, parsed once, with every problem reported at once.

This module checks each value; which variables are *required* depends on the route groups the
operator serves (``ROUTE_GROUPS``, default: every group of routes.yaml), and
``gateway.routing.plan.route_plan`` adds a problem for each one a served group lacks.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import msgspec
import yaml
from solders.pubkey import Pubkey

from gateway.routing import yaml_document
from gateway.store import STORE_TIMEOUT_S, STORE_URL_PROBLEM, known_store_url, shared_store_url
from gateway.telemetry.redact import Secret
from gateway.x402.svm import DEFAULT_MAX_COMPUTE_UNIT_LIMIT, DEFAULT_MAX_COMPUTE_UNIT_PRICE, ExactPolicy
from gateway.x402.types import USDC_MAINNET_MINT

CDP_FACILITATOR_URL = "https://api.cdp.coinbase.com/platform/v2/x402"
PUBLIC_MAINNET_RPC_URL = "https://api.mainnet-beta.solana.com"
PACKAGED_ROUTES_FILE = Path(__file__).with_name("routes.yaml")
INTERNAL = "internal"

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# ASCII digits only: int()/float() would also take "80_80", "+5" or non-ASCII digits.
_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")

# Every variable load_settings reads whatever the route table says; the URL of each upstream comes
# from the variable the table's ``upstreams`` block names (see :func:`upstream_variables`).
GATEWAY_VARIABLES: tuple[str, ...] = (
    "GATEWAY_BASE_URL", "PORT", "FACILITATOR_URL", "FACILITATOR_API_KEY_ID", "FACILITATOR_API_KEY_SECRET",
    "X402_PAY_TO_WALLET", "X402_USDC_MINT", "X402_MAX_TIMEOUT_SECONDS", "SOLANA_MAINNET_RPC_URL",
    "SOLANA_DEVNET_RPC_URL", "ASSET_API_KEY", "STATE_STORE_REST_URL", "LOG_CHALLENGES",
    "STATE_STORE_REST_TOKEN", "RATE_LIMIT_RPC_RPS", "RATE_LIMIT_DAS_RPS", "RATE_LIMIT_TOKENS_PER_MINUTE",
    "RATE_LIMIT_CHALLENGE_PER_MINUTE", "RATE_LIMIT_WALLET_RPS", "RATE_LIMIT_SYNC_SECONDS",
    "RATE_LIMIT_REFUSED_PAYMENTS_PER_MINUTE", "RATE_LIMIT_TOKENS_SHARE_PERCENT",
    "RATE_LIMIT_SIGN_IN_IP_PER_MINUTE", "RATE_LIMIT_SIGN_IN_WALLET_PER_MINUTE",
    "X402_SETTLEMENT_COOLDOWN_SECONDS", "X402_MAX_SETTLEMENTS_IN_FLIGHT", "X402_SETTLEMENT_CONFIRM_SECONDS",
    "FACILITATOR_FEE_PAYER", "SIWX_SECRET", "INTERNAL_SETTLEMENT_SECRET", "FACILITATOR_WALLET_BASE58",
    "ROUTES_FILE", "UPSTREAM_TIMEOUT_SECONDS",
    "MAX_BODY_BYTES", "TRUSTED_PROXIES", "LOG_LEVEL", "ROUTE_GROUPS", "CLIENT_HEADER_TIMEOUT_SECONDS",
    "CLIENT_BODY_TIMEOUT_SECONDS", "X402_MAX_COMPUTE_UNIT_LIMIT", "X402_MAX_COMPUTE_UNIT_PRICE",
    "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC", "CREDITS_ENABLED", "CREDIT_LAPSE_DAYS", "LEDGER_DATABASE_URL",
    "CLIENT_IPV6_PREFIX_LENGTH", "RPC_BATCH_MAX_ITEMS", "FACILITATOR_DOWN_SECONDS",
    "FACILITATOR_PROBE_SECONDS", "STATE_STORE_TIMEOUT_SECONDS",
)  # fmt: skip
WIDEST_TRUSTED_NETWORK = 256
"""A trusted network wider than this (an IPv4 /24) is likely a subnet or a pod CIDR, not a proxy's
own addresses: worth a start-up note, since every address in it may write X-Forwarded-For."""
UPSTREAM_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]{0,99}")
"""What an upstream's URL variable may be called (the route loader refuses any other name)."""
ALL_GROUPS = "all"
NO_GROUPS = "none"


class ConfigError(Exception):
    """Every problem found in the environment, one per line; never contains a secret."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


FACILITATOR_DOWN_S = 30.0
"""How long a facilitator that failed is offered last, unless a failing probe renews the mark."""
FACILITATOR_PROBE_S = 5.0
"""How often each process probes each facilitator, live."""
FACILITATOR_PROBE_TIMEOUT_S = 3.0
"""How long a probe waits for its answer."""
MAX_CU_PER_TRANSACTION = 1_400_000
"""Solana's own ceiling on a transaction's compute-unit limit."""
MAX_SETTLEMENT_FEE_MICRO_USDC = 1_000_000
"""The most an external facilitator's settlement fee may add to every price: one USDC."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Typed, validated configuration. Secrets are :class:`Secret` and never print."""

    base_url: str
    port: int = 8080
    facilitator_url: str = CDP_FACILITATOR_URL
    """The preferred facilitator: ``internal`` (our own fee payer) or a URL."""
    fallback_facilitators: tuple[str, ...] = ()
    """The facilitators to fail over to, in order (``FACILITATOR_URL``'s later entries)."""
    facilitator_down_s: float = FACILITATOR_DOWN_S
    """How long a facilitator that failed is offered last, unless a failing probe renews it."""
    facilitator_probe_s: float = FACILITATOR_PROBE_S
    """How often each process probes each facilitator, live, when there are several."""
    facilitator_api_key_id: str = ""
    facilitator_api_key_secret: Secret = Secret("")
    facilitator_settlement_fee_micro_usdc: int = 0
    """What an external facilitator's settlement costs the operator, added to every price (the
    internal facilitator's fee is the route table's: it follows from the compute caps)."""
    pay_to: str = ""
    usdc_mint: str = USDC_MAINNET_MINT
    solana_mainnet_rpc_url: Secret = Secret(PUBLIC_MAINNET_RPC_URL)
    solana_devnet_rpc_url: Secret = Secret("")
    rate_limit_rpc_rps: int = 50
    rate_limit_das_rps: int = 10
    rate_limit_tokens_per_minute: int = 30
    rate_limit_challenge_per_minute: int = 120
    rate_limit_wallet_rps: int | None = None
    """A payer's own limit on each paid scope; None: the scope's own limit (rpc or das)."""
    rate_limit_refused_per_minute: int = 10
    """Payments the facilitator may refuse per client IP and per payer before the next one is
    refused without asking it (each refusal cost the operator a verify)."""
    rate_limit_tokens_share_percent: int = 25
    """The most of the asset-data key's budget one wallet, or one IP, may take while other clients
    wait for the key (refused by it within its minute); a client alone may use all of it."""
    rate_limit_sign_in_ip_per_minute: int = 120
    """Sign-ins per client IP on a sign-in-only route with no upstream budget (the credit
    balance): a sign-in is free to make, so this bounds what a flood costs and stores."""
    rate_limit_sign_in_wallet_per_minute: int = 60
    """Sign-ins per wallet on those routes."""
    rate_limit_sync_s: float = 0.1
    """How often each process shares its challenge-limit counts through the store."""
    settlement_cooldown_s: int = 600
    """How long a payer, its token account and its client IP cannot pay after a settlement of
    theirs failed on chain (the internal facilitator's fee payer paid for it)."""
    settlement_confirm_s: float = 30.0
    """How long a settlement of the internal facilitator waits for its confirmation before it
    answers ``settlement_pending``; its outcome is still followed until its blockhash expires."""
    max_settlements_in_flight: int = 16
    """The most settlements a payer, or a client IP, may have in flight at once, however long
    its record of settled payments (the internal facilitator)."""
    max_compute_unit_limit: int = DEFAULT_MAX_COMPUTE_UNIT_LIMIT
    max_compute_unit_price: int = DEFAULT_MAX_COMPUTE_UNIT_PRICE
    facilitator_fee_payer: str = ""
    upstreams: dict[str, Secret] = msgspec.field(default_factory=dict)
    asset_api_key: Secret = Secret("")
    store_url: Secret = Secret("")
    store_token: Secret = Secret("")
    store_timeout_s: float = STORE_TIMEOUT_S
    """``STATE_STORE_TIMEOUT_SECONDS``: how long one call to the shared store may take; past it the
    request fails closed (503 ``store_unavailable``, nothing charged)."""
    ledger_url: Secret = Secret("")
    """``LEDGER_DATABASE_URL``: the PostgreSQL the ledger of record (every sale and credit
    movement) is written to; empty: no ledger."""
    internal_secret: Secret = Secret("")
    facilitator_wallet: Secret = Secret("")
    siwx_secret: Secret = Secret("")
    routes_file: Path = PACKAGED_ROUTES_FILE
    upstream_timeout_s: float = 15.0
    max_body_bytes: int = 65536
    rpc_batch_max_items: int = 20
    """The most JSON-RPC calls one request to a provider's ``/rpc`` or ``/das`` endpoint may
    carry (``RPC_BATCH_MAX_ITEMS``): each is validated and priced before anything is charged."""
    client_header_timeout_s: float = 10.0
    client_body_timeout_s: float = 10.0
    trusted_proxies: tuple[IpNetwork, ...] = ()
    client_ipv6_prefix_length: int = 64
    """An IPv6 client is its address's network of this length to every per-IP limit and guard
    (``CLIENT_IPV6_PREFIX_LENGTH``): one site holds a whole /64 or more, not one address."""
    log_level: str = "INFO"
    log_challenges: str = "summary"
    """``LOG_CHALLENGES``: how plain 402 challenges are logged (``summary``, ``all``, ``off``)."""
    payment_timeout_s: int = 60
    route_groups: tuple[str, ...] | None = None
    """The route groups to serve (``ROUTE_GROUPS``); None: every group routes.yaml declares."""
    credits_enabled: bool = False
    """``CREDITS_ENABLED``: sell prepaid credit (the top-up routes) and accept it, spent by
    signing in, on every paid route. Credit is money owed: it needs a store that is shared and
    survives restarts."""
    credit_lapse_days: int = 365
    """Credit lapses this many days after the wallet's last top-up (``CREDIT_LAPSE_DAYS``)."""
    credit_lapse_ms: int = 0
    """The lapse in ms instead, when set: for tests, which cannot wait out days. No variable sets
    it."""
    credit_kept_in_state_dir: bool = False
    """The sandbox keeps the in-memory store's credit in its state directory (saved on exit,
    restored on start), so credit is allowed there without Redis or Upstash. No variable sets it:
    only ``x402-gateway sandbox`` does."""

    @property
    def persistent_store(self) -> bool:
        """The store outlives this process (Redis or Upstash), as money owed must."""
        return shared_store_url(self.store_url.reveal())

    @property
    def domain(self) -> str:
        """Host of the base URL with its port, as SIWX compares it."""
        return urlsplit(self.base_url).netloc

    @property
    def exact_policy(self) -> ExactPolicy:
        """The caps on an exact payment's compute budget (they bound the settlement fee)."""
        return ExactPolicy(
            max_compute_unit_limit=self.max_compute_unit_limit,
            max_compute_unit_price=self.max_compute_unit_price,
        )

    @property
    def facilitator_urls(self) -> tuple[str, ...]:
        """Every facilitator, in the operator's order of preference."""
        return (self.facilitator_url, *self.fallback_facilitators)

    @property
    def uses_internal_facilitator(self) -> bool:
        """Our own fee payer settles some payments (it may be a fallback)."""
        return INTERNAL in self.facilitator_urls

    @property
    def uses_external_facilitator(self) -> bool:
        return any(url != INTERNAL for url in self.facilitator_urls)

    def upstream_url(self, name: str) -> str | None:
        secret = self.upstreams.get(name)
        return secret.reveal() if secret else None


class _Reader:
    """Collects problems while reading variables so one message can list them all."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []

    def text(self, name: str, default: str = "") -> str:
        return self.env.get(name, "").strip() or default

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self.text(name)
        if not raw:
            return default
        if not _INTEGER.fullmatch(raw):
            self.problems.append(f"{name} must be an integer, got {raw[:20]!r}")
            return default
        value = int(raw)
        if not low <= value <= high:
            self.problems.append(f"{name} must be between {low} and {high}, got {value}")
        return value

    def flag(self, name: str) -> bool:
        """``true``/``1``/``yes``/``on`` or ``false``/``0``/``no``/``off`` (unset: false)."""
        raw = self.text(name).lower()
        if raw in ("", "false", "0", "no", "off"):
            return False
        if raw in ("true", "1", "yes", "on"):
            return True
        self.problems.append(f"{name} must be true or false, got {raw[:20]!r}")
        return False

    def number(self, name: str, default: float, low: float, high: float) -> float:
        raw = self.text(name)
        if not raw:
            return default
        if not _NUMBER.fullmatch(raw):
            self.problems.append(f"{name} must be a number, got {raw[:20]!r}")
            return default
        value = float(raw)
        if not low <= value <= high:
            self.problems.append(f"{name} must be between {low} and {high}, got {value}")
        return value

    def url(self, name: str, default: str = "", secret: bool = True) -> str:
        raw = self.text(name, default)
        if raw and not _is_http_url(raw):
            shown = "(value hidden)" if secret else repr(raw[:60])
            self.problems.append(f"{name} must be an http:// or https:// URL {shown}")
            return ""
        return raw.rstrip("/") if raw else raw

    def pubkey(self, name: str, default: str = "") -> str:
        raw = self.text(name, default)
        if raw:
            try:
                Pubkey.from_string(raw)
            except ValueError:
                self.problems.append(f"{name} is not a valid Solana address")
        return raw


def upstream_variables(routes_file: Path) -> dict[str, str]:
    """The ``upstreams`` block of the route table: upstream name -> the variable holding its URL.

    Read here, before the table is loaded, because the URLs belong to the settings. Entries that
    are not well-formed are skipped, and an unreadable table gives none: the route loader reports
    both, with their location.
    """
    try:
        doc, _ = yaml_document.parse(routes_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    block = doc.get("upstreams") if isinstance(doc, dict) else None
    if not isinstance(block, dict):
        return {}
    return {
        name: variable
        for name, variable in block.items()
        if isinstance(name, str)
        and isinstance(variable, str)
        and UPSTREAM_VARIABLE.fullmatch(variable)
        and variable not in GATEWAY_VARIABLES
    }


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _base_url(reader: _Reader) -> str:
    raw = reader.text("GATEWAY_BASE_URL")
    if not raw:
        reader.problems.append("GATEWAY_BASE_URL is required (for example https://gateway.example.com)")
        return ""
    try:
        parts = urlsplit(raw)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        valid = False
    if not valid or parts.query or parts.fragment or parts.username or parts.password:
        reader.problems.append(
            "GATEWAY_BASE_URL must be an absolute http(s) URL without query, fragment or credentials, "
            f"got {_as_typed(raw)[:80]!r}"
        )
        return ""
    return raw.rstrip("/")


def _as_typed(raw: str) -> str:
    """A malformed base URL echoed as the operator typed it, except the parts that may carry a
    key (credentials, query, fragment), which show as ``***``."""
    try:
        parts = urlsplit(raw)
    except ValueError:
        return "(unparsable URL)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    fragment = "***" if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _trusted_proxies(reader: _Reader) -> tuple[IpNetwork, ...]:
    networks: list[IpNetwork] = []
    for item in filter(None, (p.strip() for p in reader.text("TRUSTED_PROXIES").split(","))):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            reader.problems.append(f"TRUSTED_PROXIES entry {item[:50]!r} is not an IP address or CIDR")
    return tuple(networks)


def _store_url(reader: _Reader) -> str:
    raw = reader.text("STATE_STORE_REST_URL")
    if not known_store_url(raw):
        reader.problems.append(STORE_URL_PROBLEM)
        return ""
    return raw


def _ledger_url(reader: _Reader) -> str:
    raw = reader.text("LEDGER_DATABASE_URL")
    if raw and urlsplit(raw).scheme not in ("postgres", "postgresql"):
        reader.problems.append("LEDGER_DATABASE_URL must be a postgresql:// URL")
        return ""
    return raw


def _facilitator_urls(reader: _Reader) -> tuple[str, ...]:
    """``FACILITATOR_URL``: one facilitator, or several separated by commas in order of
    preference (each ``internal`` or an http(s) URL), to fail over between."""
    raw = reader.text("FACILITATOR_URL", CDP_FACILITATOR_URL)
    urls: list[str] = []
    for entry in (part.strip() for part in raw.split(",")):
        if entry == INTERNAL:
            urls.append(entry)
            continue
        if not _is_http_url(entry):
            shown = repr(entry[:60])
            reader.problems.append(f"FACILITATOR_URL entries must be internal or http(s) URLs, got {shown}")
            continue
        urls.append(entry.rstrip("/"))
    if len(set(urls)) != len(urls):
        reader.problems.append("FACILITATOR_URL names a facilitator twice")
    return tuple(dict.fromkeys(urls)) or (CDP_FACILITATOR_URL,)


def _route_groups(reader: _Reader) -> tuple[str, ...] | None:
    """``ROUTE_GROUPS``: unset or ``all`` serves every group, ``none`` only the service routes."""
    raw = reader.text("ROUTE_GROUPS").lower()
    if not raw or raw == ALL_GROUPS:
        return None
    if raw == NO_GROUPS:
        return ()
    names = tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
    for name in names:
        if not re.fullmatch(r"[a-z0-9_]{1,40}", name):
            reader.problems.append(f"ROUTE_GROUPS entry {name[:40]!r} is not a route group name")
    return names


def _log_level(reader: _Reader) -> str:
    level = reader.text("LOG_LEVEL", "INFO").upper()
    if level not in logging.getLevelNamesMapping():
        reader.problems.append(f"LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, got {level[:20]!r}")
        return "INFO"
    return level


CHALLENGE_LOG_MODES = ("summary", "all", "off")
"""``LOG_CHALLENGES``: plain 402 challenges counted per route in a periodic line, logged one line
each, or not logged (gateway.telemetry.request_log)."""


def _log_challenges(reader: _Reader) -> str:
    mode = reader.text("LOG_CHALLENGES", CHALLENGE_LOG_MODES[0]).lower()
    if mode not in CHALLENGE_LOG_MODES:
        allowed = ", ".join(CHALLENGE_LOG_MODES)
        reader.problems.append(f"LOG_CHALLENGES must be one of {allowed}, got {mode[:20]!r}")
        return CHALLENGE_LOG_MODES[0]
    return mode


def _check_keys(settings: Settings, problems: list[str]) -> None:
    """Key material is parsed at start-up so a bad key is a config problem, not a crash later."""
    from gateway.facilitators.cdp_auth import CdpKey
    from gateway.x402.svm import parse_wallet

    if settings.facilitator_wallet:
        try:
            parse_wallet(settings.facilitator_wallet.reveal())
        except ValueError as exc:
            problems.append(str(exc))
    key_id, secret = settings.facilitator_api_key_id, settings.facilitator_api_key_secret
    if bool(key_id) != bool(secret):
        problems.append("set both FACILITATOR_API_KEY_ID and FACILITATOR_API_KEY_SECRET, or neither")
    elif key_id and settings.uses_external_facilitator:
        try:
            CdpKey.parse(key_id, secret)
        except ValueError as exc:
            problems.append(f"FACILITATOR_API_KEY_SECRET: {exc}")


def load_settings(env: Mapping[str, str]) -> Settings:
    """Read the environment once; raise :class:`ConfigError` listing every problem."""
    settings, problems = read_settings(env)
    if problems:
        raise ConfigError(problems)
    return settings


def read_settings(env: Mapping[str, str]) -> tuple[Settings, list[str]]:
    """The settings and every problem found (never raises), so a report can add the problems
    of the route table to the same list."""
    r = _Reader(env)
    base_url = _base_url(r)
    routes_file = Path(r.text("ROUTES_FILE") or PACKAGED_ROUTES_FILE)
    upstreams = {
        name: Secret(url) for name, var in upstream_variables(routes_file).items() if (url := r.url(var))
    }
    settings = Settings(
        base_url=base_url,
        port=r.integer("PORT", 8080, 1, 65535),
        facilitator_url=(facilitators := _facilitator_urls(r))[0],
        fallback_facilitators=facilitators[1:],
        facilitator_down_s=r.number("FACILITATOR_DOWN_SECONDS", FACILITATOR_DOWN_S, 1.0, 3600.0),
        facilitator_probe_s=r.number("FACILITATOR_PROBE_SECONDS", FACILITATOR_PROBE_S, 0.5, 300.0),
        facilitator_api_key_id=r.text("FACILITATOR_API_KEY_ID"),
        facilitator_api_key_secret=Secret(r.text("FACILITATOR_API_KEY_SECRET")),
        facilitator_settlement_fee_micro_usdc=r.integer(
            "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC", 0, 0, MAX_SETTLEMENT_FEE_MICRO_USDC
        ),
        pay_to=r.pubkey("X402_PAY_TO_WALLET"),
        usdc_mint=r.pubkey("X402_USDC_MINT", USDC_MAINNET_MINT),
        solana_mainnet_rpc_url=Secret(r.url("SOLANA_MAINNET_RPC_URL", PUBLIC_MAINNET_RPC_URL)),
        solana_devnet_rpc_url=Secret(r.url("SOLANA_DEVNET_RPC_URL")),
        rate_limit_rpc_rps=r.integer("RATE_LIMIT_RPC_RPS", 50, 1, 1_000_000),
        rate_limit_das_rps=r.integer("RATE_LIMIT_DAS_RPS", 10, 1, 1_000_000),
        rate_limit_tokens_per_minute=r.integer("RATE_LIMIT_TOKENS_PER_MINUTE", 30, 1, 1_000_000),
        rate_limit_challenge_per_minute=r.integer("RATE_LIMIT_CHALLENGE_PER_MINUTE", 120, 1, 1_000_000),
        rate_limit_wallet_rps=(
            r.integer("RATE_LIMIT_WALLET_RPS", 1, 1, 1_000_000) if r.text("RATE_LIMIT_WALLET_RPS") else None
        ),
        rate_limit_refused_per_minute=r.integer("RATE_LIMIT_REFUSED_PAYMENTS_PER_MINUTE", 10, 1, 1_000_000),
        rate_limit_tokens_share_percent=r.integer("RATE_LIMIT_TOKENS_SHARE_PERCENT", 25, 1, 100),
        rate_limit_sign_in_ip_per_minute=r.integer("RATE_LIMIT_SIGN_IN_IP_PER_MINUTE", 120, 1, 1_000_000),
        rate_limit_sign_in_wallet_per_minute=r.integer(
            "RATE_LIMIT_SIGN_IN_WALLET_PER_MINUTE", 60, 1, 1_000_000
        ),
        rate_limit_sync_s=r.number("RATE_LIMIT_SYNC_SECONDS", 0.1, 0.01, 10.0),
        settlement_cooldown_s=r.integer("X402_SETTLEMENT_COOLDOWN_SECONDS", 600, 0, 86_400),
        settlement_confirm_s=r.number("X402_SETTLEMENT_CONFIRM_SECONDS", 30.0, 0.1, 120.0),
        max_settlements_in_flight=r.integer("X402_MAX_SETTLEMENTS_IN_FLIGHT", 16, 1, 256),
        log_challenges=_log_challenges(r),
        max_compute_unit_limit=r.integer(
            "X402_MAX_COMPUTE_UNIT_LIMIT", DEFAULT_MAX_COMPUTE_UNIT_LIMIT, 1, MAX_CU_PER_TRANSACTION
        ),
        max_compute_unit_price=r.integer(
            "X402_MAX_COMPUTE_UNIT_PRICE", DEFAULT_MAX_COMPUTE_UNIT_PRICE, 0, 10**12
        ),
        facilitator_fee_payer=r.pubkey("FACILITATOR_FEE_PAYER"),
        upstreams=upstreams,
        asset_api_key=Secret(r.text("ASSET_API_KEY")),
        store_url=Secret(_store_url(r)),
        ledger_url=Secret(_ledger_url(r)),
        store_token=Secret(r.text("STATE_STORE_REST_TOKEN")),
        store_timeout_s=r.number("STATE_STORE_TIMEOUT_SECONDS", STORE_TIMEOUT_S, 0.1, 30.0),
        internal_secret=Secret(r.text("INTERNAL_SETTLEMENT_SECRET")),
        facilitator_wallet=Secret(r.text("FACILITATOR_WALLET_BASE58")),
        siwx_secret=Secret(r.text("SIWX_SECRET")),
        routes_file=routes_file,
        upstream_timeout_s=r.number("UPSTREAM_TIMEOUT_SECONDS", 15.0, 0.1, 300.0),
        max_body_bytes=r.integer("MAX_BODY_BYTES", 65536, 1024, 16 * 1024 * 1024),
        rpc_batch_max_items=r.integer("RPC_BATCH_MAX_ITEMS", 20, 1, 100),
        client_header_timeout_s=r.number("CLIENT_HEADER_TIMEOUT_SECONDS", 10.0, 0.5, 600.0),
        client_body_timeout_s=r.number("CLIENT_BODY_TIMEOUT_SECONDS", 10.0, 0.5, 600.0),
        trusted_proxies=_trusted_proxies(r),
        client_ipv6_prefix_length=r.integer("CLIENT_IPV6_PREFIX_LENGTH", 64, 32, 128),
        log_level=_log_level(r),
        payment_timeout_s=r.integer("X402_MAX_TIMEOUT_SECONDS", 60, 5, 3600),
        route_groups=_route_groups(r),
        credits_enabled=r.flag("CREDITS_ENABLED"),
        credit_lapse_days=r.integer("CREDIT_LAPSE_DAYS", 365, 1, 3650),
    )
    _check_keys(settings, r.problems)
    if not settings.uses_external_facilitator and r.text("FACILITATOR_SETTLEMENT_FEE_MICRO_USDC"):
        r.problems.append(
            "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC is an external facilitator's fee: with "
            "FACILITATOR_URL=internal the fee is routes.yaml's pricing.settlement_fee_micro_usdc; unset it"
        )
    if settings.facilitator_down_s <= settings.facilitator_probe_s + FACILITATOR_PROBE_TIMEOUT_S:
        r.problems.append(
            "FACILITATOR_DOWN_SECONDS must exceed FACILITATOR_PROBE_SECONDS plus the probe's "
            f"{FACILITATOR_PROBE_TIMEOUT_S:g} s timeout, "
            "or a dead facilitator is offered first between two probes"
        )
    if settings.siwx_secret and len(settings.siwx_secret.reveal()) < 32:
        r.problems.append("SIWX_SECRET must be at least 32 characters (shared by all replicas)")
    shown = str(routes_file)[:200]
    if routes_file.is_dir():
        r.problems.append(f"ROUTES_FILE {shown!r} is a directory, not a route table file")
    elif not routes_file.is_file():
        r.problems.append(f"ROUTES_FILE {shown!r} does not exist")
    return settings, r.problems


def startup_notes(settings: Settings) -> list[str]:
    """Warnings worth one line each at start-up (the store, secrets); never fatal."""
    notes: list[str] = []
    if not settings.persistent_store:
        notes.append(
            "state store: in-memory (one process only; set STATE_STORE_REST_URL for replicas or workers)"
        )
    if settings.credits_enabled and not settings.ledger_url:
        notes.append(
            "credit is on without a ledger: a store that loses data loses the credit owed"
            " (set LEDGER_DATABASE_URL)"
        )
    if not settings.siwx_secret:
        notes.append("SIWX_SECRET unset: sign-in nonces use a random per-process secret (one replica only)")
    for network in settings.trusted_proxies:
        if network.num_addresses > WIDEST_TRUSTED_NETWORK:
            notes.append(
                f"TRUSTED_PROXIES {network} trusts {network.num_addresses:,} addresses: any of them that "
                "a client can send from picks its own rate-limit bucket; name only your proxy's addresses"
            )
    secret = settings.internal_secret.reveal()
    if secret and len(secret) < 32:
        notes.append("INTERNAL_SETTLEMENT_SECRET is shorter than 32 characters: use a longer random secret")
    return notes
