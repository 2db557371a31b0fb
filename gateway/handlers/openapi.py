"""``GET /openapi.json``: the OpenAPI 3.1 document of the served routes, encoded once."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gateway.batch.describe import openapi_operation
from gateway.batch.endpoint import BatchEndpoint
from gateway.routing.openapi import build_openapi
from gateway.routing.pricing import CreditTerms, FacilitatorFee
from gateway.routing.routes import RouteSpec
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes


class OpenApiHandler:
    """Serve the document of the mounted, listed routes (precomputed at start-up)."""

    def __init__(
        self,
        mounted: Sequence[RouteSpec],
        base_url: str,
        asset: str,
        pay_to: str,
        fee: FacilitatorFee,
        credit: CreditTerms | None = None,
        endpoints: Sequence[BatchEndpoint] = (),
    ) -> None:
        extra = {e.path: {"post": openapi_operation(e, fee, credit)} for e in endpoints}
        self.body = msgspec.json.encode(build_openapi(mounted, base_url, asset, pay_to, fee, credit, extra))
        self.headers = [JSON_CONTENT_TYPE, (b"cache-control", b"public, max-age=60")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, self.body, self.headers)
