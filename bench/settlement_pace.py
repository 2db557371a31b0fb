"""Scenarios (f) and (g) of bench/run.py: settlement at the chain's pace, and the paid path with
realistic waits.

* **(f) chain pace**: the gateway settling with its own fee payer (``FACILITATOR_URL=internal``)
  on a LiteSVM chain (:class:`gateway.sandbox.chain.LiteSvmRpcServer`, its own process) that
  reports a landed transaction ``confirmed`` 600 ms after it lands, on Redis, with the
  zero-latency provider. A client process pays the way ``x402-gateway pay`` does (the payclient's
  challenge parsing, requirement choice and headers; svm_payer's builder; a real blockhash and
  balance from the chain) and times each paid request from sending PAYMENT-SIGNATURE to the 200
  carrying a successful PAYMENT-RESPONSE: one call at a time; 10 at once from a wallet that
  settled 5 payments just before (its record allows 11 in flight); 12 at once from a wallet
  that affords one (how many transactions reach the chain); the drain race from shared
  networks: 20 fresh wallets at once, each paying from an account its own transaction empties
  while the chain lands broadcasts 300 ms late, through one IPv4 address and through 20
  addresses of one IPv6 /64 (forwarded by a trusted proxy), counting the fee payer's lamports lost.
* **(g) realistic waits**: the paid path at c=1 with a provider that takes 50 ms, a facilitator
  whose verify takes 30 ms and whose settle takes 700 ms (100 ms plus a 600 ms confirmation), as
  loopback stubs with those sleeps; the gateway (Redis), the reference SDK's middleware and the
  I-O floor on the same stubs, against the physical limit: the sum of the waits that cannot
  overlap (verify, provider, settle).

Processes started here, besides what bench/run.py runs: ``python -m bench.settlement_pace chain
PORT CONFIRM_MS PAY_TO`` (the chain), ``... stub KIND PORT`` (a stub with the stated sleeps) and
``... client JOB_JSON`` (the (f) client, one per phase and round, printing one JSON object).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from solders.hash import Hash
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction

from bench.apps import PEER_PATH
from bench.common import (
    CLIENT_CPU,
    PAID_PATH,
    PAY_TO,
    PROVIDER_PATH,
    REPO,
    RPC_BODY,
    SERVER_CPU,
    Bench,
    Row,
    Server,
    base_env,
    bench_routes_file,
    challenge_of,
    gateway_env,
    paid_job,
    pinner,
    static_job,
    verify_body,
)
from bench.load import CLK_TCK, machine_busy_s, own_ticks, percentile
from bench.procs import GATEWAY_ARGS, python_server, redis_url, started, waits_stubs
from bench.stubs import APPS, FACILITATOR_BASE_PATH
from client.pay import (
    Challenge,
    SpendPolicy,
    choose_requirement,
    parse_challenge,
    payment_header,
    payment_identifier,
)
from client.svm_payer import (
    MintInfo,
    build_exact_transaction,
    build_payment_payload,
    fetch_mint_info,
    transfer_checked_instruction,
)
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.sandbox.chain import USDC_MAINNET_MINT, LiteSvmRpcServer, set_token_account, setup_usdc_chain
from gateway.x402.headers import HeaderError, decode_header
from gateway.x402.types import PaymentRequirements, ResourceInfo, SettleResponse

CONFIRM_S = 0.600
"""The chain's confirmation: a landed transaction reports ``confirmed`` this long after landing."""
PROVIDER_WAIT_S = 0.050
VERIFY_WAIT_S = 0.030
SETTLE_WAIT_S = 0.100
PHYSICAL_LIMIT_MS = (VERIFY_WAIT_S + PROVIDER_WAIT_S + SETTLE_WAIT_S + CONFIRM_S) * 1000
"""(g): the waits a paid request cannot overlap: verify, then the provider, then settle (with
its confirmation). The gateway must not call the provider before the payment is verified, nor
settle before the provider answered (a failed call is not charged)."""
PACE_TARGET_MS = 100.0
BURST_TARGET_MS = 700.0
WAITS_TARGET = 1.05
RECORD = 5
BURST = 10
POOR_BURST = 12
DRAIN_WALLETS = 20
DRAIN_LAND_DELAY_S = 0.300
"""The drain race: how late the chain lands a broadcast after its preflight (a slot or more on a
real cluster), so the wallets' own drains land between our checks and our settlements."""
WALLET_USDC = 1_000 * 10**6
FEE_PAYER = Keypair.from_seed(hashlib.sha256(b"x402-gateway-bench-pace-fee-payer").digest())
PACE = "pace"
WAITS = "waits"
ONE_AT_A_TIME = "one call at a time"
RECORD_BURST = f"{BURST} at once, a record of {RECORD}"
POOR = f"{POOR_BURST} at once, funds for one"
DRAIN_V4 = f"drain race, {DRAIN_WALLETS} wallets on one IPv4 address"
DRAIN_V6 = f"drain race, {DRAIN_WALLETS} wallets on {DRAIN_WALLETS} addresses of one IPv6 /64"
GATEWAY_WAITS = "gateway, Redis store"
PEER_WAITS = "peer (x402 SDK)"
FLOOR_WAITS = "I-O floor, Redis"
DIRECT_PROVIDER = "direct to provider (50 ms)"
DIRECT_VERIFY = "direct to facilitator /verify (30 ms)"
DIRECT_SETTLE = "direct to facilitator /settle (700 ms)"
DIRECTS = (DIRECT_PROVIDER, DIRECT_VERIFY, DIRECT_SETTLE)
REDIS_DATABASES = {"pace": 5, "waits": 6, "floor": 7}
"""Databases of the run's Redis server not used by the other scenarios."""


# --- the chain ------------------------------------------------------------------------------


