"""The internal facilitator: verify and settle exact Solana payments with our own fee-payer wallet.

``verify`` = the pure rules of :mod:`gateway.x402.svm` + ``simulateTransaction``; nothing is sent.
``settle`` = verify again, take the payer's lock, simulate against the latest (``processed``)
state, claim the payment in the shared store, sign slot 0, broadcast with preflight, and wait
for the confirmation (polled at the chain's pace, see :mod:`gateway.methods.exact.confirmations`).
The fee payer pays for every transaction that lands, failed ones included, so nothing likely to
fail is broadcast: one settlement per payer token account is in flight at a time (a short lock in
the shared store, so replicas agree; a second payment from that account waits up to
``payer_wait_s``, then is answered ``settlement_pending`` with nothing broadcast, so the gateway's
client retries), and the simulation runs with that lock held.

State lives in the :class:`~gateway.store.Store` (never in process memory)
under the payment's message hash, so several gateway processes share one duplicate guard:

* record ``pending`` (written atomically, with the signature, *before* broadcasting);
  a settle that finds it reconciles against that signature (``getSignatureStatuses``) and never
  broadcasts again; a confirmation timeout answers ``settlement_pending``;
* record ``settled``: any later settle of the same payment answers ``duplicate_settlement`` with
  the original signature in ``transaction``. We chose the refusal over replaying the success: a
  settle is the authority to charge for one delivery, the x402 SDKs and conformance checks
  expect a second settle to be refused, and the signature still lets an honest caller that
  lost the first answer reconcile;
* record ``failed``: the transaction failed on chain or was refused by the node; the client must
  sign a new payment.

Several settles may watch one pending signature (a retry, another process); when it confirms,
an atomic claim of ``<key>:done`` lets exactly one of them answer ``success``; the others answer
``duplicate_settlement``. So one payment is broadcast once and reported settled once.

A broadcast whose confirmation wait passed is followed on (:meth:`ConfirmationWatcher.follow`)
until it lands or its blockhash expires, its places in flight held meanwhile: a late failure
cools its payer down as one found in time does. Its outcome is counted for the fee guard once: a
landing by the settle that broadcast it or its follow-up, a failure by whichever settle or
follow-up hears it first (a claim keyed by its signature).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import aiohttp
import msgspec
from solders.keypair import Keypair
from solders.token.state import TokenAccount

from gateway.facilitators.fee_payer_metrics import (
    BALANCE_REFRESH_S,
    FEE_PAYER_BALANCE,
    SETTLEMENT_FEES,
    SETTLEMENTS_HELD_BACK,
)
from gateway.facilitators.http import FacilitatorUnavailable
from gateway.methods.exact.confirmations import ConfirmationWatcher, LateOutcome, PollSchedule
from gateway.methods.exact.fee_guard import Counted, FeeGuard, Funds, Party, account_funds
from gateway.outbound.client import UpstreamClient
from gateway.outbound.solana_rpc import RpcResponseError, RpcUnavailable, SignatureStatus, SolanaRpc
from gateway.store import keys
from gateway.store.base import Hold, Store
from gateway.telemetry.logs import log_event
from gateway.x402.svm import (
    ExactCheck,
    ExactPolicy,
    Reason,
    check_exact_payment,
    encode_transaction,
    normalize_network,
    parse_wallet,
    payment_key,
    sign_as_fee_payer,
    transaction_signature,
    transfer_source,
)
from gateway.x402.types import (
    SCHEME_EXACT,
    SOLANA_DEVNET,
    SOLANA_MAINNET,
    PaymentPayload,
    PaymentRequirements,
    SettleResponse,
    SupportedKind,
    SupportedResponse,
    VerifyResponse,
)

TOKEN_ACCOUNT_SIZE = 165
_COOLING = (
    "a settlement of this payer, its token account or its client failed on chain recently; "
    "nothing was broadcast, pay again later"
)
_UNFUNDED = "the token account's confirmed balance does not cover the amount; nothing was broadcast"
_BUSY = "this payer's settlements in flight fill its allowance; nothing was broadcast, settle again"
_HELD_BACK: dict[str, tuple[Reason, str]] = {
    "cooling_down": (Reason.INVALID_TRANSACTION_STATE, _COOLING),
    "in_flight": (Reason.SETTLEMENT_PENDING, _BUSY),
    "insufficient_funds": (Reason.INSUFFICIENT_FUNDS, _UNFUNDED),
}
"""How a settlement the fee guard held back is answered (nothing was broadcast)."""
RPC_UPSTREAM_NAMES = {SOLANA_MAINNET: "solana_mainnet_rpc", SOLANA_DEVNET: "solana_devnet_rpc"}
"""The nodes' names in the upstream metrics (their URLs carry keys: never a label)."""


