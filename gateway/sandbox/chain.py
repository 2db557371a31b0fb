"""A Solana JSON-RPC server over LiteSVM on loopback, plus a USDC chain to pay on.

Stdlib ``http.server`` and solders only, so it runs anywhere the gateway runs: the offline
sandbox (``x402-gateway sandbox``) serves it as the local chain and the tests use it as their
Solana node. Answers are produced with solders' own RPC serializers so unchanged clients
(solana-py, the reference x402 clients, ours) parse them.

Methods: getLatestBlockhash, isBlockhashValid (the latest one only, as LiteSVM lands only
that; ``svm.expire_blockhash()`` ends it), getAccountInfo (base64; jsonParsed for token accounts and mints),
simulateTransaction, sendTransaction, getSignatureStatuses, getBalance, getTokenAccountBalance,
getSlot, getBlockHeight, getMinimumBalanceForRentExemption, getHealth, getVersion,
getGenesisHash, and, over the
accounts the server knows of (those given to :meth:`LiteSvmRpcServer.watch` plus every account
a landed transaction touched; LiteSVM cannot list its accounts): getTokenAccountsByOwner (also
jsonParsed), getProgramAccounts, getSignaturesForAddress and getTransaction (base64 encoding).
``extra_methods`` adds more (the sandbox's DAS sample and its ``sandboxFund``); their params
may be any JSON, and each runs holding the server's lock, so it may write to the chain.

Knobs: ``confirm_delay_s`` (a landed transaction reports ``processed`` for that long, then
``confirmed``, as a real cluster confirms some hundreds of milliseconds after landing; the
sandbox's ``--confirm-delay-ms``), ``land_delay_s`` (a broadcast transaction passes preflight
against the state of the moment and executes that much later, in the order sent, as on a real
cluster, where another transaction may land in between), ``hold_landing`` (a broadcast
transaction waits, unexecuted, until :meth:`LiteSvmRpcServer.land_held`: "later" without a
clock, for a test that must be sure a wait passed first), ``hold_confirmations`` (transactions
execute at once but their status stays ``processed`` until released), ``calls`` (a counter per
method) and ``sent`` (every signature accepted by sendTransaction, in order).
"""

from __future__ import annotations

import base64
import binascii
import collections
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import base58
from solders.account import Account, AccountJSON
from solders.account_decoder import ParsedAccount, UiTokenAmount
from solders.hash import Hash
from solders.keypair import Keypair
from solders.litesvm import LiteSVM
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.rpc.responses import (
    GetAccountInfoJsonParsedResp,
    GetAccountInfoResp,
    GetBalanceResp,
    GetLatestBlockhashResp,
    GetProgramAccountsResp,
    GetProgramAccountsWithContextResp,
    GetSignaturesForAddressResp,
    GetSignatureStatusesResp,
    GetTokenAccountBalanceResp,
    GetTokenAccountsByOwnerJsonParsedResp,
    GetTokenAccountsByOwnerResp,
    GetTransactionResp,
    IsBlockhashValidResp,
    RpcBlockhash,
    RpcConfirmedTransactionStatusWithSignature,
    RpcKeyedAccount,
    RpcKeyedAccountJsonParsed,
    RpcResponseContext,
    RpcSimulateTransactionResult,
    SendTransactionResp,
    SimulateTransactionResp,
)
from solders.signature import Signature
from solders.token.associated import get_associated_token_address
from solders.token.state import Mint, TokenAccount, TokenAccountState
from solders.transaction import Legacy, VersionedTransaction
from solders.transaction_metadata import FailedTransactionMetadata
from solders.transaction_status import (
    EncodedConfirmedTransactionWithStatusMeta,
    EncodedTransactionWithStatusMeta,
    TransactionConfirmationStatus,
    TransactionErrorFieldless,
    TransactionErrorType,
    TransactionStatus,
    UiTransactionStatusMeta,
)

from gateway.x402.svm import TOKEN_2022_PROGRAM, TOKEN_PROGRAM
from gateway.x402.types import USDC_MAINNET_MINT as USDC_MAINNET_ADDRESS

