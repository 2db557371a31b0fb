"""What the paid-path attack tests share: a hostile client's tools and the money to watch.

* :func:`another_client_signature` gives one payment message a second, third, ... valid client
  signature. An ed25519 signer may choose its nonce (RFC 8032 derives it from the key and the
  message, but nothing checks that it did), so a client holding its key can attach any number
  of valid signatures to one message. Built from libsodium's own ed25519 group operations
  (pynacl's bindings) with a random nonce, and checked by solders before it is used.
* :class:`Money`: the client's and payTo's USDC and the fee payer's SOL, before and after.
* :class:`LateConfirmationBackend`: the reference facilitator (real verify, broadcast and
  reconciliation on LiteSVM) whose first settlement is broadcast at once but confirmed only when
  the test releases it, so a gateway can be stopped or killed between broadcast and answer.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from nacl import bindings as sodium
from solders.keypair import Keypair
from solders.message import MessageV0, to_bytes_versioned
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.transaction import VersionedTransaction
from x402 import InMemoryPendingSettlementStore, x402FacilitatorSync
from x402.mechanisms.svm import FacilitatorKeypairSigner
from x402.mechanisms.svm.exact import ExactSvmFacilitatorScheme

from client.svm_payer import transfer_checked_instruction
from gateway.x402.svm import decode_transaction, encode_transaction
from gateway.x402.types import SOLANA_MAINNET, PaymentPayload
from tests.support.cdp_facilitator import ReferenceBackend
from tests.support.paid_processes import eventually
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, set_token_account

T = TypeVar("T")

CLIENT_SLOT = 1
"""The client's signature slot in an exact payment (slot 0 is the fee payer's)."""


def _nonce_signature(signer: Keypair, message: bytes) -> Signature:
    """An ed25519 signature of ``message`` by ``signer`` with a random nonce ``r``:
    R = rB, S = r + H(R || A || M) * a (mod L), a being the signer's clamped secret scalar."""
    digest = bytearray(hashlib.sha512(bytes(signer)[:32]).digest()[:32])
    digest[0] &= 248
    digest[31] &= 127
    digest[31] |= 64
    secret = sodium.crypto_core_ed25519_scalar_reduce(bytes(digest) + bytes(32))
    nonce = sodium.crypto_core_ed25519_scalar_reduce(os.urandom(64))
    commitment = sodium.crypto_scalarmult_ed25519_base_noclamp(nonce)
    challenge = sodium.crypto_core_ed25519_scalar_reduce(
        hashlib.sha512(commitment + bytes(signer.pubkey()) + message).digest()
    )
    response = sodium.crypto_core_ed25519_scalar_add(
        nonce, sodium.crypto_core_ed25519_scalar_mul(challenge, secret)
    )
    signature = Signature.from_bytes(commitment + response)
    assert signature.verify(signer.pubkey(), message), "the re-signed payment must verify"
    return signature


def another_client_signature(payment: PaymentPayload, signer: Keypair) -> PaymentPayload:
    """The same payment (same message, byte for byte) with a fresh valid client signature."""
    tx = decode_transaction(payment.payload["transaction"])
    message = to_bytes_versioned(tx.message)
    signatures = list(tx.signatures)
    fresh = _nonce_signature(signer, message)
    assert fresh != signatures[CLIENT_SLOT]
    signatures[CLIENT_SLOT] = fresh
    return with_transaction(payment, VersionedTransaction.populate(tx.message, signatures))


def with_transaction(payment: PaymentPayload, tx: VersionedTransaction) -> PaymentPayload:
    payload = {**payment.payload, "transaction": encode_transaction(tx)}
    return msgspec.structs.replace(payment, payload=payload)


def garbage_client_signature(payment: PaymentPayload) -> PaymentPayload:
    """The payment with its client signature replaced by 64 random bytes (does not verify)."""
    tx = decode_transaction(payment.payload["transaction"])
    signatures = list(tx.signatures)
    signatures[CLIENT_SLOT] = Signature.from_bytes(os.urandom(64))
    return with_transaction(payment, VersionedTransaction.populate(tx.message, signatures))


