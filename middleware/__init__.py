"""Pure-ASGI middlewares, one concern each; stacked per route by gateway.app."""
