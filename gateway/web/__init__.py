"""Speaking ASGI: the router, bounded bodies, the client's IP, request context, failures as errors."""
