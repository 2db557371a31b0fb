"""The local chain's listing methods and the DAS sample, called through the JSON-RPC dispatcher."""

from __future__ import annotations

from typing import Any

from solders.keypair import Keypair

from gateway.sandbox.chain import TOKEN_PROGRAM, LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from gateway.sandbox.upstreams import das_methods
from gateway.x402.svm import encode_transaction, sign_as_fee_payer
from gateway.x402.svm_payer import MintInfo, build_exact_transaction
from gateway.x402.types import SOLANA_MAINNET, PaymentRequirements


def _call(server: LiteSvmRpcServer, method: str, params: Any) -> Any:
    answer = server.handle({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    assert "error" not in answer, answer
    return answer["result"]


def _paid_chain() -> tuple[UsdcChain, LiteSvmRpcServer, str]:
    chain = setup_usdc_chain()
    server = LiteSvmRpcServer(svm=chain.svm, extra_methods=das_methods())
    server.watch(*chain.addresses)
    requirements = PaymentRequirements(
        scheme="exact",
        network=SOLANA_MAINNET,
        amount="1005",
        asset=str(chain.mint),
        payTo=str(chain.pay_to),
        maxTimeoutSeconds=60,
        extra={"feePayer": str(chain.fee_payer.pubkey())},
    )
    tx = build_exact_transaction(requirements, chain.payer, MintInfo(str(chain.mint), 6), chain.blockhash)
    signed = encode_transaction(sign_as_fee_payer(tx, chain.fee_payer))
    signature: str = _call(server, "sendTransaction", [signed, {"encoding": "base64"}])
    return chain, server, signature


def test_landed_payments_are_listed_and_readable() -> None:
    chain, server, signature = _paid_chain()
    listed = _call(server, "getSignaturesForAddress", [str(chain.payer.pubkey()), {"limit": 5}])
    assert [s["signature"] for s in listed] == [signature]
    tx = _call(server, "getTransaction", [signature, {"encoding": "base64"}])
    assert tx["meta"]["err"] is None and tx["transaction"][1] == "base64"


def test_token_accounts_by_owner_and_program_accounts_filter_the_known_accounts() -> None:
    chain, server, _ = _paid_chain()
    owner = str(chain.pay_to)
    by_owner = _call(server, "getTokenAccountsByOwner", [owner, {"mint": str(chain.mint)}])
    assert [a["pubkey"] for a in by_owner["value"]] == [str(chain.pay_to_ata)]
    filters = [{"dataSize": 165}, {"memcmp": {"offset": 32, "bytes": owner}}]
    config = {"filters": filters, "dataSlice": {"offset": 64, "length": 8}}
    program = _call(server, "getProgramAccounts", [str(TOKEN_PROGRAM), config])
    assert [a["pubkey"] for a in program] == [str(chain.pay_to_ata)]
    stranger = str(Keypair().pubkey())
    assert _call(server, "getTokenAccountsByOwner", [stranger, {"mint": str(chain.mint)}])["value"] == []


def test_das_sample_answers_are_deterministic_and_marked() -> None:
    _, server, _ = _paid_chain()
    owner = str(Keypair().pubkey())
    first = _call(server, "getAssetsByOwner", {"ownerAddress": owner, "limit": 2})
    assert first == _call(server, "getAssetsByOwner", {"ownerAddress": owner, "limit": 2})
    assert first["sandbox"] is True and len(first["items"]) == 2
    asset = _call(server, "getAsset", {"id": owner})
    assert asset["sandbox"] is True and asset["id"] == owner
    assert _call(server, "searchAssets", [{"limit": 3}])["sandbox"] is True
