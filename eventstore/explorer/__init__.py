"""The explorer: a local, read-only web app over a store (``eventstore ui``).

Pages are rendered on the server with the audit report's pieces
(:mod:`eventstore.features.report_html`); a little plain script adds the version scrubber's
keyboard and live updates. Every file the pages use is served by the app itself. There
is no authentication: anyone who can reach the port can read every session, which is
why :func:`serve` listens on loopback unless told otherwise.

Needs the ``ui`` extra (Starlette and uvicorn): ``pip install 'eventstore[ui]'``.
"""

from __future__ import annotations

import ipaddress
import sys
from typing import TYPE_CHECKING

from eventstore.explorer.app import create_app

if TYPE_CHECKING:
    from eventstore import EventStore

__all__ = ["create_app", "serve_explorer", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve_explorer(store: EventStore, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the explorer over ``store`` until interrupted (blocking).

    On a loopback address only requests naming a loopback host are answered (a page on
    another site cannot reach the server through a DNS name pointing at 127.0.0.1). Any
    other address gets a warning on stderr: the explorer has no authentication.

    Args:
        store: the store to show (only read).
        host: the address to listen on.
        port: the TCP port.
    """
    import uvicorn

    if not is_loopback(host):
        print(
            f"warning: listening on {host!r}, not loopback: anyone who can reach port {port} "
            "can read every session (the explorer has no authentication)",
            file=sys.stderr,
            flush=True,
        )
    allowed = ["127.0.0.1", "localhost", "::1", host] if is_loopback(host) else None
    app = create_app(store, allowed_hosts=allowed)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=1)
