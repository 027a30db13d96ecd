"""The explorer on a real loopback port, for the tests that need a live connection.

uvicorn runs in a thread of the test process over the test's own store; leaving the
context stops it (open event streams are cut after a second of grace).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from eventstore import EventStore
from eventstore.explorer import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(store: EventStore) -> Iterator[str]:
    """Serve the explorer over ``store``; yields its base URL (``http://127.0.0.1:PORT``)."""
    port = free_port()
    config = uvicorn.Config(
        create_app(store, allowed_hosts=["127.0.0.1", "localhost"]),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="explorer", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the explorer did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
