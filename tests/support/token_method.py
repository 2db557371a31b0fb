"""A payment method that exists only in the test suite: a fixed token in ``X-Test-Token``.

It proves the seam: this one module and one registration line
(``gateway.methods.registry.register(token_method.METHOD)``) are all a new way of paying needs.
It has its own credential header (``X-Test-Token``), its own receipt header
(``X-Test-Receipt``) and its own outcome (``token_spent``); the route table, the 402, CORS, the
catalog, OpenAPI, the metrics and the CLI learn of all three from its description.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.methods.exact.ledger import StoredResponse
from gateway.methods.results import Delivered, Refused, Settled
from gateway.methods.seam import Admitted, Answer, Asked, Checked, Incoming, Offer, credential_headers
from gateway.methods.shared import SharedParts
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import RequestValidator
from gateway.routing.vocabulary import AccessMode, Credential, Outcome

NAME = "test_token"
TOKEN = "open-sesame"
SPENT = "token_spent"
"""Its own outcome: a call paid with the token (a metrics series of its own)."""
RECEIPT = "X-Test-Receipt"
MODE = AccessMode(
    scheme="test-token",
    rate_limit_per=("scope",),
    error_statuses=(400, 402, 405, 413, 502, 504),
    credentials=(Credential("X-Test-Token", "The suite's fixed test token."),),
    receipts=(Credential(RECEIPT, "Which token paid, and for which route."),),
    outcomes=(Outcome.CHALLENGED, Outcome.REJECTED, SPENT, Outcome.UPSTREAM_FAILED),
    usage=(
        (Outcome.CHALLENGED, "unpaid"),
        (Outcome.REJECTED, "failed"),
        (SPENT, "token"),
        (Outcome.UPSTREAM_FAILED, "failed"),
    ),
)


@dataclass
class TokenLedger:
    """What every bound route finished and abandoned (shared, so a test can read it)."""

    finished: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)


LEDGER = TokenLedger()


class TokenMethod:
    credential_headers = credential_headers(MODE)

    def __init__(self, route: RouteSpec, ledger: TokenLedger) -> None:
        self.route_name = route.name
        self.validator = RequestValidator(route.input)
        self.ledger = ledger

    async def challenge(self, asked: Asked, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        body = msgspec.json.encode(
            {"x402Version": 2, "accepts": [{"scheme": "test-token", "network": "test"}], "error": error}
        )
        return Offer(body, [(b"content-type", b"application/json")])

    async def extensions(self, asked: Asked) -> Mapping[str, Any]:
        return {}

    async def check(self, incoming: Incoming) -> Checked[str]:
        if incoming.credential != TOKEN:
            return Checked(Refused("invalid_token", "not the test token"))
        body = self.validator.body(await incoming.read_body())
        return Checked(Admitted(self.route_name, body, "0"), payer="token-holder")

    async def finish(self, grant: str, answer: Answer) -> Settled:
        self.ledger.finished.append(grant)
        receipt = {RECEIPT: f"{TOKEN[:4]}:{grant}"}
        return Delivered(StoredResponse(200, answer.body, answer.content_type, receipts=receipt), "", SPENT)

    async def abandon(self, grant: str) -> None:
        self.ledger.abandoned.append(grant)


@dataclass(frozen=True, slots=True)
class TokenPayment:
    """The method object: its description, its typed dependencies (the ledger), its binder."""

    name: str = NAME
    mode: AccessMode = MODE

    def dependencies(self, parts: SharedParts) -> TokenLedger:
        return LEDGER

    def bind(self, route: RouteSpec, deps: TokenLedger) -> TokenMethod:
        return TokenMethod(route, deps)


METHOD = TokenPayment()
