"""A memo of decoded values bounded by their bytes: what a codec keeps of what it decoded.

Pure: no I/O, no lock. Only get and set on a dict, atomic under the GIL, so threads sharing
a memo need none (the byte count may drift by a racing entry, which only moves when it
clears).
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["BoundedMemo"]

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """Values by key, up to ``max_bytes`` of their estimated cost; an entry that would pass
    the bound clears the memo whole first (no order to keep on the read path), and one
    costing more than the bound alone is not kept. ``max_bytes`` 0 keeps nothing."""

    __slots__ = ("max_bytes", "_values", "_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._values: dict[K, V] = {}
        self._bytes = 0

    @property
    def enabled(self) -> bool:
        """Whether anything can be kept."""
        return self.max_bytes > 0

    @property
    def bytes(self) -> int:
        """The estimated cost of what is kept."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value kept for ``key``, or ``None``."""
        return self._values.get(key)

    def put(self, key: K, value: V, cost: int) -> None:
        """Keep ``value`` for ``key`` (see the class for the bound)."""
        if cost > self.max_bytes:
            return
        if self._bytes + cost > self.max_bytes:
            self.clear()
        self._values[key] = value
        self._bytes += cost

    def clear(self) -> None:
        """Forget everything kept."""
        self._values.clear()
        self._bytes = 0
