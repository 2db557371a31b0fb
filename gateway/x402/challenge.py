"""The 402 challenge of an exact route, built once per route and re-encoded only when the
facilitator's fee payer changes: nothing is decided per request that can be decided at
start-up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from gateway.x402.headers import encode_header
from gateway.x402.types import (
    ChallengeAccept,
    FacilitatorRef,
    PaymentRequired,
    PaymentRequirements,
    ResourceInfo,
)

MAX_CACHED_CHALLENGES = 64
PAYMENT_IDENTIFIER = "payment-identifier"
BAZAAR = "bazaar"
PAYMENT_ID_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "required": {"type": "boolean"},
        "id": {"type": "string", "minLength": 16, "maxLength": 128, "pattern": "^[a-zA-Z0-9_-]+$"},
    },
    "required": ["required"],
}


def bazaar_extension(
    method: str, body_schema: dict[str, Any] | None, output: dict[str, Any] | None
) -> dict[str, Any]:
    """The v2 ``bazaar`` discovery extension: how to call the resource, as info plus schema.

    ``info`` must validate against ``schema`` (the route's own schemas), or an indexer drops the
    listing: its example body is the body schema's first ``examples`` entry, which the route
    loader checks against that schema (an empty object without one, which it checks too)."""
    examples = (body_schema or {}).get("examples")
    info_input: dict[str, Any] = {
        "type": "http",
        "method": method,
        "bodyType": "json",
        "body": examples[0] if isinstance(examples, list) and examples else {},
    }
    return {
        "info": {"input": info_input, "output": {"type": "json"}},
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "input": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string", "const": "http"},
                        "method": {"type": "string", "enum": [method]},
                        "bodyType": {"type": "string", "enum": ["json"]},
                        "body": body_schema or {"type": "object"},
                    },
                    "required": ["type", "method", "bodyType", "body"],
                },
                "output": {
                    "type": "object",
                    "properties": {"type": {"type": "string"}, "example": output or {}},
                },
            },
            "required": ["input"],
        },
    }


class ExactChallenge:
    """One route's PaymentRequired; ``render`` gives (JSON body, PAYMENT-REQUIRED header value)."""

    def __init__(
        self,
        requirements: PaymentRequirements,
        resource_url: str,
        description: str,
        input_schema: dict[str, Any] | None,
        output_schema: dict[str, Any] | None,
        facilitator_url: str,
        method: str,
    ) -> None:
        self.requirements = requirements
        self.resource = ResourceInfo(url=resource_url, description=description, mimeType="application/json")
        self.description = description
        self.output_schema = {"input": input_schema or {}, "output": output_schema or {}}
        self.facilitator = FacilitatorRef(url=facilitator_url)
        self.extensions: dict[str, Any] = {
            BAZAAR: bazaar_extension(method, input_schema, output_schema),
            PAYMENT_IDENTIFIER: {"info": {"required": False}, "schema": PAYMENT_ID_SCHEMA},
        }
        self._offered: dict[
            tuple[tuple[tuple[int, str | None], ...], str | None], tuple[bytes, list[tuple[bytes, bytes]]]
        ] = {}

    def requirements_for(self, fee_payer: str | None) -> PaymentRequirements:
        """What the facilitator is asked to verify and settle: v2 fields only. Without a known
        fee payer (the facilitator never answered) ``extra.feePayer`` is left out."""
        extra = {**(self.requirements.extra or {})}
        if fee_payer is not None:
            extra["feePayer"] = fee_payer
        return msgspec.structs.replace(self.requirements, extra=extra or None)

    def build(self, fee_payer: str | None, error: str | None = None) -> PaymentRequired:
        """The JSON body: the envelope whose ``accepts[0]`` also carries the v1 names and the
        discovery fields (``maxAmountRequired``, ``resource``, ``outputSchema``, ``facilitator``).
        The v2 ``extensions`` (bazaar, payment-identifier) travel in the header only: a v2 client
        reads the header whenever it is there, which it always is, and a v1 client knows none."""
        fields = msgspec.structs.asdict(self.requirements_for(fee_payer))
        accept = ChallengeAccept(
            **fields,
            maxAmountRequired=self.requirements.amount,
            resource=self.resource.url,
            description=self.description,
            mimeType="application/json",
            outputSchema=self.output_schema,
            facilitator=self.facilitator,
        )
        return PaymentRequired(x402Version=2, resource=self.resource, accepts=[accept], error=error)

    def build_header(self, fee_payer: str | None, error: str | None = None) -> PaymentRequired:
        """The ``PAYMENT-REQUIRED`` header: v2 only, with the extensions. v2 clients read the
        header and ignore v1 names, and the route's schemas already travel in the ``bazaar``
        extension, so the v1 copies (``outputSchema`` above all) stay in the body, where v1
        clients look. Nothing is sent twice."""
        fields = msgspec.structs.asdict(self.requirements_for(fee_payer))
        return PaymentRequired(
            x402Version=2,
            resource=self.resource,
            accepts=[ChallengeAccept(**fields)],
            error=error,
            extensions=self.extensions,
        )

    def render(self, fee_payer: str | None, error: str | None = None) -> tuple[bytes, str]:
        """Encoded JSON body and PAYMENT-REQUIRED header value."""
        body = msgspec.json.encode(self.build(fee_payer, error))
        return body, encode_header(self.build_header(fee_payer, error))

    def response(
        self, fee_payer: str | None, error: str | None = None
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """Body and complete ASGI headers of the 402, encoded once per (fee payer, error): the
        error-free one is every first request's and crawler's answer, and a refusal's reason comes
        from a short list. The cache is bounded, as a facilitator's reason text is not ours."""
        return self.offering([(self, fee_payer)], error)

    def offering(
        self,
        offers: Sequence[tuple[ExactChallenge, str | None]],
        error: str | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The 402 offering each (challenge, fee payer) in ``offers`` in order, one ``accepts``
        entry each (several facilitators: each its own fee payer and price); this challenge gives
        the resource and extensions, to which ``extensions`` (another way of paying this route,
        fresh per challenge) are added. Without those, encoded once per (offers, error), like
        :meth:`response`."""
        key = (tuple((id(challenge), fee_payer) for challenge, fee_payer in offers), error)
        cached = None if extensions else self._offered.get(key)
        if cached is not None:
            return cached[0], list(cached[1])
        body_doc = self.build(offers[0][1], error)
        header_doc = self.build_header(offers[0][1], error)
        if extensions:
            header_doc.extensions = {**self.extensions, **extensions}
        for challenge, fee_payer in offers[1:]:
            body_doc.accepts.append(challenge.build(fee_payer, error).accepts[0])
            header_doc.accepts.append(challenge.build_header(fee_payer, error).accepts[0])
        body = msgspec.json.encode(body_doc)
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", b"no-store"),
            (b"payment-required", encode_header(header_doc).encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        if not extensions and len(self._offered) < MAX_CACHED_CHALLENGES:
            self._offered[key] = (body, headers)
        return body, list(headers)
