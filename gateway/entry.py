"""The ASGI entry point hypercorn workers import: ``gateway.entry:app_from_env()``."""

from __future__ import annotations

import os

from starlette.applications import Starlette

from gateway.app import create_app
from gateway.config import load_settings


def app_from_env() -> Starlette:
    """Build the app from the process environment (each worker process builds its own)."""
    return create_app(load_settings(os.environ))