USDC_MAINNET_MINT = Pubkey.from_string(USDC_MAINNET_ADDRESS)
MAINNET_GENESIS_HASH = "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
BLOCKHASH_VALIDITY = 150
TOKEN_ACCOUNT_SIZE = 165
MINT_SIZE = 82
MAX_SIGNATURES = 1000

ExtraMethod = Callable[[Any], Any]
"""An added JSON-RPC method: raw ``params`` (any JSON) -> ``result``; raise RpcError to refuse."""

# JSON-RPC error codes of the Solana node.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
PREFLIGHT_FAILURE = -32002
SIGNATURE_VERIFICATION_FAILURE = -32003

# Failures that stop a transaction before it can land: the node drops it (skipPreflight) or
# refuses it in preflight; nothing is recorded.
_NOT_LANDED = (
    TransactionErrorFieldless.AlreadyProcessed,
    TransactionErrorFieldless.BlockhashNotFound,
    TransactionErrorFieldless.SignatureFailure,
    TransactionErrorFieldless.AccountNotFound,
    TransactionErrorFieldless.InsufficientFundsForFee,
)


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


@dataclass
class _Landed:
    slot: int
    err: TransactionErrorType | None
    at: float = 0.0
    """When it landed (``time.monotonic()``): it reports ``confirmed`` ``confirm_delay_s`` later."""
    transaction: VersionedTransaction | None = None
    logs: list[str] = field(default_factory=list)
    units: int | None = None
    pre_balances: list[int] = field(default_factory=list)
    post_balances: list[int] = field(default_factory=list)


class _RpcHttpServer(ThreadingHTTPServer):
    """The node's HTTP server, accepting bursts of connections as a real node does.

    Python's servers listen with a backlog of 5: of a burst of connections opened at once (a
    gateway settling 10 payments opens about one per simulation), those past the backlog have
    their SYN dropped, and the client's kernel sends it again a whole second later, which looked
    like a settlement waiting for a second round.
    """

    request_queue_size = 1024


