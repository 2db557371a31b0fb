"""Shared fixtures: each real server the suite needs lives in a plugin under tests/support/."""

pytest_plugins = [
    "tests.support.redis_fixtures",
    "tests.support.gateway_fixtures",
    "tests.support.facilitator_fixtures",
    "tests.support.solana_fixtures",
    "tests.support.paid_fixtures",
]
