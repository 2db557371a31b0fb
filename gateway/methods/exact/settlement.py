"""Settlement: settle a paid request once its upstream succeeded, and say what it came to.

Write-ahead: the intent to settle (payment key, request fingerprint, withheld response) is in the
store *before* the facilitator is asked. Whatever happens after (a pending confirmation, a silent
facilitator, a store outage, the process killed), the record survives, and a retry of the
identical request, on any replica, reconciles it: the facilitator answers for the one message it
knows, nothing is broadcast twice, and exactly one request delivers the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from gateway.facilitators.http import FacilitatorUnavailable
from gateway.ledger import LedgerUnavailable
from gateway.ledger.entries import SettledPayment
from gateway.ledger.recorder import MoneyRecorder
from gateway.methods.credit.book import TopUp
from gateway.methods.exact.confirmations import LateFollower
from gateway.methods.exact.fee_guard import Counted, FeeGuard, Party
from gateway.methods.exact.ledger import (
    ANSWER_CAP_BYTES,
    DeliveredRecord,
    PaymentLedger,
    PendingSettlement,
    StoredResponse,
)
from gateway.methods.exact.offer import RouteOffers
from gateway.methods.results import (
    Delivered,
    Failed,
    Interrupted,
    PaidRequest,
    Pending,
    Reconcile,
    Refused,
    Settled,
)
from gateway.outbound.solana_rpc import SignatureStatus
from gateway.store import Credit, StoreUnavailable
from gateway.telemetry.logs import log_event
from gateway.x402.headers import encode_header
from gateway.x402.svm import decode_transaction
from gateway.x402.types import SettleResponse

DUPLICATE_SETTLEMENT = "duplicate_settlement"
TRANSACTION_FAILED = "transaction_failed"
"""It landed and failed on chain: the fee payer paid for it."""


class Settlement:
    """Settles one route's payments; every outcome is a value, none is an exception."""

    def __init__(
        self,
        *,
        route_name: str,
        ledger: PaymentLedger,
        offers: RouteOffers,
        replay_cap_bytes: int,
        guard: FeeGuard | None = None,
        guard_wait_s: float = 5.0,
        top_up: TopUp | None = None,
        recorder: MoneyRecorder | None = None,
        late: LateFollower | None = None,
    ) -> None:
        self.route_name = route_name
        self.ledger = ledger
        self.offers = offers
        """The route's facilitators: a payment is settled by the one that verified it."""
        self.replay_cap_bytes = replay_cap_bytes
        self.guard = guard
        """Our own fee payer's guard (internal facilitator): a client IP's settlements in flight
        stay within its allowance (or its payer's, vouching with a record of its own), and one
        that fails on chain cools the IP down for payers without a record."""
        self.guard_wait_s = guard_wait_s
        self.late = late
        """Follows our own settlements whose confirmation wait passed, so a late outcome is
        counted for the client IP as one in time is."""
        self.top_up = top_up
        """A top-up route's credit: booked to the payer in the round trip that delivers, or not at all."""
        self.recorder = recorder or MoneyRecorder()
        """The ledger of record: a top-up is written to it before its credit is booked, a sale
        once it is delivered."""

    async def settle(self, paid: PaidRequest, response: StoredResponse) -> Settled:
        """Record the intent, then settle. ``StoreUnavailable`` from the intent's write means the
        facilitator was never asked: the caller's truthful "nothing was charged"."""
        intent = PendingSettlement(paid.fingerprint, paid.claimant, response)
        await self.ledger.record_pending(paid.payer, paid.key, intent)
        return await self._settle(paid, intent, reconciling=False)

    async def reconcile(self, retry: Reconcile) -> Settled:
        """Settle again for the retry of the request that recorded ``retry.intent``: there the
        facilitator's ``duplicate_settlement`` naming the same transaction means the first
        broadcast landed and its answer was lost, so this request may deliver what was paid for
        (once: see :meth:`_deliver_once`). The intent is marked ``retried`` before the
        facilitator is asked: the recording request may still be settling, and when this retry
        lands the payment first, the duplicate that request then hears is this retry's."""
        return await self._settle(retry.paid, retry.intent, reconciling=True)

    async def _settle(self, paid: PaidRequest, intent: PendingSettlement, *, reconciling: bool) -> Settled:
        try:
            return await self._ask_facilitator(paid, intent, reconciling)
        except StoreUnavailable:
            # The settlement may have been broadcast: never say nothing was charged.
            log_event(
                "store lost while settling: payment left pending",
                logging.ERROR,
                route=self.route_name,
                payer=paid.payer,
            )
            return Pending()

    async def _ask_facilitator(
        self, paid: PaidRequest, intent: PendingSettlement, reconciling: bool
    ) -> Settled:
        if reconciling and not intent.retried:
            intent = msgspec.structs.replace(intent, retried=True)
            await self.ledger.record_pending(paid.payer, paid.key, intent)
        try:
            result: SettleResponse | None = await self._settle_as_client(
                paid, reconciling, intent.transaction
            )
        except FacilitatorUnavailable:
            await self.offers.health.mark_down(paid.facilitator)
            result = None
        except StoreUnavailable:
            result = None
        except asyncio.CancelledError:
            # Stopped mid-settle (a shutdown past its graceful timeout): the broadcast may have
            # landed; the intent recorded before lets a retry (on any replica) reconcile.
            log_event("payment settlement interrupted, left pending", route=self.route_name, payer=paid.payer)
            return Interrupted()
        if result is None or result.errorReason == "settlement_pending":
            await self._left_pending(paid, intent, result)
            return Pending()
        duplicate = (
            result.errorReason == DUPLICATE_SETTLEMENT
            and bool(result.transaction)
            and intent.transaction in ("", result.transaction)
        )
        # A duplicate heard by the request that recorded the intent is a failure, unless a retry
        # of this very request reconciled it meanwhile and landed it first (a concurrent copy of
        # the request): then it settled, and one of the two delivers.
        settled = result.success or (
            duplicate
            and (reconciling or await self.ledger.settled_by_retry(paid.payer, paid.key, paid.fingerprint))
        )
        if settled and intent.response is not None:
            return await self._deliver_once(paid, result, intent, intent.response)
        if reconciling and not intent.transaction:
            # The request that recorded this intent may still be settling it, or died before it
            # heard the outcome: a refusal seen from here (a concurrent duplicate, say) is not
            # final, so nothing is closed and the client is told to retry, never to pay again.
            log_event("reconciling settle refused while its intent is open", route=self.route_name)
            return Pending()
        reason = result.errorReason or "settlement_failed"
        log_event("payment settlement failed", route=self.route_name, payer=paid.payer, reason=reason)
        await self._close_intent(paid)
        return Failed(reason)

    async def _settle_as_client(
        self, paid: PaidRequest, reconciling: bool, transaction: str
    ) -> SettleResponse:
        """The facilitator's settle; with the fee guard, inside the client IP's place in flight
        (waiting up to ``guard_wait_s`` for one, else ``settlement_pending`` with nothing asked),
        its outcome counted for the IP. A payer with a record of its own is vouched for by it
        (:class:`~gateway.methods.exact.fee_guard.FeeGuard`). A client cooling down is not asked for:
        the payment fails, unless a retry of the request is settling it (this request is one, or
        one of its copies reconciles its intent), for then it may have settled: the client
        retries later. A broadcast still unconfirmed keeps its IP's place until a follow-up
        learns its outcome, and counts it then; an outcome is counted for the IP once, by
        this follow-up or a retry (``transaction``: the signature the intent recorded)."""
        settling = self.offers.named(paid.facilitator).settling
        guard = self.guard if settling.ours else None
        if guard is None or not paid.client_ip:
            return await settling.facilitator.settle(paid.payload, paid.requirements)
        client = [Party("ip", paid.client_ip)]
        # The payer's own record vouches for it on a shared IP: neither another wallet's failure
        # there nor the IP's short record holds it below its own allowance.
        payer = Party("owner", paid.payer)
        # The place is the payment's: a retry of it (its first process killed mid-settle) takes
        # the same place back at once instead of waiting for the dead one's hold to lapse, and
        # copies of one payment settle one transaction, so they never need two places.
        token = f"settle:{paid.key}"
        standing = await guard.standing(client, voucher=payer)
        turn = await guard.take_turn(token, client, standing, wait_s=self.guard_wait_s, voucher=payer)
        if turn.outcome == "cooling_down":  # a settlement of this client failed on chain
            why = "this client cools down after a failure"
            if reconciling or await self.ledger.settled_by_retry(paid.payer, paid.key, paid.fingerprint):
                return _not_asked(paid, "settlement_pending", why)
            return _not_asked(paid, "invalid_transaction_state", why)
        if not turn.admitted:
            return _not_asked(paid, "settlement_pending", "this client's settlements fill its allowance")
        result: SettleResponse | None = None

        async def release() -> None:
            with contextlib.suppress(Exception):
                await guard.leave(token, client)

        try:
            result = await settling.facilitator.settle(paid.payload, paid.requirements)
        finally:
            # Nothing broadcast (an answer without a transaction), or an outcome known: free the
            # place; else it is held until a follow-up learns the outcome (or the hold lapses).
            if result is None or result.errorReason != "settlement_pending" or not result.transaction:
                await release()
            elif not self._follow(paid, result.transaction, guard, client, standing.vouched, release):
                log_event(
                    "late settlement not followed for its client", logging.WARNING, route=self.route_name
                )
        # A settlement answered pending (its intent names its transaction) may be followed by
        # now: counted once, by it or by this retry. One heard in time has no follow-up, and
        # one settle only hears it succeed (the facilitator reports a success once).
        once = Counted("client", transaction) if transaction else None
        with contextlib.suppress(StoreUnavailable):
            if result.success and not standing.vouched:  # a vouched payer's counts for it alone
                await guard.landed(client, once)
            elif result.errorReason == TRANSACTION_FAILED:
                await guard.failed(client, once)
        return result

    def _follow(
        self,
        paid: PaidRequest,
        signature: str,
        guard: FeeGuard,
        client: list[Party],
        vouched: bool,
        release: Callable[[], Awaitable[None]],
    ) -> bool:
        """Follow a broadcast whose confirmation wait passed: its late failure cools the client
        IP down, its late landing grows the IP's record (unless its payer vouched), once."""
        if self.late is None:
            return False
        try:
            blockhash = str(decode_transaction(paid.payload.payload["transaction"]).message.recent_blockhash)
        except (KeyError, TypeError, ValueError):
            return False
        once = Counted("client", signature)

        async def late(status: SignatureStatus | None) -> None:
            try:
                if status is not None and status.err is not None:
                    await guard.failed(client, once)
                elif status is not None and not vouched:
                    await guard.landed(client, once)
            finally:
                await release()

        return self.late.follow(paid.requirements.network, signature, blockhash, late)

    async def _deliver_once(
        self, paid: PaidRequest, result: SettleResponse, intent: PendingSettlement, response: StoredResponse
    ) -> Delivered | Pending | Refused:
        """Exactly one request per payment hands out the answer, however many reconcile it at
        once; the same round trip closes the intent and keeps the answer (within its size cap)
        for the identical request's retries. A store outage here lets a fresh success through
        (only this settle call was told it settled) but leaves a reconciled one pending, to be
        delivered by a later retry."""
        delivered = _delivered(result, response)
        cap = self.replay_cap_bytes
        if paid.payment_id is None:
            cap = min(cap, ANSWER_CAP_BYTES)
        kept = delivered if len(delivered.body) <= cap else None
        record = DeliveredRecord(paid.fingerprint, paid.claimant, kept)
        credits = await self._top_up_credits(paid, result) if self.top_up is not None else []
        if credits is None:
            await self._left_pending(paid, intent, result)
            return Pending()
        try:
            first = await self.ledger.deliver(paid.payer, paid.key, record, credits)
        except StoreUnavailable:
            # A top-up is delivered with its credit or not at all: a retry reconciles both.
            if not result.success or credits:
                await self._left_pending(paid, intent, result)
                return Pending()
            log_event(
                "settled response delivered, its intent not closed: store unavailable",
                logging.WARNING,
                route=self.route_name,
            )
            first = True
        if not first:
            return Refused("payment_already_used", "this payment's answer was delivered already", paid.payer)
        log_event(
            "payment settled",
            route=self.route_name,
            payer=paid.payer,
            amount=paid.requirements.amount,
            settlement=result.transaction,
        )
        if self.top_up is not None:
            self.top_up.sold(paid.payer, result.transaction)
        else:
            self.recorder.sale(self._settled(paid, result, int(paid.requirements.amount)))
        return Delivered(delivered, result.transaction)

    def _settled(self, paid: PaidRequest, result: SettleResponse, amount_micro: int) -> SettledPayment:
        """The settled payment as the ledger records it."""
        return SettledPayment(
            route=self.route_name,
            payer=paid.payer,
            amount_micro=amount_micro,
            signature=result.transaction,
            facilitator=paid.facilitator,
            at_ms=int(time.time() * 1000),
            payment_key=paid.key,
        )

    async def _top_up_credits(self, paid: PaidRequest, result: SettleResponse) -> list[Credit] | None:
        """The settled top-up written to the ledger, then the credit its delivery books (raising
        the store's ledger position to the entry): credit the store holds is always in the ledger
        first. None when the ledger could not be written: nothing is booked, the settlement is
        left pending and the client's retry of the identical request writes and books it (once:
        the entry's ref is the settlement)."""
        assert self.top_up is not None
        try:
            entry_id = await self.recorder.top_up(self._settled(paid, result, self.top_up.amount))
        except LedgerUnavailable as failed:
            log_event(
                "top-up settled, its credit not booked: ledger unavailable",
                logging.ERROR,
                route=self.route_name,
                payer=paid.payer,
                settlement=result.transaction,
                reason=str(failed),
            )
            return None
        return self.top_up.credits(paid.payer, entry_id)

    async def _left_pending(
        self, paid: PaidRequest, intent: PendingSettlement, result: SettleResponse | None
    ) -> None:
        """Keep the intent (with the broadcast transaction, once known) for a retry to reconcile."""
        transaction = result.transaction if result is not None and result.transaction else intent.transaction
        try:
            await self.ledger.record_pending(
                paid.payer, paid.key, msgspec.structs.replace(intent, transaction=transaction)
            )
        except StoreUnavailable:
            # The intent written before settling still stands, without the transaction.
            log_event(
                "settlement pending, its transaction not recorded: store unavailable",
                logging.ERROR,
                route=self.route_name,
                payer=paid.payer,
                settlement=transaction or None,
            )
        log_event("payment settlement pending", route=self.route_name, payer=paid.payer)

    async def _close_intent(self, paid: PaidRequest) -> None:
        """The settlement failed for good: nothing to reconcile (the claim keeps the payment used)."""
        try:
            await self.ledger.resolve_pending(paid.payer, paid.key)
        except StoreUnavailable:
            log_event(
                "failed settlement's intent not closed: store unavailable",
                logging.WARNING,
                route=self.route_name,
            )


def _not_asked(paid: PaidRequest, reason: str, why: str) -> SettleResponse:
    """A settlement the fee guard did not hand to the facilitator: nothing was broadcast."""
    return SettleResponse(
        success=False,
        errorReason=reason,
        errorMessage=f"{why}; nothing was asked of the facilitator",
        transaction="",
        network=paid.requirements.network,
        payer=paid.payer,
    )


def _delivered(result: SettleResponse, response: StoredResponse) -> StoredResponse:
    """The withheld answer with its payment-response header; a reconciled duplicate is reported
    to the client as the plain success it is."""
    if not result.success:
        result = msgspec.structs.replace(result, success=True, errorReason=None, errorMessage=None)
    return StoredResponse(
        status=response.status,
        body=response.body,
        content_type=response.content_type,
        payment_response=encode_header(result),
        settlement=result.transaction,
    )
