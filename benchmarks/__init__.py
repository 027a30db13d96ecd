"""Benchmarks for eventstore: plain programs with warm-up and fixed seeds, kept out of the tests.

Run one with ``python -m benchmarks NAME [args]`` or all of them with
``python -m benchmarks all``. Each module in :data:`BENCHMARKS` has a
``main(argv: list[str] | None) -> int``; results go to ``benchmarks/out/NAME.json``
(gitignored) and the figures worth keeping to ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

__all__ = ["BENCHMARKS", "ALIASES", "TOOLS"]

BENCHMARKS: list[str] = [
    # Add your module here (``benchmarks/<name>.py`` with ``main(argv)``) to run it in ``all``.
    "fold",
    "store",
    "hotpath",  # one event per transaction and the head load, side by side with a git revision
    "audit",
    "compare",
    "timetravel",
    "rewind",  # rewind of a 100k-event session vs a 100-event one
    "report",
    "explorer",  # the web explorer's pages on a 20k-event session
    "feed",
    "feed_barrier",  # the feed with a stranger's idle transaction open; the barrier's cost
    "streaming",
    "async_store",  # `python -m benchmarks async`: the async twin at W concurrent writers
    "soak",  # reliability audit; 10 s per backend by default (--seconds N for a real soak)
    "startup",  # CLI start-up and long-log output, before/after against a git revision
    "scale",  # partitions vs plain, growth, replicas; needs the replica of scripts/with-postgres
    "catalogue",  # a sidebar page among up to 1M sessions; what the catalogue costs appends
    "seal",  # sealed segments: bytes per event against the bare row; the segment codec
    "seal_cost",  # one writer flat out with sealing off, on (SealPolicy) and eager: what sealing costs it
    "headload",  # the head load and a checkout against a decode of the head state, sealed and not
    "growth",  # N sessions of T turns with sealing on: bytes, appends, loads, sealing lag per checkpoint
]
"""Benchmark modules run, in this order, by ``python -m benchmarks all``."""

TOOLS: list[str] = [
    "sidebyside",  # store, streaming, feed and compare of two revisions, alternating, side by side
]
"""Modules run by name only, never by ``all``: they run other benchmarks themselves."""

ALIASES: dict[str, str] = {"async": "async_store"}
"""Short names accepted by ``python -m benchmarks`` (``async`` is a keyword, not a module name)."""
