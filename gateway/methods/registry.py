"""The one registry of ways of paying: each a :class:`PaymentMethod` object.

A method object carries its description (:class:`~gateway.routing.vocabulary.AccessMode`: its
scheme, credential and receipt headers, outcomes, error statuses) and its binder: it picks the
typed dependencies it uses from the app's shared parts (:meth:`PaymentMethod.dependencies`,
called once per app by the composition root, ``gateway.app``) and binds itself to one route
with them (:meth:`PaymentMethod.bind`). :func:`register` is the one call a new method needs: it
adds the description to the words routes.yaml may use (so the loader, the catalog, the OpenAPI
document, CORS, the metrics and the CLI know it) and the object to the methods the app binds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gateway.methods.credit.method import CREDIT
from gateway.methods.exact.method import EXACT
from gateway.methods.sign_in import SIGN_IN
from gateway.routing.vocabulary import (
    PAYMENT_METHODS,
    AccessMode,
    register_payment_method,
    unregister_payment_method,
)

if TYPE_CHECKING:
    from gateway.methods.seam import RouteMethod
    from gateway.methods.shared import SharedParts
    from gateway.routing.routes import RouteSpec

Deps = TypeVar("Deps")


class PaymentMethod(Protocol[Deps]):
    """One way of paying: what it is, and how it binds to a route."""

    @property
    def name(self) -> str:
        """Its word in routes.yaml."""
        ...

    @property
    def mode(self) -> AccessMode:
        """Its description: what the routing layer, the catalog, OpenAPI, CORS and metrics read."""
        ...

    def dependencies(self, parts: SharedParts) -> Deps:
        """Exactly what its routes use, taken once per app from the app's shared parts."""
        ...

    def bind(self, route: RouteSpec, deps: Deps) -> RouteMethod[Any]:
        """The method bound to ``route``."""
        ...


METHODS: dict[str, PaymentMethod[Any]] = {}
"""Every registered way of paying, by its word in routes.yaml."""


def register(method: PaymentMethod[Any]) -> None:
    """Add a way of paying: its word to routes.yaml's vocabulary, its binder to the app's."""
    register_payment_method(method.name, method.mode)
    METHODS[method.name] = method


def unregister(name: str) -> None:
    METHODS.pop(name, None)
    unregister_payment_method(name)


def registered(names: Sequence[str]) -> list[PaymentMethod[Any]]:
    """The method objects of ``names``, in that order."""
    return [METHODS[name] for name in names]


BUILT_IN: tuple[PaymentMethod[Any], ...] = (EXACT, CREDIT, SIGN_IN)
"""The gateway's own ways of paying (typed here, so a static checker holds each to the protocol)."""

for _builtin in BUILT_IN:
    assert PAYMENT_METHODS[_builtin.name] is _builtin.mode
    METHODS[_builtin.name] = _builtin
