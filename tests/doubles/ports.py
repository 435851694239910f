"""Ports for servers that tests start on 127.0.0.1, and one Serve HTTP port per parallel
test worker.

Under pytest-xdist (`-n 2`) each worker starts its own local Ray, and each Ray's Serve
would put its proxy on 8000. Serve binds with SO_REUSEPORT, so the second proxy starts
without complaint and the kernel then hands each connection to either cluster: a job of
one worker could be answered by the other's app. `pin_worker_serve_port` gives the worker
a free port as $REXEVAL_SERVE_PORT (the product's default for every Serve it starts), and
makes a Serve that a test starts bare (`serve.run` with no `serve.start`) take it too.

That port is held for the whole session but bound only while a Serve runs, so it must be
one no other process is handed in between: not from the kernel's ephemeral range (every
outgoing connection, Ray's many among them, takes a local port from it; one did take a
worker's port in CI, and the next Serve failed to bind), and not from the block that
`tests/doubles/local_cluster.py` gives its clusters' ports. It comes from the gap between.
"""
from __future__ import annotations

import os
import random
import socket

from rexeval.serve.common import SERVE_PORT_ENV, default_serve_port

SERVE_DEFAULT_PORT = 8000  # Serve's own default (ray.serve._private.constants.DEFAULT_HTTP_PORT)
CLUSTER_PORT_LOW, CLUSTER_PORT_HIGH = 20000, 32000  # local_cluster.reserve_ports' block
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_low(path: str = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel hands out by itself (Linux's default is 32768)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def session_port(low: int = CLUSTER_PORT_HIGH, high: int | None = None, tries: int = 100) -> int:
    """A free port in [low, high) (high: the ephemeral range's start), so that no outgoing
    connection or other test's cluster is handed it while the session holds it unbound.
    Falls back to `free_port()` where that gap is empty or full."""
    high = ephemeral_low() if high is None else high
    for _ in range(tries if high > low else 0):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return free_port()


def pin_worker_serve_port() -> None:
    """In an xdist worker: $REXEVAL_SERVE_PORT set to a free port (once), and Serve's
    controller creation patched so an unset or default (8000) HTTP port becomes it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.environ.setdefault(SERVE_PORT_ENV, str(session_port()))
    from ray.serve._private import api
    from ray.serve.config import HTTPOptions

    create = api._create_controller_and_proxy_refs
    if getattr(create, "_rexeval_pinned", False):
        return

    def pinned(http_options, *args, **kwargs):
        if http_options is None:
            http_options = {}
        if isinstance(http_options, HTTPOptions):
            http_options = http_options.model_dump()
        if http_options.get("port", SERVE_DEFAULT_PORT) == SERVE_DEFAULT_PORT:
            http_options = {**http_options, "port": default_serve_port()}
        return create(http_options, *args, **kwargs)

    pinned._rexeval_pinned = True
    api._create_controller_and_proxy_refs = pinned