class SettlementRecord(msgspec.Struct, frozen=True):
    """What the store remembers about one payment (keyed by its message hash)."""

    state: Literal["pending", "settled", "failed"]
    signature: str
    network: str
    payer: str
    amount: str
    error: str | None = None


_record_decoder = msgspec.json.Decoder(SettlementRecord)
_encoder = msgspec.json.Encoder()


@dataclasses.dataclass(frozen=True, slots=True)
class _Counting:
    """What a settle counts once it hears its payment's outcome: the fee it costs our fee payer,
    its parties, and, for the settle that broadcast it, how to free their places in flight (a
    broadcast whose wait passed keeps them until a follow-up learns its outcome)."""

    fee_lamports: int
    parties: Sequence[Party]
    blockhash: str
    release: Callable[[], Awaitable[None]] | None = None
    broadcaster: bool = False
    """This settle broadcast it: it alone (or its follow-up) counts a landing."""


class LocalFacilitator:
    """:class:`gateway.facilitators.http.Facilitator` backed by our own Solana fee-payer wallet."""

    def __init__(
        self,
        wallet: Keypair,
        store: Store,
        *,
        mainnet_rpc_url: str,
        devnet_rpc_url: str | None = None,
        url: str = "",
        session: aiohttp.ClientSession | UpstreamClient | None = None,
        policy: ExactPolicy | None = None,
        rpc_timeout_s: float = 10.0,
        poll_schedule: PollSchedule | None = None,
        confirm_timeout_s: float = 30.0,
        record_ttl_s: float = 900.0,
        payer_wait_s: float = 5.0,
        guard: FeeGuard | None = None,
    ) -> None:
        """``url`` is the public URL advertised in challenges (no credentials).

        ``record_ttl_s`` must outlive a blockhash (60-90 s): after it, the same transaction can
        no longer land, so forgetting it is safe. ``payer_wait_s`` is how long a settlement
        waits for another one from the same payer token account to finish.
        """
        self.url = url
        self._wallet = wallet
        self._address = str(wallet.pubkey())
        self._store = store
        self._policy = policy or ExactPolicy()
        self._http = UpstreamClient(session, timeout_s=rpc_timeout_s)
        """The one session its nodes' clients share (each names its node in the metrics)."""
        self._rpc_timeout_s = rpc_timeout_s
        self._rpc_urls: dict[str, str] = {SOLANA_MAINNET: mainnet_rpc_url}
        if devnet_rpc_url:
            self._rpc_urls[SOLANA_DEVNET] = devnet_rpc_url
        self._rpcs: dict[str, SolanaRpc] = {}
        self._watchers: dict[str, ConfirmationWatcher] = {}
        self._poll_schedule = poll_schedule or PollSchedule()
        self._confirm_timeout_s = confirm_timeout_s
        self._record_ttl_ms = int(record_ttl_s * 1000)
        self._payer_wait_s = payer_wait_s
        # A place in flight is held from before the simulation until the outcome is known; it
        # lapses by itself if its holder dies, after longer than any confirmation wait.
        # A place in flight is held from before the simulation until the outcome is known (by
        # a late follow-up too); it lapses by itself if its holder dies, only once the
        # transaction can no longer land.
        self._guard = guard or FeeGuard(
            store, hold_ttl_s=confirm_timeout_s + self._poll_schedule.follow_max_s + 30.0
        )
        self._balance_read_at = float("-inf")

    def __repr__(self) -> str:
        return f"LocalFacilitator(fee_payer={self._address}, networks={self.networks})"

    @property
    def fee_payer(self) -> str:
        return self._address

    @property
    def networks(self) -> list[str]:
        return list(self._rpc_urls)

    async def close(self) -> None:
        for watcher in self._watchers.values():
            await watcher.close()
        self._watchers.clear()
        await self._http.close()

    def _rpc_for(self, network: str | None) -> SolanaRpc:
        """The RPC client of ``network`` (its session is opened at its first call, in the loop)."""
        network = network if network in self._rpc_urls else SOLANA_MAINNET
        rpc = self._rpcs.get(network)
        if rpc is None:
            rpc = SolanaRpc(
                self._rpc_urls[network],
                self._http,
                timeout_s=self._rpc_timeout_s,
                upstream=RPC_UPSTREAM_NAMES[network],
            )
            self._rpcs[network] = rpc
        return rpc

    def _watcher(self, network: str | None) -> ConfirmationWatcher:
        """The one confirmation watcher of ``network``'s node in this process."""
        network = network if network in self._rpc_urls else SOLANA_MAINNET
        rpc = self._rpc_for(network)
        watcher = self._watchers.get(network)
        if watcher is None or watcher.rpc is not rpc:
            watcher = self._watchers[network] = ConfirmationWatcher(rpc, self._poll_schedule)
        return watcher

    def follow(self, network: str, signature: str, blockhash: str, then: LateOutcome) -> bool:
        """Follow a settlement of ours whose confirmation wait passed until it lands or its
        blockhash expires (:meth:`ConfirmationWatcher.follow`): how the gateway counts a late
        outcome for the client IP, as this facilitator does for the payer."""
        return self._watcher(normalize_network(network)).follow(signature, blockhash, then)

    async def supported(self) -> SupportedResponse:
        kinds = [
            SupportedKind(
                x402Version=2, scheme=SCHEME_EXACT, network=network, extra={"feePayer": self._address}
            )
            for network in self._rpc_urls
        ]
        return SupportedResponse(kinds=kinds, extensions=[], signers={"solana:*": [self._address]})

    # --- verify ---------------------------------------------------------------------------

    def _check(self, payload: PaymentPayload, requirements: PaymentRequirements) -> ExactCheck:
        check = check_exact_payment(payload, requirements, (self._address,), self._policy)
        if check.ok and normalize_network(requirements.network) not in self._rpc_urls:
            return ExactCheck(
                reason=Reason.INVALID_NETWORK,
                message=f"this facilitator does not serve {requirements.network}",
                payer=check.payer,
                transaction=check.transaction,
            )
        return check

    def _rpc(self, requirements: PaymentRequirements) -> SolanaRpc:
        return self._rpc_for(normalize_network(requirements.network))

    async def _simulate(
        self, check: ExactCheck, requirements: PaymentRequirements, commitment: str = "confirmed"
    ) -> VerifyResponse:
        """Simulate the fee-payer-signed transaction; nothing is broadcast."""
        assert check.transaction is not None
        signed = sign_as_fee_payer(check.transaction, self._wallet)
        try:
            result = await self._rpc(requirements).simulate_transaction(
                encode_transaction(signed), commitment=commitment
            )
        except RpcUnavailable as exc:
            raise FacilitatorUnavailable(f"Solana RPC unavailable: {exc}") from None
        except RpcResponseError as exc:
            return check.refused(Reason.SIMULATION_FAILED, f"simulation refused: {exc.rpc_message}")
        if result.err is not None:
            return check.refused(
                Reason.SIMULATION_FAILED, f"simulation failed: {_encoder.encode(result.err).decode()}"
            )
        return VerifyResponse(isValid=True, payer=check.payer)

    async def verify(self, payload: PaymentPayload, requirements: PaymentRequirements) -> VerifyResponse:
        """Every rule, a look at the shared store, then ``simulateTransaction``. Nothing is sent.

        Raises :class:`FacilitatorUnavailable` when the RPC node cannot be reached and
        :class:`~gateway.store.StoreUnavailable` when the store cannot.
        """
        check = self._check(payload, requirements)
        if not check.ok or check.transaction is None:
            return check.verify_response()
        key = keys.settlement(payment_key(check.transaction))
        standing = await self._guard.standing(_parties(check), also=[key])
        record = _decode_record(standing.found[0])
        if record is not None:
            return check.refused(
                Reason.DUPLICATE_SETTLEMENT, f"this payment was already submitted ({record.state})"
            )
        if standing.cooling is not None:
            return check.refused(Reason.INVALID_TRANSACTION_STATE, _COOLING)
        return await self._simulate(check, requirements)

    # --- settle ---------------------------------------------------------------------------

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse:
        """Verify again, claim, sign, broadcast once, confirm (see the module docstring).

        Raises :class:`FacilitatorUnavailable` when the node is unreachable before anything
        was broadcast, :class:`~gateway.store.StoreUnavailable` when the store is.
        """
        network = requirements.network
        check = self._check(payload, requirements)
        if not check.ok or check.transaction is None:
            return self._failure(network, check.reason or Reason.INVALID_PAYLOAD, check.message, check.payer)
        payer = check.payer or ""
        key = keys.settlement(payment_key(check.transaction))

        parties = _parties(check)
        standing = await self._guard.standing(parties, also=[key])
        record = _decode_record(standing.found[0])
        counting = _Counting(check.fee_lamports, parties, str(check.transaction.message.recent_blockhash))
        if record is not None:
            return await self._resume(key, record, counting)
        token = secrets.token_hex(16)  # this settlement's, so only this settlement leaves
        funds = self._funds(parties[1].id, requirements)
        turn = await self._guard.take_turn(token, parties, standing, wait_s=self._payer_wait_s, funds=funds)
        if not turn.admitted:
            # A concurrent settle of this very payment may have held the place and landed it
            # meanwhile (its funds moved, so this one looked unaffordable): answer for that one.
            record = await self._load_key(key)
            if record is not None:
                return await self._resume(key, record, counting)
            SETTLEMENTS_HELD_BACK.labels(turn.outcome).inc()
            reason, message = _HELD_BACK[turn.outcome]
            return self._failure(network, reason, message, payer)

        async def release() -> None:
            with contextlib.suppress(Exception):
                await self._guard.leave(token, parties, turn.funds)

        outcome: SettleResponse | None = None
        try:
            outcome = await self._settle_admitted(
                key, check, requirements, payer, dataclasses.replace(counting, release=release)
            )
            return outcome
        finally:
            # A broadcast whose outcome is unknown keeps its place until its follow-up learns it
            # (or its hold lapses): its funds may still move, and its payer must not look idle
            # before it lands or can no longer land.
            if outcome is None or outcome.errorReason != Reason.SETTLEMENT_PENDING.value:
                await release()

    def _funds(self, account: str, requirements: PaymentRequirements) -> Funds:
        """The settlement's amount held against the account's confirmed balance, read right
        before the broadcast (None when even an idle account could not pay it)."""
        amount = int(requirements.amount)

        async def held() -> Hold | None:
            balance = await self._confirmed_balance(account, requirements)
            return account_funds(account, amount, balance) if balance >= amount else None

        return held

    async def _confirmed_balance(self, account: str, requirements: PaymentRequirements) -> int:
        """The token account's confirmed balance (0 when it is not a token account)."""
        try:
            info = await self._rpc(requirements).get_account_info(account, commitment="confirmed")
        except (RpcUnavailable, RpcResponseError) as exc:
            raise FacilitatorUnavailable(f"Solana RPC unavailable: {exc}") from None
        if info is None or len(info.data) < TOKEN_ACCOUNT_SIZE:
            return 0
        return int(TokenAccount.from_bytes(bytes(info.data[:TOKEN_ACCOUNT_SIZE])).amount)

    async def _settle_admitted(
        self, key: str, check: ExactCheck, requirements: PaymentRequirements, payer: str, counting: _Counting
    ) -> SettleResponse:
        """Simulate against the latest state, claim, broadcast with preflight, confirm; run with
        the payer's place in flight held, so the settlements in flight from its token account
        never move more than its balance."""
        assert check.transaction is not None
        network = requirements.network
        record = await self._load_key(key)
        if record is not None:  # settled or claimed by a holder of the lock before us
            return await self._resume(key, record, counting)
        verdict = await self._simulate(check, requirements, commitment="processed")
        if not verdict.isValid:
            # A concurrent settle of the same payment may have landed it meanwhile.
            record = await self._load_key(key)
            if record is not None:
                return await self._resume(key, record, counting)
            return self._failure(
                network,
                Reason(verdict.invalidReason or Reason.SIMULATION_FAILED),
                verdict.invalidMessage,
                payer,
            )

        signed = sign_as_fee_payer(check.transaction, self._wallet)
        record = SettlementRecord(
            state="pending",
            signature=transaction_signature(signed),
            network=network,
            payer=payer,
            amount=requirements.amount,
        )
        # Claim before broadcasting: whoever wins sends; everyone else reconciles or refuses.
        if not await self._store.claim(key, _encoder.encode(record).decode(), self._record_ttl_ms):
            existing = await self._load_key(key)
            if existing is None:  # claimed and expired in between: only after record_ttl_s
                return self._failure(network, Reason.DUPLICATE_SETTLEMENT, "payment seen before", payer)
            return await self._resume(key, existing, counting)

        try:
            # Preflight on: the node simulates once more against its latest state and refuses
            # (without charging the fee payer) what would fail on chain.
            await self._rpc(requirements).send_transaction(
                encode_transaction(signed), skip_preflight=False, preflight_commitment="processed"
            )
        except RpcResponseError as exc:
            # The node refused it outright (its preflight failed): it cannot land, and nothing
            # was charged. Terminal for this transaction.
            message = f"broadcast refused: {exc.rpc_message}"
            await self._put(key, msgspec.structs.replace(record, state="failed", error=message))
            return self._failure(network, Reason.SIMULATION_FAILED, message, payer)
        except RpcUnavailable:
            pass  # Ambiguous: it may have been forwarded. Watch the signature; never resend.
        return await self._confirm(key, record, dataclasses.replace(counting, broadcaster=True))

    async def _resume(self, key: str, record: SettlementRecord, counting: _Counting) -> SettleResponse:
        """A settle of a payment the store already knows: refuse, or reconcile its signature
        (its outcome counted for its parties unless a settle or follow-up counted it already)."""
        if record.state == "settled":
            return self._duplicate(record)
        if record.state == "failed":
            return self._failure(record.network, Reason.TRANSACTION_FAILED, record.error, record.payer)
        return await self._confirm(key, record, counting)

    async def _confirm(self, key: str, record: SettlementRecord, counting: _Counting) -> SettleResponse:
        """Wait for the recorded signature to be confirmed or to fail, up to the timeout (never
        resend); the node is polled at the chain's pace (:mod:`gateway.methods.exact.confirmations`).
        When the wait passes, the settle that broadcast it follows it on (see the module).

        Several settles may watch one signature (retries, other processes); the atomic claim
        of :func:`~gateway.store.keys.settlement_reported` lets exactly one of them answer ``success``.
        """
        watcher = self._watcher(normalize_network(record.network))
        status = await watcher.status(record.signature, self._confirm_timeout_s)
        if status is None:
            if counting.release is not None:
                late = self._late_outcome(key, record, counting)
                if not watcher.follow(record.signature, counting.blockhash, late):
                    log_event("late settlement not followed: too many followed", logging.WARNING)
            return self._failure(
                record.network,
                Reason.SETTLEMENT_PENDING,
                "broadcast, not yet confirmed; settle again to reconcile",
                record.payer,
                record.signature,
            )
        if status.err is not None:
            message = _failed_message(status)
            await self._put(key, msgspec.structs.replace(record, state="failed", error=message))
            await self._counted(counting, record, landed=False)
            return self._failure(record.network, Reason.TRANSACTION_FAILED, message, record.payer)
        await self._counted(counting, record, landed=True)
        won = await self._store.claim(keys.settlement_reported(key), record.signature, self._record_ttl_ms)
        settled = msgspec.structs.replace(record, state="settled")
        await self._put(key, settled)
        if not won:
            return self._duplicate(settled)
        return SettleResponse(
            success=True,
            transaction=record.signature,
            network=record.network,
            payer=record.payer,
            amount=record.amount,
        )

    def _late_outcome(self, key: str, record: SettlementRecord, counting: _Counting) -> LateOutcome:
        """What a follow-up does with a broadcast's late outcome: a failure is recorded and cools
        its parties down, a landing grows their record, as in time; then their places are freed."""

        async def late(status: SignatureStatus | None) -> None:
            try:
                if status is None:
                    log_event("late settlement never landed", settlement=record.signature)
                    return
                if status.err is not None:
                    failed = msgspec.structs.replace(record, state="failed", error=_failed_message(status))
                    await self._put(key, failed)
                outcome = "landed" if status.err is None else "failed"
                log_event("late settlement outcome", outcome=outcome, settlement=record.signature)
                await self._counted(counting, record, landed=status.err is None)
            finally:
                if counting.release is not None:
                    await counting.release()

        return late

    async def _counted(self, counting: _Counting, record: SettlementRecord, *, landed: bool) -> None:
        """Count a broadcast's fee by outcome, grow its parties' record or cool them down, and
        read the fee payer's balance again (at most every ``BALANCE_REFRESH_S``), once per
        signature: a landing by the settle that broadcast it (in time, or its follow-up after
        the wait: never both), a failure by the first settle or follow-up to hear of it, on any
        replica (a claim keyed by the signature, in the cool-down's round trip), so a failure
        is counted even when the process that broadcast it died."""
        try:
            if landed:
                if not counting.broadcaster:
                    return
                await self._guard.landed(counting.parties)
                counted = True
            else:
                counted = await self._guard.failed(counting.parties, Counted("payer", record.signature))
        except Exception:  # best effort: the outcome is on chain already
            return
        if not counted:
            return
        SETTLEMENT_FEES.labels("landed" if landed else "failed").inc(counting.fee_lamports)
        network = record.network
        if time.monotonic() >= self._balance_read_at + BALANCE_REFRESH_S:
            self._balance_read_at = time.monotonic()
            with contextlib.suppress(RpcUnavailable, RpcResponseError):
                rpc = self._rpc_for(normalize_network(network))
                FEE_PAYER_BALANCE.set(await rpc.get_balance(self._address))

    # --- store helpers ----------------------------------------------------------------------

    async def _load(self, message_hash: str) -> SettlementRecord | None:
        return await self._load_key(keys.settlement(message_hash))

    async def _load_key(self, key: str) -> SettlementRecord | None:
        return _decode_record(await self._store.get(key))

    async def _put(self, key: str, record: SettlementRecord) -> None:
        """Record a final state. Best effort: the outcome is on chain already, and if this
        write is lost the ``pending`` record still blocks a re-broadcast."""
        with contextlib.suppress(Exception):
            await self._store.put(key, _encoder.encode(record).decode(), self._record_ttl_ms)

    @staticmethod
    def _duplicate(record: SettlementRecord) -> SettleResponse:
        return SettleResponse(
            success=False,
            errorReason=Reason.DUPLICATE_SETTLEMENT.value,
            errorMessage="this payment was already settled",
            transaction=record.signature,
            network=record.network,
            payer=record.payer,
            amount=record.amount,
        )

    @staticmethod
    def _failure(
        network: str, reason: Reason, message: str | None, payer: str | None, transaction: str = ""
    ) -> SettleResponse:
        return SettleResponse(
            success=False,
            errorReason=reason.value,
            errorMessage=message,
            transaction=transaction,
            network=network,
            payer=payer,
        )


