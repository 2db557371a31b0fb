"""Loopback ports for tests that run side by side (several pytest workers, many servers each).

A port chosen by binding port 0 and closing the socket can be taken by another process before
the server binds it. Servers run inside the test process therefore get an already-bound socket
(:func:`bound_socket`); subprocesses get :func:`free_port` and are restarted on a fresh one when
it was taken. A test that needs a port where nothing ever answers uses :func:`refusing_port`.
"""

from __future__ import annotations

import socket

_HELD: list[socket.socket] = []

PORT_TAKEN = "Address already in use"
"""What a subprocess server prints when its free port was taken before it could bind it."""
START_ATTEMPTS = 5
"""How many fresh ports a subprocess server is started on before its failure stands."""


def bound_socket() -> socket.socket:
    """A TCP socket bound to a fresh loopback port, not yet listening: hand it to the server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def free_port() -> int:
    """A loopback port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with bound_socket() as sock:
        port: int = sock.getsockname()[1]
        return port


def refusing_port() -> int:
    """A loopback port where every connection is refused for the rest of the test session.

    The port stays bound, never listening, by a socket this process keeps, so no other server
    can take it: "nothing listens there" holds however many tests run at once.
    """
    sock = bound_socket()
    _HELD.append(sock)
    port: int = sock.getsockname()[1]
    return port
