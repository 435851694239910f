"""Ports for servers that tests start on 127.0.0.1, and one Serve HTTP port per parallel
test worker.

Under pytest-xdist (`-n 2`) each worker starts its own local Ray, and each Ray's Serve
would put its proxy on 8000. Serve binds with SO_REUSEPORT, so the second proxy starts
without complaint and the kernel then hands each connection to either cluster: a job of
one worker could be answered by the other's app. `pin_worker_serve_port` gives the worker
a free port as $REXEVAL_SERVE_PORT (the product's default for every Serve it starts), and
makes a Serve that a test starts bare (`serve.run` with no `serve.start`) take it too.
"""
from __future__ import annotations

import os
import socket

from rexeval.serve.common import SERVE_PORT_ENV, default_serve_port

SERVE_DEFAULT_PORT = 8000  # Serve's own default (ray.serve._private.constants.DEFAULT_HTTP_PORT)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin_worker_serve_port() -> None:
    """In an xdist worker: $REXEVAL_SERVE_PORT set to a free port (once), and Serve's
    controller creation patched so an unset or default (8000) HTTP port becomes it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.environ.setdefault(SERVE_PORT_ENV, str(free_port()))
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