def _decode_record(raw: str | None) -> SettlementRecord | None:
    if raw is None:
        return None
    try:
        return _record_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        # Not ours to overwrite; treat as a payment in an unknown state (never resend).
        return SettlementRecord(
            state="failed", signature="", network="", payer="", amount="", error="unreadable record"
        )


def _failed_message(status: SignatureStatus) -> str:
    return f"transaction failed: {_encoder.encode(status.err).decode()}"


def _parties(check: ExactCheck) -> list[Party]:
    """Whose settlement this is to the fee guard: the payer (owner), then its token account."""
    assert check.transaction is not None
    payer = check.payer or ""
    return [Party("owner", payer), Party("account", transfer_source(check.transaction) or payer)]


def load_local_facilitator(
    wallet_base58: str | None,
    store: Store,
    *,
    mainnet_rpc_url: str,
    devnet_rpc_url: str | None = None,
    url: str = "",
    session: aiohttp.ClientSession | UpstreamClient | None = None,
    policy: ExactPolicy | None = None,
    guard: FeeGuard | None = None,
    confirm_timeout_s: float = 30.0,
) -> LocalFacilitator | None:
    """The facilitator for ``FACILITATOR_WALLET_BASE58``, or None when it is unset.

    Raises ValueError (safe message) when the wallet is malformed.
    """
    if not wallet_base58:
        return None
    return LocalFacilitator(
        parse_wallet(wallet_base58),
        store,
        mainnet_rpc_url=mainnet_rpc_url,
        devnet_rpc_url=devnet_rpc_url,
        url=url,
        session=session,
        policy=policy,
        guard=guard,
        confirm_timeout_s=confirm_timeout_s,
    )