@dataclass
class LiteSvmRpcServer:
    """JSON-RPC over one LiteSVM, served by a background thread on 127.0.0.1."""

    svm: LiteSVM = field(default_factory=LiteSVM)
    host: str = "127.0.0.1"
    port: int = 0
    hold_confirmations: bool = False
    hold_landing: bool = False
    confirm_delay_s: float = 0.0
    land_delay_s: float = 0.0
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    sent: list[str] = field(default_factory=list)
    extra_methods: dict[str, ExtraMethod] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._landed: dict[str, _Landed] = {}
        self._held: set[str] = set()
        # Broadcast, not yet executed, in the order sent: (number sent, held, transaction).
        self._landing: collections.deque[tuple[int, bool, VersionedTransaction]] = collections.deque()
        self._broadcasts = 0
        self._chain_number = 0  # changed by use(): a timer of the chain before lands nothing here
        self._known: dict[Pubkey, None] = {}  # insertion-ordered set
        self._history: dict[Pubkey, list[str]] = {}  # address -> signatures, oldest first
        self._httpd: _RpcHttpServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("server not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def port_bound(self) -> int:
        """The port it listens on (the one chosen when ``port`` was 0)."""
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    def start(self) -> LiteSvmRpcServer:
        handler = type("_Handler", (_Handler,), {"rpc": self})
        httpd = _RpcHttpServer((self.host, self.port), handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="litesvm-rpc", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LiteSvmRpcServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def use(self, svm: LiteSVM) -> None:
        """Serve another chain and forget every recorded signature and knob."""
        with self._lock:
            self.svm = svm
            self._landed.clear()
            self._held.clear()
            self._landing.clear()
            self._chain_number += 1
            self._known.clear()
            self._history.clear()
            self.hold_confirmations = self.hold_landing = False
            self.confirm_delay_s = self.land_delay_s = 0.0
            self.calls.clear()
            self.sent.clear()

    def watch(self, *addresses: Pubkey) -> None:
        """Make accounts visible to the listing methods (getProgramAccounts and friends)."""
        with self._lock:
            for address in addresses:
                self._known[address] = None

    def release_confirmations(self) -> None:
        """Let every held transaction report ``confirmed``."""
        with self._lock:
            self.hold_confirmations = False
            self._held.clear()

    def land_held(self) -> None:
        """Execute every transaction held by ``hold_landing``, in the order sent, and land the
        next ones at once again."""
        with self._lock:
            self.hold_landing = False
            while self._landing:
                self._land(self._landing.popleft()[2])

    # --- dispatch -----------------------------------------------------------------------

    def handle(self, request: Any) -> dict[str, Any]:
        request_id = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                raise RpcError(INVALID_REQUEST, "Invalid request")
            method = request["method"]
            extra = self.extra_methods.get(method)
            if extra is not None:
                with self._lock:  # held while it runs: an added method may write to the chain
                    self.calls[method] += 1
                    result = extra(request.get("params"))
                return {"jsonrpc": "2.0", "result": result, "id": request_id}
            params = request.get("params") or []
            if not isinstance(params, list):
                raise RpcError(INVALID_PARAMS, "Invalid params: expected an array")
            handler = getattr(self, "_rpc_" + method, None)
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, "Method not found")
            with self._lock:
                self.calls[method] += 1
                answer: dict[str, Any] = handler(params)
        except Exception as exc:  # every failure is a JSON-RPC error, never a dropped connection
            if not isinstance(exc, RpcError):
                exc = RpcError(INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}")
            error: dict[str, Any] = {"code": exc.code, "message": exc.message}
            if exc.data is not None:
                error["data"] = exc.data
            return {"jsonrpc": "2.0", "error": error, "id": request_id}
        answer["id"] = request_id
        return answer

    def _context(self) -> RpcResponseContext:
        return RpcResponseContext(self.svm.get_clock().slot)

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(resp.to_json())
        return parsed

    @staticmethod
    def _pubkey(params: list[Any], index: int = 0) -> Pubkey:
        try:
            return Pubkey.from_string(params[index])
        except Exception:
            raise RpcError(INVALID_PARAMS, "Invalid param: Invalid") from None

    @staticmethod
    def _transaction(params: list[Any]) -> VersionedTransaction:
        if not params or not isinstance(params[0], str):
            raise RpcError(INVALID_PARAMS, "Invalid params: missing transaction")
        config = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        if config.get("encoding", "base58") != "base64":
            raise RpcError(INVALID_PARAMS, "Invalid params: only base64 encoding is served")
        try:
            return VersionedTransaction.from_bytes(base64.b64decode(params[0], validate=True))
        except (binascii.Error, ValueError, Exception):
            raise RpcError(INVALID_PARAMS, "invalid transaction: failed to deserialize") from None

    # --- methods ------------------------------------------------------------------------

    def _rpc_getLatestBlockhash(self, params: list[Any]) -> dict[str, Any]:
        slot = self.svm.get_clock().slot
        value = RpcBlockhash(self.svm.latest_blockhash(), slot + BLOCKHASH_VALIDITY)
        return self._json(GetLatestBlockhashResp(value, self._context()))

    def _rpc_isBlockhashValid(self, params: list[Any]) -> dict[str, Any]:
        if not params or not isinstance(params[0], str):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected a blockhash")
        try:
            blockhash = Hash.from_string(params[0])
        except Exception:
            raise RpcError(INVALID_PARAMS, "Invalid param: Invalid") from None
        valid = blockhash == self.svm.latest_blockhash()
        # solders' stub omits the ``context`` argument its runtime takes.
        return self._json(IsBlockhashValidResp(valid, self._context()))  # type: ignore[call-arg]

    def _rpc_getAccountInfo(self, params: list[Any]) -> dict[str, Any]:
        config = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        encoding = config.get("encoding", "base64")
        if encoding not in ("base64", "base64+zstd", "jsonParsed"):
            raise RpcError(INVALID_PARAMS, "Invalid params: only base64 and jsonParsed encodings are served")
        account = self.svm.get_account(self._pubkey(params))
        if account is not None and account.lamports == 0 and not account.data:
            account = None
        parsed = self._parsed(account) if account is not None and encoding == "jsonParsed" else None
        if parsed is not None:
            return self._json(GetAccountInfoJsonParsedResp(parsed, self._context()))
        return self._json(GetAccountInfoResp(account, self._context()))

    def _rpc_getBalance(self, params: list[Any]) -> dict[str, Any]:
        balance = self.svm.get_balance(self._pubkey(params)) or 0
        return self._json(GetBalanceResp(balance, self._context()))

    def _rpc_getTokenAccountBalance(self, params: list[Any]) -> dict[str, Any]:
        account = self.svm.get_account(self._pubkey(params))
        if (
            account is None
            or account.owner not in (TOKEN_PROGRAM, TOKEN_2022_PROGRAM)
            or len(account.data) < 165
        ):
            raise RpcError(INVALID_PARAMS, "Invalid param: not a Token account")
        token = TokenAccount.from_bytes(bytes(account.data[:165]))
        value = ui_token_amount(token.amount, self._decimals(token.mint))
        return self._json(GetTokenAccountBalanceResp(value, self._context()))

    def _decimals(self, mint: Pubkey) -> int:
        account = self.svm.get_account(mint)
        return Mint.from_bytes(bytes(account.data[:82])).decimals if account is not None else 0

    def _rpc_getSlot(self, params: list[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "result": self.svm.get_clock().slot}

    def _rpc_getBlockHeight(self, params: list[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "result": self.svm.get_clock().slot}

    def _rpc_getMinimumBalanceForRentExemption(self, params: list[Any]) -> dict[str, Any]:
        if not params or not isinstance(params[0], int):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected a data length")
        return {"jsonrpc": "2.0", "result": self.svm.minimum_balance_for_rent_exemption(params[0])}

    def _rpc_getHealth(self, params: list[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "result": "ok"}

    def _rpc_getVersion(self, params: list[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "result": {"solana-core": "litesvm", "feature-set": 0}}

    def _rpc_getGenesisHash(self, params: list[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "result": MAINNET_GENESIS_HASH}

    def _simulate(
        self, tx: VersionedTransaction, sig_verify: bool, check_blockhash: bool = True
    ) -> RpcSimulateTransactionResult:
        self.svm.with_sigverify(sig_verify)
        self.svm.with_blockhash_check(check_blockhash)
        try:
            outcome = self.svm.simulate_transaction(tx)
        finally:
            self.svm.with_sigverify(True)
            self.svm.with_blockhash_check(True)
        err = outcome.err() if isinstance(outcome, FailedTransactionMetadata) else None
        meta = outcome.meta()
        return RpcSimulateTransactionResult(
            err=err, logs=list(meta.logs()), units_consumed=meta.compute_units_consumed()
        )

    def _rpc_simulateTransaction(self, params: list[Any]) -> dict[str, Any]:
        tx = self._transaction(params)
        config = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        if config.get("sigVerify") and config.get("replaceRecentBlockhash"):
            raise RpcError(INVALID_PARAMS, "sigVerify may not be used with replaceRecentBlockhash")
        result = self._simulate(
            tx, bool(config.get("sigVerify", False)), check_blockhash=not config.get("replaceRecentBlockhash")
        )
        # solders' stub omits the ``context`` argument its runtime takes.
        return self._json(SimulateTransactionResp(result, self._context()))  # type: ignore[call-arg]

    def _rpc_sendTransaction(self, params: list[Any]) -> dict[str, Any]:
        tx = self._transaction(params)
        config = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        if not all(tx.verify_with_results()):
            raise RpcError(SIGNATURE_VERIFICATION_FAILURE, "Transaction signature verification failure")
        if not config.get("skipPreflight", False):
            preflight = self._simulate(tx, True)
            if preflight.err is not None:
                raise RpcError(
                    PREFLIGHT_FAILURE,
                    f"Transaction simulation failed: {preflight.err}",
                    json.loads(preflight.to_json()),
                )
        signature = tx.signatures[0]
        self.sent.append(str(signature))
        with self._lock:  # checked and queued at once: a concurrent land_held sees it or not
            held, delay = self.hold_landing, self.land_delay_s
            if not (held or delay > 0):
                self._land(tx)
                return self._json(SendTransactionResp(signature))
            self._broadcasts += 1
            self._landing.append((self._broadcasts, held, tx))
            if not held:
                timer = threading.Timer(delay, self._land_until, (self._chain_number, self._broadcasts))
                timer.daemon = True
                timer.start()
        return self._json(SendTransactionResp(signature))

    def _land_until(self, chain_number: int, number: int) -> None:
        """A delayed transaction's time is up: land it, after those sent before it that still wait
        (their time is up too, unless a delay was shortened since), so transactions land in the
        order they were sent however the timer threads are scheduled. Held ones stay (and so do
        those sent after them), and a timer of the chain served before :meth:`use` lands nothing.
        """
        with self._lock:
            if chain_number != self._chain_number:
                return
            while self._landing and self._landing[0][0] <= number and not self._landing[0][1]:
                self._land(self._landing.popleft()[2])

    def _land(self, tx: VersionedTransaction) -> None:
        """Execute ``tx`` now and record it (a failed one too: its fee is charged all the same)."""
        key = str(tx.signatures[0])
        keys = list(tx.message.account_keys)
        pre = [self.svm.get_balance(k) or 0 for k in keys]
        outcome = self.svm.send_transaction(tx)
        err = outcome.err() if isinstance(outcome, FailedTransactionMetadata) else None
        dropped = isinstance(err, TransactionErrorFieldless) and any(err == e for e in _NOT_LANDED)
        if not dropped and key not in self._landed:
            meta = outcome.meta() if isinstance(outcome, FailedTransactionMetadata) else outcome
            self._landed[key] = _Landed(
                slot=self.svm.get_clock().slot,
                err=err,
                at=time.monotonic(),
                transaction=tx,
                logs=list(meta.logs()),
                units=meta.compute_units_consumed(),
                pre_balances=pre,
                post_balances=[self.svm.get_balance(k) or 0 for k in keys],
            )
            for address in keys:
                self._known[address] = None
                self._history.setdefault(address, []).append(key)
            if self.hold_confirmations:
                self._held.add(key)

    def _rpc_getSignatureStatuses(self, params: list[Any]) -> dict[str, Any]:
        if not params or not isinstance(params[0], list):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected an array of signatures")
        statuses: list[TransactionStatus | None] = []
        for text in params[0]:
            try:
                key = str(Signature.from_string(text))
            except Exception:
                raise RpcError(INVALID_PARAMS, "Invalid param: Invalid") from None
            landed = self._landed.get(key)
            if landed is None:
                statuses.append(None)
                continue
            level = self._level(key, landed)
            statuses.append(TransactionStatus(landed.slot, 0, None, landed.err, level))
        return self._json(GetSignatureStatusesResp(statuses, self._context()))

    def _level(self, key: str, landed: _Landed) -> TransactionConfirmationStatus:
        """``processed`` while held or younger than ``confirm_delay_s``, then ``confirmed``."""
        if key in self._held or time.monotonic() < landed.at + self.confirm_delay_s:
            return TransactionConfirmationStatus.Processed
        return TransactionConfirmationStatus.Confirmed

    def _parsed(self, account: Account) -> AccountJSON | None:
        """``jsonParsed`` of an SPL token account or mint, as a node answers; None for others
        (a node then falls back to base64)."""
        if account.owner not in (TOKEN_PROGRAM, TOKEN_2022_PROGRAM):
            return None
        data = bytes(account.data)
        program = "spl-token" if account.owner == TOKEN_PROGRAM else "spl-token-2022"
        info: dict[str, Any]
        if len(data) == TOKEN_ACCOUNT_SIZE:
            token = TokenAccount.from_bytes(data)
            amount = ui_token_amount(token.amount, self._decimals(token.mint))
            info = {
                "isNative": token.is_native is not None,
                "mint": str(token.mint),
                "owner": str(token.owner),
                "state": "frozen" if token.state == TokenAccountState.Frozen else "initialized",
                "tokenAmount": json.loads(amount.to_json()),
            }
            kind = "account"
        elif len(data) == MINT_SIZE:
            mint = Mint.from_bytes(data)
            info = {
                "decimals": mint.decimals,
                "freezeAuthority": str(mint.freeze_authority) if mint.freeze_authority else None,
                "isInitialized": mint.is_initialized,
                "mintAuthority": str(mint.mint_authority) if mint.mint_authority else None,
                "supply": str(mint.supply),
            }
            kind = "mint"
        else:
            return None
        parsed = ParsedAccount(program, {"info": info, "type": kind}, len(data))
        return AccountJSON(account.lamports, parsed, account.owner, account.executable, account.rent_epoch)

    # --- listings over the known accounts -------------------------------------------------

    @staticmethod
    def _config(params: list[Any], index: int, parsed_ok: bool = False) -> dict[str, Any]:
        config = params[index] if len(params) > index else {}
        if config is None:
            return {}
        if not isinstance(config, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected a config object")
        served = ("base64", "base64+zstd", "jsonParsed") if parsed_ok else ("base64", "base64+zstd")
        if config.get("encoding", "base64") not in served:
            raise RpcError(INVALID_PARAMS, f"Invalid params: encodings served here: {', '.join(served)}")
        return config

    def known_accounts(self) -> list[tuple[Pubkey, Account]]:
        """Every account the server knows of that exists (watched, or touched by a transaction)."""
        with self._lock:
            found = []
            for address in list(self._known):
                account = self.svm.get_account(address)
                if account is not None and (account.lamports or account.data):
                    found.append((address, account))
            return found

    @staticmethod
    def _sliced(account: Account, config: dict[str, Any]) -> Account:
        data_slice = config.get("dataSlice")
        if not isinstance(data_slice, dict):
            return account
        offset, length = int(data_slice.get("offset", 0)), int(data_slice.get("length", 0))
        data = bytes(account.data)[offset : offset + length]
        return Account(account.lamports, data, account.owner, account.executable, account.rent_epoch)

    @staticmethod
    def _matches(data: bytes, filters: list[Any]) -> bool:
        for item in filters:
            if not isinstance(item, dict):
                raise RpcError(INVALID_PARAMS, "Invalid params: filters must be objects")
            if "dataSize" in item:
                if len(data) != item["dataSize"]:
                    return False
            elif isinstance(memcmp := item.get("memcmp"), dict):
                encoding = memcmp.get("encoding", "base58")
                try:
                    wanted = (
                        base64.b64decode(memcmp["bytes"], validate=True)
                        if encoding == "base64"
                        else base58.b58decode(memcmp["bytes"])
                    )
                    offset = int(memcmp.get("offset", 0))
                except (KeyError, TypeError, ValueError, binascii.Error):
                    raise RpcError(INVALID_PARAMS, "Invalid params: bad memcmp filter") from None
                if data[offset : offset + len(wanted)] != wanted:
                    return False
            else:
                raise RpcError(INVALID_PARAMS, "Invalid params: unknown filter")
        return True

    def _rpc_getProgramAccounts(self, params: list[Any]) -> dict[str, Any]:
        program = self._pubkey(params)
        config = self._config(params, 1)
        filters = config.get("filters") or []
        if not isinstance(filters, list):
            raise RpcError(INVALID_PARAMS, "Invalid params: filters must be an array")
        value = [
            RpcKeyedAccount(address, self._sliced(account, config))
            for address, account in self.known_accounts()
            if account.owner == program and self._matches(bytes(account.data), filters)
        ]
        if config.get("withContext"):
            return self._json(GetProgramAccountsWithContextResp(value, self._context()))
        return self._json(GetProgramAccountsResp(value))

    def _rpc_getTokenAccountsByOwner(self, params: list[Any]) -> dict[str, Any]:
        owner = self._pubkey(params)
        select = params[1] if len(params) > 1 and isinstance(params[1], dict) else None
        if select is None or len(select) != 1 or not ({"mint", "programId"} & select.keys()):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected {mint} or {programId}")
        mint = Pubkey.from_string(select["mint"]) if "mint" in select else None
        program = Pubkey.from_string(select["programId"]) if "programId" in select else None
        config = self._config(params, 2, parsed_ok=True)
        as_parsed = config.get("encoding") == "jsonParsed"
        value = []
        parsed_value = []
        for address, account in self.known_accounts():
            if (
                account.owner not in (TOKEN_PROGRAM, TOKEN_2022_PROGRAM)
                or len(account.data) < TOKEN_ACCOUNT_SIZE
            ):
                continue
            token = TokenAccount.from_bytes(bytes(account.data[:TOKEN_ACCOUNT_SIZE]))
            if token.owner != owner or (mint is not None and token.mint != mint):
                continue
            if program is not None and account.owner != program:
                continue
            parsed = self._parsed(account) if as_parsed else None
            if parsed is not None:
                parsed_value.append(RpcKeyedAccountJsonParsed(address, parsed))
            else:
                value.append(RpcKeyedAccount(address, self._sliced(account, config)))
        if as_parsed:
            return self._json(GetTokenAccountsByOwnerJsonParsedResp(parsed_value, self._context()))
        return self._json(GetTokenAccountsByOwnerResp(value, self._context()))

    def _rpc_getSignaturesForAddress(self, params: list[Any]) -> dict[str, Any]:
        address = self._pubkey(params)
        config = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        limit = min(int(config.get("limit", MAX_SIGNATURES)), MAX_SIGNATURES)
        newest_first = list(reversed(self._history.get(address, [])))
        if config.get("before") in newest_first:
            newest_first = newest_first[newest_first.index(config["before"]) + 1 :]
        if config.get("until") in newest_first:
            newest_first = newest_first[: newest_first.index(config["until"])]
        value = []
        for key in newest_first[:limit]:
            landed = self._landed[key]
            level = self._level(key, landed)
            value.append(
                RpcConfirmedTransactionStatusWithSignature(
                    Signature.from_string(key), landed.slot, landed.err, confirmation_status=level
                )
            )
        return self._json(GetSignaturesForAddressResp(value))

    def _rpc_getTransaction(self, params: list[Any]) -> dict[str, Any]:
        if not params or not isinstance(params[0], str):
            raise RpcError(INVALID_PARAMS, "Invalid params: expected a signature")
        config = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
        if config.get("encoding", "json") != "base64":
            raise RpcError(INVALID_PARAMS, "Invalid params: only base64 encoding is served")
        try:
            key = str(Signature.from_string(params[0]))
        except Exception:
            raise RpcError(INVALID_PARAMS, "Invalid param: Invalid") from None
        landed = self._landed.get(key)
        if landed is None or landed.transaction is None:
            return self._json(GetTransactionResp(None))
        tx = landed.transaction
        meta = UiTransactionStatusMeta(
            err=landed.err,
            fee=max(landed.pre_balances[0] - landed.post_balances[0], 0) if landed.pre_balances else 0,
            pre_balances=landed.pre_balances,
            post_balances=landed.post_balances,
            log_messages=landed.logs,
            compute_units_consumed=landed.units,
        )
        version = 0 if isinstance(tx.message, MessageV0) else Legacy.Legacy
        value = EncodedConfirmedTransactionWithStatusMeta(
            landed.slot, EncodedTransactionWithStatusMeta(tx, meta, version)
        )
        return self._json(GetTransactionResp(value))


class _Handler(BaseHTTPRequestHandler):
    rpc: LiteSvmRpcServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 30

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            request = json.loads(raw)
        except ValueError:
            answer: Any = {
                "jsonrpc": "2.0",
                "error": {"code": PARSE_ERROR, "message": "Parse error"},
                "id": None,
            }
        else:
            if isinstance(request, list):
                answer = [self.rpc.handle(item) for item in request]
            else:
                answer = self.rpc.handle(request)
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


# --- a chain to pay on ------------------------------------------------------------------------


def set_mint(
    svm: LiteSVM,
    mint: Pubkey,
    *,
    decimals: int = 6,
    token_program: Pubkey = TOKEN_PROGRAM,
    supply: int = 10**15,
) -> None:
    """Write an initialized mint account (no authorities) at ``mint``."""
    data = bytes(
        Mint(
            mint_authority=None, supply=supply, decimals=decimals, is_initialized=True, freeze_authority=None
        )
    )
    svm.set_account(
        mint, Account(svm.minimum_balance_for_rent_exemption(len(data)), data, token_program, False)
    )


def set_token_account(
    svm: LiteSVM,
    owner: Pubkey,
    mint: Pubkey,
    amount: int,
    *,
    token_program: Pubkey = TOKEN_PROGRAM,
    address: Pubkey | None = None,
) -> Pubkey:
    """Write a token account of ``owner`` for ``mint`` holding ``amount`` at ``address`` (default:
    its associated token account); returns its address."""
    address = address or get_associated_token_address(owner, mint, token_program)
    data = bytes(
        TokenAccount(
            mint=mint,
            owner=owner,
            amount=amount,
            delegate=None,
            state=TokenAccountState.Initialized,
            is_native=None,
            delegated_amount=0,
            close_authority=None,
        )
    )
    svm.set_account(
        address, Account(svm.minimum_balance_for_rent_exemption(len(data)), data, token_program, False)
    )
    return address


def ui_token_amount(amount: int, decimals: int) -> UiTokenAmount:
    """A token amount as RPC nodes show it (``amount`` string, ``uiAmount``, ``uiAmountString``)."""
    ui = amount / 10**decimals
    ui_string = f"{ui:.{decimals}f}".rstrip("0").rstrip(".") if decimals else str(amount)
    return UiTokenAmount(ui, decimals, str(amount), ui_string)


def token_balance(svm: LiteSVM, address: Pubkey) -> int | None:
    """The token amount held at ``address``, or None when there is no token account."""
    account = svm.get_account(address)
    if account is None or len(account.data) < 165:
        return None
    return int(TokenAccount.from_bytes(bytes(account.data[:165])).amount)


@dataclass
class UsdcChain:
    """A LiteSVM with a USDC-like mint, a funded payer, payTo's token account and a fee payer."""

    svm: LiteSVM
    mint: Pubkey
    decimals: int
    token_program: Pubkey
    payer: Keypair
    payer_ata: Pubkey
    pay_to: Pubkey
    pay_to_ata: Pubkey
    fee_payer: Keypair

    def balance(self, address: Pubkey) -> int | None:
        return token_balance(self.svm, address)

    def lamports(self, address: Pubkey) -> int:
        return int(self.svm.get_balance(address) or 0)

    @property
    def blockhash(self) -> Hash:
        return self.svm.latest_blockhash()

    @property
    def addresses(self) -> list[Pubkey]:
        """Every account the chain was set up with (for :meth:`LiteSvmRpcServer.watch`)."""
        return [
            self.mint,
            self.payer.pubkey(),
            self.payer_ata,
            self.pay_to,
            self.pay_to_ata,
            self.fee_payer.pubkey(),
        ]


def setup_usdc_chain(
    svm: LiteSVM | None = None,
    *,
    mint: Pubkey = USDC_MAINNET_MINT,
    decimals: int = 6,
    token_program: Pubkey = TOKEN_PROGRAM,
    payer: Keypair | None = None,
    payer_amount: int = 1_000_000_000,
    pay_to: Pubkey | None = None,
    create_pay_to_account: bool = True,
    fee_payer: Keypair | None = None,
    fee_payer_lamports: int = 10_000_000_000,
) -> UsdcChain:
    """Mint at ``mint`` (the real mainnet USDC address by default), payer with ``payer_amount``
    micro-USDC and no SOL, payTo's (empty) associated token account, an airdropped fee payer."""
    svm = svm if svm is not None else LiteSVM()
    payer = payer or Keypair()
    pay_to = pay_to or Keypair().pubkey()
    fee_payer = fee_payer or Keypair()
    set_mint(svm, mint, decimals=decimals, token_program=token_program)
    payer_ata = set_token_account(svm, payer.pubkey(), mint, payer_amount, token_program=token_program)
    pay_to_ata = get_associated_token_address(pay_to, mint, token_program)
    if create_pay_to_account:
        set_token_account(svm, pay_to, mint, 0, token_program=token_program)
    svm.airdrop(fee_payer.pubkey(), fee_payer_lamports)
    return UsdcChain(
        svm=svm,
        mint=mint,
        decimals=decimals,
        token_program=token_program,
        payer=payer,
        payer_ata=payer_ata,
        pay_to=pay_to,
        pay_to_ata=pay_to_ata,
        fee_payer=fee_payer,
    )
