"""Benchmark targets for ``python -m benchmarks compare``: one small module per target.

:func:`make_target` builds a target by key; a peer whose package is not installed (the
``[bench]`` extra) or whose API is missing in the installed version is reported by
:func:`unavailable` instead of failing the whole run.
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers.base import Target, Unsupported

__all__ = ["KEYS", "Target", "Unsupported", "make_target", "unavailable"]

KEYS = (
    "raw",
    "es-pg",
    "es-pg-rows",
    "es-sqlite",
    "lg-event",
    "lg-turn",
    "lg-delta",
    "esrc",
    "esrc-snap",
)
"""Every target, in table order (raw psycopg first: every ratio is against it)."""


def make_target(key: str, options: dict[str, Any] | None = None) -> Target:
    """Build the target named ``key``.

    Args:
        key: one of :data:`KEYS`.
        options: ``es_snapshot_every``, ``esrc_snapshot_every``, ``delta_snapshot_frequency``.

    Raises:
        ImportError: the peer's package (or the API it needs) is not installed.
    """
    opts = options or {}
    if key == "raw":
        from benchmarks.peers.raw_psycopg import RawPsycopg

        return RawPsycopg()
    if key in ("es-pg", "es-pg-rows", "es-sqlite"):
        from benchmarks.peers.eventstore_target import EventstoreTarget

        backend = "sqlite" if key == "es-sqlite" else "postgresql"
        return EventstoreTarget(backend, opts.get("es_snapshot_every"), seal=key != "es-pg-rows")
    if key in ("lg-event", "lg-turn"):
        from benchmarks.peers.langgraph_target import SaverTarget

        return SaverTarget(key.split("-")[1])
    if key == "lg-delta":
        from benchmarks.peers.langgraph_target import DeltaChannelTarget

        return DeltaChannelTarget(opts.get("delta_snapshot_frequency", 100))
    if key in ("esrc", "esrc-snap"):
        from benchmarks.peers.eventsourcing_target import EventsourcingTarget

        every = opts.get("esrc_snapshot_every", 100) if key == "esrc-snap" else None
        target = EventsourcingTarget(every)
        target.key = key
        return target
    raise KeyError(f"unknown target {key!r}; choose from {', '.join(KEYS)}")


def unavailable(key: str, options: dict[str, Any] | None = None) -> str | None:
    """Why target ``key`` cannot run here, or ``None`` when it can."""
    try:
        make_target(key, options)
    except ImportError as exc:
        return f"not installed: {exc}"
    return None
