"""``python -m benchmarks NAME [args]`` runs ``benchmarks.NAME.main(args)``; ``all`` runs every one."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from benchmarks import ALIASES, BENCHMARKS, TOOLS

__all__ = ["main"]

USAGE = (
    "usage: python -m benchmarks NAME [args...]   (NAME: all, "
    + ", ".join(BENCHMARKS + TOOLS)
    + ")\n       python -m benchmarks NAME --help   for a benchmark's options"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to one benchmark module, or run all of them with their defaults.

    Args:
        argv: command-line arguments without the program name.

    Returns:
        The process exit code: 0 when every benchmark run succeeded.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    name, rest = ALIASES.get(args[0], args[0]), args[1:]
    if name == "all":
        worst = 0
        for each in BENCHMARKS:
            print(f"\n### python -m benchmarks {each} {' '.join(rest)}".rstrip(), flush=True)
            worst = max(worst, _run(each, rest))
        return worst
    if name not in BENCHMARKS + TOOLS:
        print(f"unknown benchmark {name!r}\n{USAGE}", file=sys.stderr)
        return 2
    return _run(name, rest)


def _run(name: str, argv: list[str]) -> int:
    module = importlib.import_module(f"benchmarks.{name}")
    code = module.main(argv)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