class BenchChain(LiteSvmRpcServer):
    """The LiteSVM node with bench-only methods, dispatched (under the node's lock) like its
    own: ``benchFund [owner, micro_usdc]`` writes the owner's USDC account, ``benchSent`` counts
    the transactions it accepted for broadcast, ``benchTimes [signature, ...]`` says when each
    landed and when a ``getSignatureStatuses`` call first heard it ``confirmed`` (both
    ``time.monotonic()``, one clock for every process of the machine)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.heard: dict[str, float] = {}

    def _rpc_getSignatureStatuses(self, params: list[Any]) -> dict[str, Any]:
        answer = super()._rpc_getSignatureStatuses(params)
        now = time.monotonic()
        for signature, status in zip(params[0], answer["result"]["value"], strict=True):
            if status is not None and status.get("confirmationStatus") == "confirmed":
                self.heard.setdefault(signature, now)
        return answer

    def _rpc_benchFund(self, params: list[Any]) -> dict[str, Any]:
        """``owner``'s USDC account holding ``micro_usdc``, and 1 SOL for the owner's own
        transactions' fees."""
        owner = Pubkey.from_string(params[0])
        account = set_token_account(self.svm, owner, USDC_MAINNET_MINT, int(params[1]))
        self.svm.airdrop(owner, 1_000_000_000)
        self.watch(owner, account)
        return {"jsonrpc": "2.0", "result": str(account)}

    def _rpc_benchLandDelay(self, params: list[Any]) -> dict[str, Any]:
        """From now on, land each broadcast ``seconds`` after its preflight."""
        self.land_delay_s = float(params[0])
        return {"jsonrpc": "2.0", "result": self.land_delay_s}

    def _rpc_benchSent(self, params: list[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "result": len(self.sent)}

    def _rpc_benchTimes(self, params: list[Any]) -> dict[str, Any]:
        times = []
        for signature in params:
            landed = self._landed.get(signature)
            times.append(None if landed is None else [landed.at, self.heard.get(signature)])
        return {"jsonrpc": "2.0", "result": times}


def serve_chain(port: int, confirm_ms: int, pay_to: str) -> None:
    """USDC at the mainnet mint, payTo's account and the bench's fee payer; serves until killed."""
    chain = setup_usdc_chain(pay_to=Pubkey.from_string(pay_to), fee_payer=FEE_PAYER)
    server = BenchChain(svm=chain.svm, port=port, confirm_delay_s=confirm_ms / 1000)
    server.watch(*chain.addresses)
    server.start()
    threading.Event().wait()


# --- stubs with stated waits ------------------------------------------------------------------


STUB_WAITS: dict[str, dict[str, float]] = {
    "provider": {"*": PROVIDER_WAIT_S},
    "facilitator": {"verify": VERIFY_WAIT_S, "settle": SETTLE_WAIT_S + CONFIRM_S},
}
"""Seconds each stub sleeps before answering, by the last segment of the path (``*``: any)."""


def waiting_app(kind: str) -> web.Application:
    """bench/stubs.py's zero-latency ``kind`` stub, answering after its stated wait."""
    waits = STUB_WAITS[kind]
    app = APPS[kind]()

    @web.middleware
    async def wait(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        delay = waits.get(request.path.rsplit("/", 1)[-1], waits.get("*", 0.0))
        if delay:
            await asyncio.sleep(delay)
        return await handler(request)

    app.middlewares.append(wait)
    return app


# --- the (f) client ---------------------------------------------------------------------------


@dataclass
class Answer:
    """One paid request as the client saw it."""

    status: int
    ms: float
    error: str = ""
    settled: bool = False
    """A PAYMENT-RESPONSE reporting success came with it."""
    transaction: str = ""
    sent_at: float = 0.0
    """``time.monotonic()`` when the request was sent, like the chain's landing times."""
    to_land_ms: float | None = None
    """From sending the request to its transaction landing: the work before the broadcast."""
    after_land_ms: float | None = None
    """From the landing to the answer: the confirmation (600 ms), hearing of it, and the rest."""
    heard_late_ms: float | None = None
    """From the confirmation to the gateway's first ``getSignatureStatuses`` call reporting it."""
    after_heard_ms: float | None = None
    """From that call to the answer: the records, the delivery, the answer's way back."""


@dataclass
class Wallet:
    """A funded wallet paying one route of the gateway, building its payments like
    ``x402-gateway pay``: the challenge read and chosen by the payclient, the transaction built
    by svm_payer against the chain's blockhash and mint."""

    session: aiohttp.ClientSession
    rpc: SolanaRpc
    url: str
    body: bytes
    keypair: Keypair

    async def fund(self, micro_usdc: int) -> None:
        await self.rpc.call("benchFund", [str(self.keypair.pubkey()), micro_usdc], str)

    async def challenge(self) -> tuple[Challenge, PaymentRequirements]:
        headers = {"content-type": "application/json", "accept": "application/json"}
        async with self.session.post(
            self.url, data=self.body, headers=headers, allow_redirects=False
        ) as resp:
            raw = await resp.read()
            if resp.status != 402:
                raise RuntimeError(f"expected a 402 challenge, got {resp.status}: {raw[:200]!r}")
            challenge = parse_challenge({k.lower(): v for k, v in resp.headers.items()}, raw)
        return challenge, choose_requirement(challenge, SpendPolicy(), str(self.keypair.pubkey()))

    async def payments(self, count: int) -> list[tuple[str, str]]:
        """``count`` signed payments (header name, value), each with its own random memo."""
        challenge, requirement = await self.challenge()
        mint: MintInfo = await fetch_mint_info(self.rpc, requirement.asset)
        blockhash = (await self.rpc.get_latest_blockhash()).blockhash
        resource = challenge.resource if isinstance(challenge.resource, ResourceInfo) else None
        signed = []
        for _ in range(count):
            tx = build_exact_transaction(requirement, self.keypair, mint, blockhash)
            payload = build_payment_payload(
                requirement, tx, resource=resource, extensions=payment_identifier(challenge)
            )
            signed.append(payment_header(challenge, payload))
        return signed

    async def pay(self, header: tuple[str, str], forwarded_for: str = "") -> Answer:
        headers = {"content-type": "application/json", "accept": "application/json", header[0]: header[1]}
        if forwarded_for:
            headers["x-forwarded-for"] = forwarded_for
        sent_at = time.monotonic()
        started = time.perf_counter()
        async with self.session.post(
            self.url, data=self.body, headers=headers, allow_redirects=False
        ) as resp:
            raw = await resp.read()
            status, receipt = resp.status, resp.headers.get("payment-response", "")
        ms = (time.perf_counter() - started) * 1000
        answer = Answer(status, round(ms, 3), sent_at=sent_at)
        if receipt:
            try:
                settled = decode_header(receipt, SettleResponse)
                answer.settled, answer.transaction = settled.success, settled.transaction
            except HeaderError:
                answer.error = "unreadable PAYMENT-RESPONSE"
        if status != 200:
            try:
                answer.error = str(json.loads(raw).get("error", ""))
            except (ValueError, AttributeError):
                answer.error = raw[:80].decode(errors="replace")
        return answer

    async def sent(self) -> int:
        count: int = await self.rpc.call("benchSent", [], int)
        return count

    async def timed_landings(self, answers: Sequence[Answer]) -> None:
        """Split each settled answer's latency at its transaction's landing and at the gateway
        hearing of its confirmation."""
        settled = [a for a in answers if a.transaction]
        times = await self.rpc.call(
            "benchTimes", [a.transaction for a in settled], list[tuple[float, float | None] | None]
        )
        for answer, found in zip(settled, times, strict=True):
            if found is None:
                continue
            landed, heard = found
            answer.to_land_ms = round((landed - answer.sent_at) * 1000, 3)
            answer.after_land_ms = round(answer.ms - answer.to_land_ms, 3)
            if heard is not None:
                answer.heard_late_ms = round((heard - landed - CONFIRM_S) * 1000, 3)
                answer.after_heard_ms = round(answer.ms - (heard - answer.sent_at) * 1000, 3)

    async def held_back(self) -> Counter[str]:
        """The gateway's count of settlements its fee guard did not broadcast, by reason."""
        async with self.session.get(self.url.split("/v1/", 1)[0] + "/metrics") as resp:
            text = (await resp.text()) if resp.status == 200 else ""
        counts: Counter[str] = Counter()
        for line in text.splitlines():
            if line.startswith('x402_settlements_held_back_total{reason="'):
                labels, value = line.rsplit(" ", 1)
                counts[labels.split('"')[1]] = int(float(value))
        return counts


async def one_at_a_time(wallet: Wallet, job: dict[str, Any]) -> dict[str, Any]:
    """``warmup + count`` calls in turn, each through the whole pay flow (402, look-ups,
    signing, paid request); the paid request and the whole flow are timed apart."""
    await wallet.fund(WALLET_USDC)
    answers, flows = [], []
    for i in range(int(job["warmup"]) + int(job["count"])):
        started = time.perf_counter()
        (header,) = await wallet.payments(1)
        answer = await wallet.pay(header)
        if i >= int(job["warmup"]):
            answers.append(answer)
            flows.append(round((time.perf_counter() - started) * 1000, 3))
    await wallet.timed_landings(answers)
    return {"answers": [asdict(a) for a in answers], "flows_ms": flows}


async def record_then_burst(wallet: Wallet, job: dict[str, Any]) -> dict[str, Any]:
    """Settle ``record`` payments in turn, then send ``size`` at once."""
    await wallet.fund(WALLET_USDC)
    record, size = int(job["record"]), int(job["size"])
    signed = await wallet.payments(record + size)
    earned = [await wallet.pay(header) for header in signed[:record]]
    before = await wallet.sent()
    burst = await asyncio.gather(*(wallet.pay(header) for header in signed[record:]))
    await wallet.timed_landings(burst)
    return {
        "record": [asdict(a) for a in earned],
        "answers": [asdict(a) for a in burst],
        "sent": await wallet.sent() - before,
    }


async def poor_burst(wallet: Wallet, job: dict[str, Any]) -> dict[str, Any]:
    """A wallet holding exactly one price sends ``size`` payments at once."""
    _, requirement = await wallet.challenge()
    await wallet.fund(int(requirement.amount))
    signed = await wallet.payments(int(job["size"]))
    before, held_before = await wallet.sent(), await wallet.held_back()
    answers = await asyncio.gather(*(wallet.pay(header) for header in signed))
    held = await wallet.held_back()
    held.subtract(held_before)
    return {
        "answers": [asdict(a) for a in answers],
        "sent": await wallet.sent() - before,
        "held_back": {reason: n for reason, n in held.items() if n},
    }


async def drain_race(wallet: Wallet, job: dict[str, Any]) -> dict[str, Any]:
    """One fresh wallet per address in ``job["ips"]`` (forwarded for by the trusted proxy, the
    client's own address), each holding one price, pays it while its own transaction (sent just
    before, landing first) empties its account: the fee payer's lamports lost are the failed
    settlements' fees (nothing can settle)."""
    _, requirement = await wallet.challenge()
    price = int(requirement.amount)
    thief = await wallet.rpc.call("benchFund", [str(Keypair().pubkey()), 0], str)
    racers = []
    for ip in job["ips"]:
        racer = Wallet(wallet.session, wallet.rpc, wallet.url, wallet.body, Keypair())
        account = await racer.rpc.call("benchFund", [str(racer.keypair.pubkey()), price], str)
        (header,) = await racer.payments(1)
        racers.append((racer, header, Pubkey.from_string(account), ip))
    blockhash = (await wallet.rpc.get_latest_blockhash()).blockhash
    await wallet.rpc.call("benchLandDelay", [job["land_delay_s"]], float)
    fee_payer = str(FEE_PAYER.pubkey())
    try:
        before = await wallet.rpc.get_balance(fee_payer)
        for racer, _, account, _ in racers:
            drain = _drain(racer.keypair, account, Pubkey.from_string(thief), price, blockhash)
            await wallet.rpc.send_transaction(drain, skip_preflight=True)
        answers = await asyncio.gather(
            *(racer.pay(header, forwarded_for=ip) for racer, header, _, ip in racers)
        )
        await asyncio.sleep(2 * job["land_delay_s"] + CONFIRM_S)  # every broadcast landed
        lost = before - await wallet.rpc.get_balance(fee_payer)
    finally:
        await wallet.rpc.call("benchLandDelay", [0.0], float)
    return {"answers": [asdict(a) for a in answers], "lost_lamports": lost}


def _drain(owner: Keypair, account: Pubkey, thief: Pubkey, amount: int, blockhash: str) -> str:
    """The owner's own transaction moving ``amount`` out of ``account`` (base64, paying its fee)."""
    instruction = transfer_checked_instruction(
        source=account,
        mint=USDC_MAINNET_MINT,
        destination=thief,
        authority=owner.pubkey(),
        amount=amount,
        decimals=6,
    )
    message = MessageV0.try_compile(owner.pubkey(), [instruction], [], Hash.from_string(blockhash))
    return base64.b64encode(bytes(VersionedTransaction(message, [owner]))).decode()


PHASES: dict[str, Callable[[Wallet, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "single": one_at_a_time,
    "burst": record_then_burst,
    "poor": poor_burst,
    "drain": drain_race,
}


async def run_client(job: dict[str, Any]) -> dict[str, Any]:
    """One phase from one fresh wallet and one client IP; reports what other processes used."""
    connector = aiohttp.TCPConnector(limit=64, local_addr=(job["local_ip"], 0))
    timeout = aiohttp.ClientTimeout(total=60)
    own_pids = [int(p) for p in job.get("own_pids", [])]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        rpc = SolanaRpc(job["chain"], session)
        wallet = Wallet(session, rpc, job["url"], job["body"].encode(), Keypair())
        busy, ours, started = machine_busy_s(), own_ticks(own_pids), time.perf_counter()
        result = await PHASES[job["kind"]](wallet, job)
        seconds = time.perf_counter() - started
        foreign = (machine_busy_s() - busy) - (own_ticks(own_pids) - ours) / CLK_TCK
    result["seconds"] = round(seconds, 3)
    result["foreign_cpu_pct"] = round(max(foreign, 0.0) / seconds * 100, 1) if seconds else 0.0
    return result


# --- driving the scenarios (called by bench/run.py) ------------------------------------------


def run_pace_scenarios(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server], only: str) -> None:
    """Scenarios (f) and (g), those named in ``only``."""
    if "f" in only:
        run_chain_pace(bench, servers, stubs)
    if "g" in only:
        run_waits(bench, servers, stubs)


def run_chain_pace(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    quick = bench.profile.name == "quick"
    print(
        f"(f) settlement at the chain's pace: internal facilitator, a chain confirming "
        f"{CONFIRM_S * 1000:.0f} ms after landing",
        flush=True,
    )
    chain_args = ("bench.settlement_pace", "chain", "{port}", str(int(CONFIRM_S * 1000)), PAY_TO)
    chain = python_server("chain", chain_args, CLIENT_CPU if bench.pin else None, hypercorn=False)
    gateway = python_server("pace gateway", GATEWAY_ARGS, SERVER_CPU if bench.pin else None, hypercorn=True)
    with tempfile.TemporaryDirectory(prefix="x402-bench-pace-routes-") as tmp:
        env = gateway_env(gateway.port, stubs, bench_routes_file(Path(tmp)), "WARNING")
        for unused in (
            "FACILITATOR_API_KEY_ID",
            "FACILITATOR_API_KEY_SECRET",
            "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC",
        ):
            env.pop(unused)
        env.update(
            FACILITATOR_URL="internal",
            FACILITATOR_WALLET_BASE58=_base58(FEE_PAYER),
            SOLANA_MAINNET_RPC_URL=chain.url,
            SOLANA_DEVNET_RPC_URL=chain.url,
            STATE_STORE_REST_URL=redis_url(servers, REDIS_DATABASES["pace"]),
            # The drain race's client speaks for its wallets' addresses as a proxy would.
            TRUSTED_PROXIES="127.0.0.0/8",
        )
        gateway.env = env
        with started(bench, [chain, gateway], ["/", "/healthz"]):
            base = {"url": gateway.url + PAID_PATH, "chain": chain.url, "body": RPC_BODY}
            single = {"kind": "single", "warmup": 2, "count": 20 if quick else 50}
            rounds = 3 if quick else 5
            drain = {"kind": "drain", "land_delay_s": DRAIN_LAND_DELAY_S}
            drain_rounds = 2 if quick else 3
            results = {
                ONE_AT_A_TIME: [_client(bench, {**base, **single})],
                RECORD_BURST: [
                    _client(bench, {**base, "kind": "burst", "record": RECORD, "size": BURST})
                    for _ in range(rounds)
                ],
                POOR: [_client(bench, {**base, "kind": "poor", "size": POOR_BURST}) for _ in range(3)],
                # Fresh addresses each round: a round's failure cools its IP down for 10 minutes.
                DRAIN_V4: [
                    _client(bench, {**base, **drain, "ips": [f"203.0.113.{10 + r}"] * DRAIN_WALLETS})
                    for r in range(drain_rounds)
                ],
                DRAIN_V6: [_client(bench, {**base, **drain, "ips": _one_64(r)}) for r in range(drain_rounds)],
            }
    _record_pace(bench, results)


def _one_64(n: int) -> list[str]:
    """``DRAIN_WALLETS`` addresses of the ``n``-th /64, each in its own /80."""
    return [f"2001:db8:{n + 1:x}:1:{i:x}::1" for i in range(DRAIN_WALLETS)]


def _client(bench: Bench, job: dict[str, Any]) -> dict[str, Any]:
    """One (f) client process, pinned with the load generators, on a fresh client IP."""
    job = {**job, "local_ip": bench.next_ip(), "own_pids": bench.own_pids}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.settlement_pace", "client", json.dumps(job)],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=pinner(CLIENT_CPU if bench.pin else None),
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"(f) client failed for {job['kind']}:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    answers = [Answer(**a) for a in result["answers"]]
    statuses = Counter(a.status for a in answers)
    slowest = max(a.ms for a in answers)
    line = f"  {PACE:<9} {job['kind']:<7} {len(answers)} answers {dict(statuses)}  slowest {slowest:.0f} ms"
    if "sent" in result:
        line += f"  {result['sent']} transaction(s) sent"
    if result["foreign_cpu_pct"] > 5:
        line += f"  (other processes: {result['foreign_cpu_pct']:.0f}% CPU)"
    print(line, flush=True)
    return result


def _base58(keypair: Keypair) -> str:
    import base58

    return base58.b58encode(bytes(keypair)).decode("ascii")


def _record_pace(bench: Bench, results: dict[str, list[dict[str, Any]]]) -> None:
    """Fold each phase's rounds into one row of the report (the raw rounds kept with it)."""
    confirm_ms = CONFIRM_S * 1000
    (single,) = results[ONE_AT_A_TIME]
    answers = [Answer(**a) for a in single["answers"]]
    latencies = sorted(a.ms for a in answers)
    flows = sorted(single["flows_ms"])
    bench.rows.append(
        Row(
            PACE,
            ONE_AT_A_TIME,
            1,
            {
                "requests": len(answers),
                "p50_ms": percentile(latencies, 50),
                "p99_ms": percentile(latencies, 99),
                "max_ms": latencies[-1],
                "p50_over_ms": round(percentile(latencies, 50) - confirm_ms, 1),
                "p99_over_ms": round(percentile(latencies, 99) - confirm_ms, 1),
                "flow_p50_ms": percentile(flows, 50),
                "to_land_p50_ms": _p50([a.to_land_ms for a in answers]),
                "after_land_p50_ms": _p50([a.after_land_ms for a in answers]),
                "heard_late_p50_ms": _p50([a.heard_late_ms for a in answers]),
                "after_heard_p50_ms": _p50([a.after_heard_ms for a in answers]),
                "statuses": _statuses(answers),
                "unexpected": sum(1 for a in answers if a.status != 200 or not a.settled),
                "foreign_cpu_pct": single["foreign_cpu_pct"],
            },
        )
    )
    rounds = []
    for found in results[RECORD_BURST]:
        burst = [Answer(**a) for a in found["answers"]]
        earned = [Answer(**a) for a in found["record"]]
        rounds.append(
            {
                "confirm_to_last_ms": _confirm_to_last_ms(burst),
                "slowest_ms": max(a.ms for a in burst),
                "fastest_ms": min(a.ms for a in burst),
                "to_land_max_ms": max((a.to_land_ms for a in burst if a.to_land_ms is not None), default=0.0),
                "after_land_max_ms": max(
                    (a.after_land_ms for a in burst if a.after_land_ms is not None), default=0.0
                ),
                "statuses": _statuses(burst),
                "settled": sum(a.settled for a in burst),
                "sent": found["sent"],
                "record_settled": sum(a.settled for a in earned),
                "heard_late_max_ms": max(
                    (a.heard_late_ms for a in burst if a.heard_late_ms is not None), default=0.0
                ),
                "answers_ms": sorted((a.ms, a.to_land_ms, a.heard_late_ms) for a in burst),
                "record_ms": [a.ms for a in earned],
                "unexpected": sum(1 for a in [*burst, *earned] if a.status != 200 or not a.settled),
                "foreign_cpu_pct": found["foreign_cpu_pct"],
            }
        )
    slowest = [r["slowest_ms"] for r in rounds]
    bench.rows.append(
        Row(
            PACE,
            RECORD_BURST,
            BURST,
            {
                "rounds": rounds,
                "slowest_over_ms": round(max(slowest) - confirm_ms, 1),
                "median_slowest_over_ms": round(statistics.median(slowest) - confirm_ms, 1),
                "confirm_to_last_ms": max(r["confirm_to_last_ms"] for r in rounds),
                "median_confirm_to_last_ms": statistics.median(r["confirm_to_last_ms"] for r in rounds),
                "unexpected": sum(r["unexpected"] for r in rounds),
                "foreign_cpu_pct": max(r["foreign_cpu_pct"] for r in rounds),
            },
        )
    )
    poor = []
    for found in results[POOR]:
        answers = [Answer(**a) for a in found["answers"]]
        refused = [a for a in answers if a.status != 200]
        poor.append(
            {
                "sent": found["sent"],
                "statuses": _statuses(answers),
                "settled": sum(a.settled for a in answers),
                "errors": dict(Counter(a.error for a in refused)),
                "held_back": found["held_back"],
                "first_refusal_ms": min((a.ms for a in refused), default=0.0),
                "slowest_ms": max(a.ms for a in answers),
                "foreign_cpu_pct": found["foreign_cpu_pct"],
            }
        )
    for target in (DRAIN_V4, DRAIN_V6):
        if target in results:
            _record_drain(bench, target, results[target])
    bench.rows.append(
        Row(
            PACE,
            POOR,
            POOR_BURST,
            {
                "rounds": poor,
                "unexpected": sum(1 for r in poor if r["sent"] != 1 or r["settled"] != 1),
                "foreign_cpu_pct": max(r["foreign_cpu_pct"] for r in poor),
            },
        )
    )


def _confirm_to_last_ms(burst: Sequence[Answer]) -> float:
    """From the chain's first confirmation of the burst's transactions to its last answer: a
    settlement held for a second round shows here (its answer comes a round later), where each
    answer timed from its own transaction's confirmation would hide it."""
    landed = [a.sent_at + a.to_land_ms / 1000 for a in burst if a.to_land_ms is not None]
    if not landed:
        return float("nan")
    last = max(a.sent_at + a.ms / 1000 for a in burst)
    return round((last - (min(landed) + CONFIRM_S)) * 1000, 1)


def _record_drain(bench: Bench, target: str, found: Sequence[dict[str, Any]]) -> None:
    """The drain race's rounds: the fee payer's lamports lost, and what the wallets were told."""
    rounds = []
    for result in found:
        answers = [Answer(**a) for a in result["answers"]]
        rounds.append(
            {
                "lost_lamports": result["lost_lamports"],
                "statuses": _statuses(answers),
                "errors": dict(Counter(a.error for a in answers)),
                "settled": sum(a.settled for a in answers),
                "foreign_cpu_pct": result["foreign_cpu_pct"],
            }
        )
    bench.rows.append(
        Row(
            PACE,
            target,
            DRAIN_WALLETS,
            {
                "rounds": rounds,
                "lost_lamports": max(r["lost_lamports"] for r in rounds),
                "unexpected": sum(r["settled"] for r in rounds),
                "foreign_cpu_pct": max(r["foreign_cpu_pct"] for r in rounds),
            },
        )
    )


def _p50(values: Sequence[float | None]) -> float:
    return percentile(sorted(v for v in values if v is not None), 50)


def _statuses(answers: Sequence[Answer]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(a.status for a in answers).items())}


def run_waits(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    p = bench.profile
    counts = (3, 15) if p.name == "quick" else (5, 40)
    limit = PHYSICAL_LIMIT_MS
    print(
        f"(g) realistic waits: provider 50 ms, verify 30 ms, settle 100 + 600 ms "
        f"(physical limit {limit:.0f} ms)",
        flush=True,
    )
    server_cpus = SERVER_CPU if bench.pin else None
    provider, facilitator = waits_stubs(bench)
    gateway = python_server("waits gateway", GATEWAY_ARGS, server_cpus, hypercorn=True)
    serve = ("bench.serve", "--port", "{port}")
    peer = python_server(PEER_WAITS, (*serve, "bench.apps:peer_app()"), server_cpus, hypercorn=True)
    floor = python_server(FLOOR_WAITS, (*serve, "bench.apps:io_floor_app()"), server_cpus, hypercorn=True)
    waiting = {"provider": provider, "asset": stubs["asset"], "facilitator": facilitator}
    with tempfile.TemporaryDirectory(prefix="x402-bench-waits-routes-") as tmp:
        env = gateway_env(gateway.port, waiting, bench_routes_file(Path(tmp)), "WARNING")
        env["STATE_STORE_REST_URL"] = redis_url(servers, REDIS_DATABASES["waits"])
        gateway.env = env
        apps_env = {
            "BENCH_PROVIDER_URL": provider.url + PROVIDER_PATH,
            "BENCH_FACILITATOR_URL": facilitator.url + FACILITATOR_BASE_PATH,
            "BENCH_PAY_TO": PAY_TO,
        }
        peer.env = {**peer.env, **apps_env}
        floor.env = {**floor.env, **apps_env, "BENCH_REDIS_URL": redis_url(servers, REDIS_DATABASES["floor"])}
        processes = [provider, facilitator, gateway, peer, floor]
        with started(bench, processes, ["/", "/", "/healthz", "/", "/"]):
            challenge = challenge_of(gateway.url + PAID_PATH)
            fac_body = verify_body(challenge)
            x402 = FACILITATOR_BASE_PATH
            specs = [
                (
                    static_job(provider.url, "POST", PROVIDER_PATH, RPC_BODY, 1, counts, 200),
                    WAITS,
                    DIRECT_PROVIDER,
                    None,
                ),
                (
                    static_job(facilitator.url, "POST", x402 + "/verify", fac_body, 1, counts, 200),
                    WAITS,
                    DIRECT_VERIFY,
                    None,
                ),
                (
                    static_job(facilitator.url, "POST", x402 + "/settle", fac_body, 1, counts, 200),
                    WAITS,
                    DIRECT_SETTLE,
                    None,
                ),
                (paid_job(gateway.url, PAID_PATH, challenge, 1, counts), WAITS, GATEWAY_WAITS, gateway),
                (paid_job(floor.url, PAID_PATH, challenge, 1, counts), WAITS, FLOOR_WAITS, floor),
                (
                    paid_job(peer.url, PEER_PATH, challenge_of(peer.url + PEER_PATH), 1, counts),
                    WAITS,
                    PEER_WAITS,
                    peer,
                ),
            ]
            bench.load_rounds(specs, p.rounds)


# --- report (called by bench/run.py) ----------------------------------------------------------


def _find(bench: Bench, scenario: str, target: str) -> dict[str, Any] | None:
    for row in bench.rows:
        if (row.scenario, row.target) == (scenario, target):
            return row.result
    return None


def _met(ok: bool, row: dict[str, Any]) -> str:
    found = "met" if ok else "**NOT met**"
    return found + (" (disturbed measurement)" if row["foreign_cpu_pct"] > 5 else "")


def pace_summary(bench: Bench) -> list[str]:
    """The summary table's lines for (f) and (g), one per target."""
    lines = []
    single = _find(bench, PACE, ONE_AT_A_TIME)
    if single is not None:
        lines.append(
            f"| chain pace (f): paid call at c=1 minus the chain's {CONFIRM_S * 1000:.0f} ms "
            "confirmation, p50 / p99 "
            f"| {single['p50_over_ms']:.0f} / {single['p99_over_ms']:.0f} ms "
            f"| p50 <= {PACE_TARGET_MS:.0f} ms: {_met(single['p50_over_ms'] <= PACE_TARGET_MS, single)} |"
        )
    burst = _find(bench, PACE, RECORD_BURST)
    if burst is not None:
        rounds = burst["rounds"]
        ok = burst["slowest_over_ms"] <= BURST_TARGET_MS and all(r["settled"] == BURST for r in rounds)
        lines.append(
            f"| chain pace (f): {BURST} at once from a wallet with {RECORD} settled, slowest answer minus "
            f"{CONFIRM_S * 1000:.0f} ms, worst of {len(rounds)} rounds (median) "
            f"| {burst['slowest_over_ms']:.0f} ms ({burst['median_slowest_over_ms']:.0f}); "
            f"{sum(r['settled'] for r in rounds)}/{BURST * len(rounds)} settled "
            f"| <= {BURST_TARGET_MS:.0f} ms: {_met(ok, burst)} |"
        )
    if burst is not None:
        ok = burst["confirm_to_last_ms"] <= BURST_TARGET_MS
        lines.append(
            f"| chain pace (f): {BURST} at once from a wallet with {RECORD} settled, the chain's first "
            f"confirmation to the last answer, worst of {len(burst['rounds'])} rounds (median) "
            f"| {burst['confirm_to_last_ms']:.0f} ms ({burst['median_confirm_to_last_ms']:.0f}) "
            f"| <= {BURST_TARGET_MS:.0f} ms: {_met(ok, burst)} |"
        )
    v4, v6 = _find(bench, PACE, DRAIN_V4), _find(bench, PACE, DRAIN_V6)
    if v4 is not None and v6 is not None:
        ok = v6["lost_lamports"] <= v4["lost_lamports"] and not v4["unexpected"] + v6["unexpected"]
        per_round = ", ".join(str(r["lost_lamports"]) for r in v6["rounds"])
        lines.append(
            f"| chain pace (f): drain race, {DRAIN_WALLETS} fresh wallets at once, fee payer's lamports "
            f"lost per round: one IPv6 /64 ({per_round}) vs one IPv4 address (worst) "
            f"| {v6['lost_lamports']} vs {v4['lost_lamports']} "
            f"| /64 <= IPv4: {_met(ok, v4 if v4['foreign_cpu_pct'] > v6['foreign_cpu_pct'] else v6)} |"
        )
    poor = _find(bench, PACE, POOR)
    if poor is not None:
        sent = ", ".join(str(r["sent"]) for r in poor["rounds"])
        lines.append(
            f"| chain pace (f): {POOR_BURST} at once from a wallet that affords one, "
            "transactions sent per round "
            f"| {sent} | exactly 1: {_met(poor['unexpected'] == 0, poor)} |"
        )
    gateway, peer, floor = (_find(bench, WAITS, name) for name in (GATEWAY_WAITS, PEER_WAITS, FLOOR_WAITS))
    if gateway is not None:
        share = gateway["p50_ms"] / PHYSICAL_LIMIT_MS
        lines.append(
            f"| realistic waits (g): gateway p50 / physical limit ({PHYSICAL_LIMIT_MS:.0f} ms) "
            f"| {share:.3f} ({gateway['p50_ms']:.1f} ms) "
            f"| <= {WAITS_TARGET:.2f}: {_met(share <= WAITS_TARGET, gateway)} |"
        )
        measured = _measured_limit(bench)
        if measured:
            lines.append(
                "| realistic waits (g): gateway p50 / the direct round trips' p50s summed "
                f"({measured:.1f} ms) "
                f"| {gateway['p50_ms'] / measured:.3f} | |"
            )
        if peer is not None:
            lines.append(
                f"| realistic waits (g): gateway p50 / peer SDK p50 ({peer['p50_ms']:.1f} ms; "
                f"{peer['p50_ms'] / PHYSICAL_LIMIT_MS:.3f} of the limit) "
                f"| {gateway['p50_ms'] / peer['p50_ms']:.3f} | |"
            )
        if floor is not None:
            lines.append(
                "| realistic waits (g): I-O floor p50 / physical limit "
                f"| {floor['p50_ms'] / PHYSICAL_LIMIT_MS:.3f} "
                f"({floor['p50_ms']:.1f} ms) | |"
            )
    return lines


def _measured_limit(bench: Bench) -> float:
    found = [_find(bench, WAITS, name) for name in DIRECTS]
    return sum(float(r["p50_ms"]) for r in found if r is not None) if all(found) else 0.0


def pace_report(bench: Bench) -> list[str]:
    """The report's sections for (f) and (g) (nothing for a scenario that did not run)."""
    out: list[str] = []
    if _find(bench, PACE, ONE_AT_A_TIME) is not None:
        out += ["", *_pace_section(bench)]
    if _find(bench, WAITS, GATEWAY_WAITS) is not None:
        out += ["", *_waits_section(bench)]
    return out


def _pace_section(bench: Bench) -> list[str]:
    confirm = CONFIRM_S * 1000
    single = _find(bench, PACE, ONE_AT_A_TIME)
    burst = _find(bench, PACE, RECORD_BURST)
    poor = _find(bench, PACE, POOR)
    assert single is not None and burst is not None and poor is not None
    out = [
        "## (f) settlement at the chain's pace",
        "",
        "`x402-gateway serve --workers 1` with `FACILITATOR_URL=internal` on Redis, settling on a LiteSVM "
        f"chain in its own process that reports a landed transaction `confirmed` {confirm:.0f} ms after it "
        "lands (`LiteSvmRpcServer(confirm_delay_s=0.6)`); zero-latency provider. The client pays as "
        "`x402-gateway pay` does (the payclient's challenge parsing and requirement choice, svm_payer's "
        "builder, the chain's blockhash) from a fresh wallet and client IP per phase; a latency runs from "
        "sending PAYMENT-SIGNATURE to the 200 with a successful PAYMENT-RESPONSE. `over` = minus the "
        f"chain's {confirm:.0f} ms.",
        "",
        "| phase | answers | p50 ms | p99 ms | max ms | p50 over | p99 over | to landing p50 "
        "| landing to answer p50 | heard late p50 | after hearing p50 | whole pay flow p50 ms "
        "| other CPU % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {ONE_AT_A_TIME} ({single['requests']} calls after 2 warm-up) | {_counts(single['statuses'])} "
        f"| {single['p50_ms']:.1f} | {single['p99_ms']:.1f} | {single['max_ms']:.1f} "
        f"| {single['p50_over_ms']:.1f} "
        f"| {single['p99_over_ms']:.1f} | {single['to_land_p50_ms']:.1f} | {single['after_land_p50_ms']:.1f} "
        f"| {single['heard_late_p50_ms']:.1f} | {single['after_heard_p50_ms']:.1f} "
        f"| {single['flow_p50_ms']:.1f} | {single['foreign_cpu_pct']:.0f} |",
        "",
        "`to landing`: from sending the paid request to its transaction landing on the chain (verify, "
        "provider, the settlement's checks and broadcast); `landing to answer`: the chain's "
        f"{confirm:.0f} ms, the time the gateway takes to hear of the confirmation, and what follows "
        "(records, the answer); `heard late`: from the confirmation to the gateway's first "
        "`getSignatureStatuses` call that reports it (the poll schedule's lag); `after hearing`: from "
        "that call to the answer. `whole pay flow`: the 402, the look-ups, signing and the paid request, "
        "as `x402-gateway pay` does them.",
        "",
        f"{BURST} at once from a wallet (and client IP) that settled {RECORD} payments just before, in turn: "
        f"its record allows {1 + 2 * RECORD} settlements in flight. One row per round.",
        "",
        "| round | answers | settled | transactions sent | fastest ms | slowest ms | slowest over "
        "| first confirmation to last answer ms "
        "| latest landing ms | longest landing to answer ms | longest heard late ms | other CPU % |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in enumerate(burst["rounds"], 1):
        out.append(
            f"| {n} | {_counts(r['statuses'])} | {r['settled']} | {r['sent']} | {r['fastest_ms']:.1f} "
            f"| {r['slowest_ms']:.1f} | {r['slowest_ms'] - confirm:.1f} | {r['confirm_to_last_ms']:.1f} "
            f"| {r['to_land_max_ms']:.1f} "
            f"| {r['after_land_max_ms']:.1f} | {r['heard_late_max_ms']:.1f} | {r['foreign_cpu_pct']:.0f} |"
        )
    out += [
        "",
        f"{POOR_BURST} at once from a fresh wallet (and client IP) holding exactly one price. "
        "One row per round.",
        "",
        "| round | transactions sent | answers | refusals (error) | held back by the fee guard "
        "| first refusal ms | slowest ms | other CPU % |",
        "|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for n, r in enumerate(poor["rounds"], 1):
        errors = ", ".join(f"{v} {k}" for k, v in sorted(r["errors"].items())) or "none"
        held = ", ".join(f"{v} {k}" for k, v in sorted(r["held_back"].items())) or "none"
        out.append(
            f"| {n} | {r['sent']} | {_counts(r['statuses'])} | {errors} | {held} "
            f"| {r['first_refusal_ms']:.1f} | {r['slowest_ms']:.1f} | {r['foreign_cpu_pct']:.0f} |"
        )
    drains = [(t, _find(bench, PACE, t)) for t in (DRAIN_V4, DRAIN_V6)]
    if all(found is not None for _, found in drains):
        out += [
            "",
            f"The drain race from shared networks: {DRAIN_WALLETS} fresh wallets, each holding one price, "
            "each pays while its own transaction (sent just before) empties its account; the chain lands "
            f"broadcasts {DRAIN_LAND_DELAY_S * 1000:.0f} ms after their preflight, so a settlement "
            "broadcast before the drains land fails on chain at the fee payer's expense. The client speaks "
            "for the wallets' addresses as a trusted proxy does (`X-Forwarded-For`). One row per round, "
            "each on fresh addresses.",
            "",
            "| addresses | round | fee payer lamports lost | answers | errors | other CPU % |",
            "|---|---:|---:|---|---|---:|",
        ]
        for target, found in drains:
            assert found is not None
            for n, r in enumerate(found["rounds"], 1):
                errors = ", ".join(f"{v} {k}" for k, v in sorted(r["errors"].items())) or "none"
                out.append(
                    f"| {target.split(' on ', 1)[1]} | {n} | {r['lost_lamports']} | {_counts(r['statuses'])} "
                    f"| {errors} | {r['foreign_cpu_pct']:.0f} |"
                )
    return out


def _counts(statuses: dict[str, int]) -> str:
    return ", ".join(f"{v} x {k}" for k, v in statuses.items())


def _waits_section(bench: Bench) -> list[str]:
    limit = PHYSICAL_LIMIT_MS
    out = [
        "## (g) the paid path with realistic waits",
        "",
        f"Loopback stubs that sleep before answering: the provider {PROVIDER_WAIT_S * 1000:.0f} ms, the "
        f"facilitator's /verify {VERIFY_WAIT_S * 1000:.0f} ms and its /settle "
        f"{(SETTLE_WAIT_S + CONFIRM_S) * 1000:.0f} ms ({SETTLE_WAIT_S * 1000:.0f} ms plus a "
        f"{CONFIRM_S * 1000:.0f} ms confirmation). The physical limit is their sum, {limit:.0f} ms: a paid "
        "request verifies before calling the provider and settles after it answered. The gateway "
        "(`serve --workers 1`, Redis), the I-O floor (the same round trips and three Redis commands, no "
        "checks) and the reference SDK's middleware run on the same stubs, c=1, median of "
        f"{bench.profile.rounds} interleaved rounds.",
        "",
        "| target | requests | p50 ms | p99 ms | mean ms | p50 / limit | other CPU % | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in bench.rows:
        if row.scenario != WAITS:
            continue
        r = row.result
        share = "" if row.target in DIRECTS else f"{r['p50_ms'] / limit:.3f}"
        out.append(
            f"| {row.target} | {r['requests']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['mean_ms']:.1f} "
            f"| {share} | {r['foreign_cpu_pct']:.0f} | {r['unexpected']} |"
        )
    measured = _measured_limit(bench)
    if measured:
        out += [
            "",
            f"The direct round trips' p50s add up to {measured:.1f} ms (the stated waits: {limit:.0f} ms).",
        ]
    return out


# --- entry points -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    chain = sub.add_parser("chain")
    chain.add_argument("port", type=int)
    chain.add_argument("confirm_ms", type=int)
    chain.add_argument("pay_to")
    stub = sub.add_parser("stub")
    stub.add_argument("kind", choices=sorted(STUB_WAITS))
    stub.add_argument("port", type=int)
    client = sub.add_parser("client")
    client.add_argument("job")
    args = parser.parse_args()
    if args.command == "chain":
        serve_chain(args.port, args.confirm_ms, args.pay_to)
    elif args.command == "stub":
        web.run_app(waiting_app(args.kind), host="127.0.0.1", port=args.port, access_log=None, print=None)
    else:
        print(json.dumps(asyncio.run(run_client(json.loads(args.job)))))


if __name__ == "__main__":
    main()
