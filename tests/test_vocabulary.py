"""The route vocabulary is declared once: the app builds exactly the words the loader accepts."""

from __future__ import annotations

import pytest

from gateway.app import ACCESS_LAYERS, HANDLER_FACTORIES, UnbuildableRoute, create_app
from gateway.config import Settings
from gateway.methods.registry import METHODS
from gateway.routing.routes import RouteSpec
from gateway.routing.vocabulary import ACCESS_MODES, HANDLERS, PAYMENT_METHODS


def test_the_app_has_a_factory_for_every_handler_and_nothing_else() -> None:
    assert set(HANDLER_FACTORIES) == set(HANDLERS)


def test_the_app_has_a_layer_for_every_access_mode_and_nothing_else() -> None:
    """The built-in modes have their own layers; every payment method is a registered object
    whose description is the vocabulary's."""
    assert set(ACCESS_LAYERS) | set(PAYMENT_METHODS) == set(ACCESS_MODES)
    assert not set(ACCESS_LAYERS) & set(PAYMENT_METHODS)
    assert set(METHODS) == set(PAYMENT_METHODS)
    for name, method in METHODS.items():
        assert method.name == name and method.mode is PAYMENT_METHODS[name], name


@pytest.mark.parametrize(
    ("handler", "access", "refusal"),
    [
        ("teapot", "public", "route brew: no factory for handler 'teapot'"),
        ("health", "open", "route brew: no layer for access mode 'open'"),
    ],
)
def test_create_app_refuses_a_route_it_cannot_build_instead_of_dropping_it(
    handler: str, access: str, refusal: str
) -> None:
    route = RouteSpec(
        name="brew",
        path="/brew",
        method="GET",
        access=access,
        handler=handler,
        group="service",
        description="x",
    )

    with pytest.raises(UnbuildableRoute) as refused:
        create_app(Settings(base_url="https://gw.example"), routes=[route])

    assert str(refused.value) == refusal
