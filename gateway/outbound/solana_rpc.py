"""A small async Solana JSON-RPC client: aiohttp transport, msgspec shapes, typed errors.

Only the calls the gateway needs (payment building, simulation, settlement, balances, and the
history of an account the ledger is reconciled with).
One session is shared for the client's life (:class:`gateway.outbound.client.UpstreamClient`):
pass an aiohttp session in, or a client to share its session with, or let the client open
(and later close) its own.

RPC URLs usually carry a provider API key, so the URL never appears in an exception
message, a ``repr`` or a log line, and transport exceptions are re-raised ``from None``
(their text names the host).
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Sequence
from typing import Any, Final, Generic, TypeVar

import aiohttp
import msgspec
from solders.transaction_status import EncodedConfirmedTransactionWithStatusMeta

from gateway.outbound.client import ANY_STATUS, UpstreamClient, UpstreamFailure, UpstreamTooLarge
from gateway.outbound.metrics import ErrorKind, status_kind

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class SolanaRpcError(Exception):
    """A Solana RPC call failed. The message names the method, never the URL."""

    def __init__(self, method: str, message: str) -> None:
        super().__init__(f"{method}: {message}")
        self.method = method


class RpcUnavailable(SolanaRpcError):
    """The node could not be reached, timed out, or answered something that is not JSON-RPC."""


class RpcResponseError(SolanaRpcError):
    """The node answered with a JSON-RPC error object (it understood and refused the call)."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(method, f"error {code}: {message}")
        self.code = code
        self.rpc_message = message
        self.data = data


# --- wire shapes ------------------------------------------------------------------------------


class RpcRequest(msgspec.Struct):
    method: str
    params: list[Any]
    id: int
    jsonrpc: str = "2.0"


class RpcErrorObject(msgspec.Struct):
    code: int
    message: str
    data: Any = None


class RpcEnvelope(msgspec.Struct, Generic[T]):
    result: T | msgspec.UnsetType = msgspec.UNSET
    error: RpcErrorObject | None = None


class RpcContext(msgspec.Struct):
    slot: int


class WithContext(msgspec.Struct, Generic[T]):
    context: RpcContext
    value: T


class LatestBlockhash(msgspec.Struct, frozen=True):
    blockhash: str
    lastValidBlockHeight: int


class _AccountWire(msgspec.Struct):
    lamports: int
    owner: str
    data: list[str]
    executable: bool = False


class AccountInfo(msgspec.Struct, frozen=True):
    """An account read with ``encoding: base64``; ``data`` is the raw bytes."""

    lamports: int
    owner: str
    data: bytes
    executable: bool


class SimulationResult(msgspec.Struct, frozen=True):
    """``simulateTransaction`` value: ``err`` is None on success, else the node's error JSON."""

    err: Any = None
    logs: list[str] | None = None
    unitsConsumed: int | None = None


class SignatureStatus(msgspec.Struct, frozen=True):
    slot: int
    confirmations: int | None = None
    err: Any = None
    confirmationStatus: str | None = None

    @property
    def confirmed(self) -> bool:
        """Confirmed or finalized (``processed`` is not enough to call a payment settled)."""
        return self.confirmationStatus in ("confirmed", "finalized")


class SignatureInfo(msgspec.Struct, frozen=True):
    """One entry of ``getSignaturesForAddress``: a transaction that touched the address."""

    signature: str
    slot: int
    err: Any = None
    blockTime: int | None = None
    confirmationStatus: str | None = None


MAX_SIGNATURES_PAGE = 1000
"""The most signatures a node answers per ``getSignaturesForAddress`` call."""


# --- the client -------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_ids = itertools.count(1)
_HEADERS: Final = {"content-type": "application/json", "accept": "application/json"}


