"""The session id <-> key cache a storage keeps for the sessions it has seen."""

from __future__ import annotations

__all__ = ["SessionKeys"]


class SessionKeys:
    """Session id <-> key, for the sessions a storage has seen.

    A key never changes and is never given to another id (PostgreSQL's sequence does not
    hand a number out twice, even after a rollback), so what is learnt stays true by key;
    an id can name a new key once its session was erased, so a caller that finds a key
    stale forgets it. Bounded: beyond ``KEPT`` sessions (about 100 bytes each) everything
    is forgotten at once, to be learnt again. Plain dict operations: safe across threads.
    """

    KEPT = 100_000

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}
        self._ids: dict[int, str] = {}

    def key(self, session_id: str) -> int | None:
        """The key last learnt for this id, if any."""
        return self._keys.get(session_id)

    def session_id(self, pk: int) -> str:
        """The id of this key. Raises ``KeyError`` for a key not learnt (yet)."""
        return self._ids[pk]

    def learn(self, session_id: str, pk: int) -> None:
        """Remember that ``pk`` is the key of ``session_id``."""
        if self._keys.get(session_id) == pk:
            return
        if len(self._keys) >= self.KEPT or len(self._ids) >= self.KEPT:
            self._keys.clear()
            self._ids.clear()
        self._keys[session_id] = pk
        self._ids[pk] = session_id

    def forget(self, session_id: str) -> None:
        """Drop a key found stale for this id (its session was erased)."""
        self._keys.pop(session_id, None)