def drain_transaction(chain: UsdcChain, owner: Keypair, accounts: list[Pubkey], amount: int) -> str:
    """The owner's own transaction moving ``amount`` out of each of ``accounts`` to a fresh
    account (base64, signed; it pays its own fee): the move that makes settlements fail on chain
    after every check passed."""
    thief = set_token_account(chain.svm, Keypair().pubkey(), chain.mint, 0)
    instructions = [
        transfer_checked_instruction(
            source=account,
            mint=chain.mint,
            destination=thief,
            authority=owner.pubkey(),
            amount=amount,
            decimals=chain.decimals,
            token_program=chain.token_program,
        )
        for account in accounts
    ]
    message = MessageV0.try_compile(owner.pubkey(), instructions, [], chain.blockhash)
    return base64.b64encode(bytes(VersionedTransaction(message, [owner]))).decode()


async def settled_after_held_drain(rpc: LiteSvmRpcServer, drained: int, settling: Awaitable[T]) -> T:
    """``settling``'s outcome, the chain's held drain (sent as its ``drained``-th broadcast, under
    ``hold_landing``) landed once a settlement went out after it, or once ``settling`` ended with
    none: every check before saw the funds still there, as on a cluster, however loaded the
    machine, and the settlement lands after the drain."""
    running = asyncio.ensure_future(settling)
    await eventually(
        lambda: running.done() or len(rpc.sent) > drained,
        what="a settlement broadcast, or every one refused",
        timeout_s=30,
    )
    rpc.land_held()
    return await running


def funded_wallet(chain: UsdcChain, micro_usdc: int = 1_000_000) -> tuple[Keypair, Pubkey]:
    """A second client wallet holding ``micro_usdc``; returns it and its token account."""
    wallet = Keypair()
    return wallet, set_token_account(chain.svm, wallet.pubkey(), chain.mint, micro_usdc)


def via(ip: str) -> dict[str, str]:
    """Headers of a request forwarded by a trusted proxy for client ``ip``."""
    return {"x-forwarded-for": ip}


@dataclass(frozen=True)
class Money:
    """What a payment moves: the client's USDC, payTo's USDC, the fee payer's SOL (lamports)."""

    client_usdc: int
    pay_to_usdc: int
    fee_payer_sol: int

    @classmethod
    def of(cls, chain: UsdcChain, client_ata: Pubkey | None = None) -> Money:
        return cls(
            chain.balance(client_ata or chain.payer_ata) or 0,
            chain.balance(chain.pay_to_ata) or 0,
            chain.lamports(chain.fee_payer.pubkey()),
        )

    def minus(self, before: Money) -> Money:
        return Money(
            self.client_usdc - before.client_usdc,
            self.pay_to_usdc - before.pay_to_usdc,
            self.fee_payer_sol - before.fee_payer_sol,
        )


ONE_SETTLEMENT_FEE = 2 * 5_000
"""Lamports one settlement of our payment builder's transaction costs the fee payer on LiteSVM:
two signatures (fee payer, client) at 5,000 each; the priority fee of 20,000 compute units at
1 micro-lamport each comes to 0.02 lamports, which the runtime charges as 0."""


class LateSigner(FacilitatorKeypairSigner):
    """The reference fee-payer signer whose first confirmation wait lasts until ``release``,
    then gives up, as on a congested cluster; later waits confirm normally."""

    def __init__(self, fee_payer: Keypair, rpc_url: str) -> None:
        super().__init__(fee_payer, rpc_url=rpc_url)
        self.release = threading.Event()
        self._waited = False

    def confirm_transaction(self, signature: str, network: str, timeout_seconds: int = 30) -> None:
        if not self._waited:
            self._waited = True
            self.release.wait(10)
            raise RuntimeError("Transaction confirmation timeout")
        super().confirm_transaction(signature, network, timeout_seconds)


class SignallingPendingStore(InMemoryPendingSettlementStore):
    """The reference facilitator's pending-settlement store, telling when it keeps an entry."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = threading.Event()

    def set(self, key: str, tx_hash: str) -> None:
        super().set(key, tx_hash)
        self.kept.set()


class LateConfirmationBackend(ReferenceBackend):
    """The reference facilitator (real verify, broadcast and reconciliation on LiteSVM) whose
    first settlement is broadcast at once but confirmed only after the test releases it."""

    def __init__(self, chain: UsdcChain, rpc: LiteSvmRpcServer) -> None:
        self.fee_payer = chain.fee_payer
        self.facilitator = x402FacilitatorSync()
        self._signer = self.signer = LateSigner(chain.fee_payer, rpc.url)
        self.pending = SignallingPendingStore()
        scheme = ExactSvmFacilitatorScheme(self.signer, pending_store=self.pending)
        self.facilitator.register([SOLANA_MAINNET], scheme)

    def close(self) -> None:
        self.signer.release.set()
        super().close()
