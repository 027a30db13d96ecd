"""Benchmarks for eventstore: plain programs with warm-up and fixed seeds, kept out of the tests.

Run one with ``python -m benchmarks NAME [args]`` or all of them with
``python -m benchmarks all``. Each module in :data:`BENCHMARKS` has a
``main(argv: list[str] | None) -> int``; results go to ``benchmarks/out/NAME.json``
(gitignored) and the figures worth keeping to ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

__all__ = ["BENCHMARKS"]

BENCHMARKS: list[str] = [
    # Add your module here (``benchmarks/<name>.py`` with ``main(argv)``) to run it in ``all``.
    "fold",
    "store",
    "audit",
    "compare",
    "timetravel",
    "report",
    "streaming",
    "soak",  # reliability audit; 10 s per backend by default (--seconds N for a real soak)
]
"""Benchmark modules run, in this order, by ``python -m benchmarks all``."""
