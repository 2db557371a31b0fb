"""Shared fixtures: each real server the suite needs lives in a plugin under tests/support/."""

pytest_plugins = [
    "tests.support.redis_fixtures",
]
