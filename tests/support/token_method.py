"""A payment method that exists only in the test suite: a fixed token in ``X-Test-Token``.

It proves the seam: one module (this one) and one registration
(:func:`gateway.routing.vocabulary.register_payment_method`) are all a new way of paying needs; the
route table, the 402, the catalog, OpenAPI, the metrics and the CLI learn of it from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.methods.exact.ledger import StoredResponse
from gateway.methods.results import Delivered, Refused, Settled
from gateway.methods.seam import Admitted, Answer, Checked, Incoming, Offer, credential_headers
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import RequestValidator
from gateway.routing.vocabulary import AccessMode, Credential, Outcome
from gateway.services import Services

NAME = "test_token"
TOKEN = "open-sesame"
MODE = AccessMode(
    scheme="test-token",
    rate_limit_per=("scope",),
    error_statuses=(400, 402, 405, 413, 502, 504),
    credentials=(Credential("X-Test-Token", "The suite's fixed test token."),),
    outcomes=(Outcome.CHALLENGED, Outcome.REJECTED, Outcome.PAID, Outcome.UPSTREAM_FAILED),
    binder="tests.support.token_method:bind",
)


@dataclass
class TokenLedger:
    """What every bound route finished and abandoned (shared, so a test can read it)."""

    finished: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)


LEDGER = TokenLedger()


class TokenMethod:
    credential_headers = credential_headers(MODE)

    def __init__(self, route: RouteSpec) -> None:
        self.route_name = route.name
        self.validator = RequestValidator(route.input)

    async def challenge(self, path: str, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        body = msgspec.json.encode(
            {"x402Version": 2, "accepts": [{"scheme": "test-token", "network": "test"}], "error": error}
        )
        return Offer(body, [(b"content-type", b"application/json")])

    async def extensions(self, path: str) -> Mapping[str, Any]:
        return {}

    async def check(self, incoming: Incoming) -> Checked[str]:
        if incoming.credential != TOKEN:
            return Checked(Refused("invalid_token", "not the test token"))
        body = self.validator.body(await incoming.read_body())
        return Checked(Admitted(self.route_name, body, "0"), payer="token-holder")

    async def finish(self, grant: str, answer: Answer) -> Settled:
        LEDGER.finished.append(grant)
        return Delivered(StoredResponse(200, answer.body, answer.content_type), settlement="token")

    async def abandon(self, grant: str) -> None:
        LEDGER.abandoned.append(grant)


def bind(route: RouteSpec, services: Services) -> TokenMethod:
    return TokenMethod(route)