class SolanaRpc:
    """JSON-RPC client for one Solana node URL."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession | UpstreamClient | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        upstream: str | None = None,
    ) -> None:
        """``upstream`` names the node in the gateway's upstream metrics (a fixed name, never
        the URL); a client outside the gateway leaves it unset and records nothing."""
        self._url = url
        self._http = UpstreamClient(
            session, timeout_s=timeout_s, max_bytes=MAX_RESPONSE_BYTES, upstream=upstream
        )
        self._decoders: dict[Any, msgspec.json.Decoder[Any]] = {}

    def __repr__(self) -> str:
        return "SolanaRpc(url=<redacted>)"

    async def close(self) -> None:
        """Close the session if this client opened it."""
        await self._http.close()

    def _decoder(self, result_type: Any) -> msgspec.json.Decoder[Any]:
        decoder = self._decoders.get(result_type)
        if decoder is None:
            decoder = msgspec.json.Decoder(RpcEnvelope[result_type])
            self._decoders[result_type] = decoder
        return decoder

    async def call(self, method: str, params: list[Any], result_type: Any) -> Any:
        """Call ``method`` and decode its ``result`` as ``result_type``.

        Raises :class:`RpcUnavailable` for transport failures and :class:`RpcResponseError`
        for JSON-RPC error answers.
        """
        body = _encoder.encode(RpcRequest(method=method, params=params, id=next(_ids)))
        try:
            # Every status is read: a node may answer a JSON-RPC error with a non-200.
            answer = await self._http.request(
                "POST", self._url, data=body, headers=_HEADERS, accept=ANY_STATUS
            )
        except UpstreamTooLarge:
            raise RpcUnavailable(method, "answer too large") from None
        except UpstreamFailure as exc:
            raise RpcUnavailable(method, f"node unreachable ({exc.cause})") from None
        status = answer.status
        try:
            envelope: RpcEnvelope[Any] = self._decoder(result_type).decode(answer.body)
        except (msgspec.DecodeError, RecursionError) as exc:
            self._http.failed(status_kind(status) if status != 200 else ErrorKind.INVALID_ANSWER)
            detail = f"HTTP {status}" if status != 200 else f"unexpected answer ({exc})"
            raise RpcUnavailable(method, detail) from None
        if envelope.error is not None:
            self._http.failed(ErrorKind.RPC_ERROR)
            error = envelope.error
            raise RpcResponseError(method, error.code, error.message, error.data)
        if status != 200 or envelope.result is msgspec.UNSET:
            self._http.failed(status_kind(status) if status != 200 else ErrorKind.INVALID_ANSWER)
            raise RpcUnavailable(method, f"HTTP {status} without a result")
        return envelope.result

    # --- typed calls ------------------------------------------------------------------------

    async def get_latest_blockhash(self, commitment: str = "confirmed") -> LatestBlockhash:
        answer: WithContext[LatestBlockhash] = await self.call(
            "getLatestBlockhash", [{"commitment": commitment}], WithContext[LatestBlockhash]
        )
        return answer.value

    async def get_account_info(self, address: str, commitment: str = "confirmed") -> AccountInfo | None:
        """The account at ``address`` (base64 data), or None when it does not exist."""
        answer: WithContext[_AccountWire | None] = await self.call(
            "getAccountInfo",
            [address, {"encoding": "base64", "commitment": commitment}],
            WithContext[_AccountWire | None],
        )
        wire = answer.value
        if wire is None:
            return None
        if len(wire.data) != 2 or wire.data[1] != "base64":
            raise RpcUnavailable("getAccountInfo", "account data is not base64")
        try:
            data = base64.b64decode(wire.data[0], validate=True)
        except (binascii.Error, ValueError):
            raise RpcUnavailable("getAccountInfo", "account data is not valid base64") from None
        return AccountInfo(lamports=wire.lamports, owner=wire.owner, data=data, executable=wire.executable)

    async def simulate_transaction(
        self,
        transaction_base64: str,
        *,
        sig_verify: bool = False,
        replace_recent_blockhash: bool = False,
        commitment: str = "confirmed",
    ) -> SimulationResult:
        config = {
            "encoding": "base64",
            "sigVerify": sig_verify,
            "replaceRecentBlockhash": replace_recent_blockhash,
            "commitment": commitment,
        }
        answer: WithContext[SimulationResult] = await self.call(
            "simulateTransaction", [transaction_base64, config], WithContext[SimulationResult]
        )
        return answer.value

    async def send_transaction(
        self,
        transaction_base64: str,
        *,
        skip_preflight: bool = True,
        preflight_commitment: str = "confirmed",
        max_retries: int | None = None,
    ) -> str:
        """Broadcast; returns the transaction signature (base58)."""
        config: dict[str, Any] = {
            "encoding": "base64",
            "skipPreflight": skip_preflight,
            "preflightCommitment": preflight_commitment,
        }
        if max_retries is not None:
            config["maxRetries"] = max_retries
        signature: str = await self.call("sendTransaction", [transaction_base64, config], str)
        return signature

    async def get_signature_statuses(
        self, signatures: Sequence[str], *, search_transaction_history: bool = False
    ) -> list[SignatureStatus | None]:
        answer: WithContext[list[SignatureStatus | None]] = await self.call(
            "getSignatureStatuses",
            [list(signatures), {"searchTransactionHistory": search_transaction_history}],
            WithContext[list[SignatureStatus | None]],
        )
        return answer.value

    async def is_blockhash_valid(self, blockhash: str, commitment: str = "processed") -> bool:
        """Whether a transaction signed over ``blockhash`` may still land (at ``processed``, the
        latest the node knows: a false answer there means it never will)."""
        answer: WithContext[bool] = await self.call(
            "isBlockhashValid", [blockhash, {"commitment": commitment}], WithContext[bool]
        )
        return answer.value

    async def get_balance(self, address: str, commitment: str = "confirmed") -> int:
        answer: WithContext[int] = await self.call(
            "getBalance", [address, {"commitment": commitment}], WithContext[int]
        )
        return answer.value

    async def get_signatures_for_address(
        self,
        address: str,
        *,
        before: str | None = None,
        limit: int = MAX_SIGNATURES_PAGE,
        commitment: str = "confirmed",
    ) -> list[SignatureInfo]:
        """One page of the transactions that touched ``address``, newest first, older than
        ``before`` when given (the last signature of the previous page)."""
        config: dict[str, Any] = {"limit": limit, "commitment": commitment}
        if before is not None:
            config["before"] = before
        page: list[SignatureInfo] = await self.call(
            "getSignaturesForAddress", [address, config], list[SignatureInfo]
        )
        return page

    async def get_transaction(
        self, signature: str, commitment: str = "confirmed"
    ) -> EncodedConfirmedTransactionWithStatusMeta | None:
        """The landed transaction (base64, parsed by solders) with its status, or None when the
        node does not know it."""
        method = "getTransaction"
        config = {"encoding": "base64", "commitment": commitment, "maxSupportedTransactionVersion": 0}
        raw: msgspec.Raw = await self.call(method, [signature, config], msgspec.Raw)
        text = bytes(raw).decode("utf-8", "replace")
        if text.strip() == "null":
            return None
        try:
            return EncodedConfirmedTransactionWithStatusMeta.from_json(text)
        except Exception:  # solders' SerdeJSONError and ValueError: an answer that is no transaction
            raise RpcUnavailable(method, "answer is not a transaction") from None
