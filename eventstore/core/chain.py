"""The one rule of a session's chain: how each event's turn and hash follow from the last.

PURE. A ``send`` opens the next turn; every other event belongs to the turn it follows
(:func:`next_turn`). Each event's hash chains from the one before it
(:func:`eventstore.core.codec.recorded_hash`). Appends number their rows with
:func:`next_turn`; verify and import walk stored or imported events with
:class:`ChainWalk` and decide what a broken link means (a finding, or a refused file).
"""

from __future__ import annotations

from dataclasses import dataclass

from eventstore.core.codec import recorded_hash
from eventstore.core.rows import EventRow

__all__ = ["next_turn", "ChainWalk", "Link"]


def next_turn(turn: int, event_type: str) -> int:
    """The turn of an event of type ``event_type`` that follows one of turn ``turn``."""
    return turn + 1 if event_type == "send" else turn


@dataclass(frozen=True, slots=True)
class Link:
    """How one event follows the one before it in its chain.

    Attributes:
        version: the event's version.
        expected_version: the version that should have come next.
        hash_ok: the event's hash is the one recomputed from its fields and the previous hash.
        expected_turn: the turn the event should carry.
        turn_ok: it carries that turn.
    """

    version: int
    expected_version: int
    hash_ok: bool
    expected_turn: int
    turn_ok: bool

    @property
    def gap(self) -> bool:
        """Versions are missing before the event."""
        return self.version != self.expected_version


class ChainWalk:
    """A walk along a session's events in version order, from a known point.

    Args:
        version: the version the walk starts after (0, a fork point or a baseline).
        hash: the chain hash at that version.
        turn: the turn at that version.
    """

    def __init__(self, version: int, hash: bytes, turn: int) -> None:
        self.version = version
        self.hash = hash
        self.turn = turn

    def jump(self, version: int, hash: bytes, turn: int) -> None:
        """Go on from another known point (a baseline: the events below it are gone)."""
        self.version, self.hash, self.turn = version, hash, turn

    def step(self, session_id: str, event: EventRow) -> Link:
        """Check the next event (recorded by ``session_id``) against the walk, then move on
        to it: whatever the verdict, the walk goes on from the event's own hash and turn."""
        turn = next_turn(self.turn, event.type)
        link = Link(
            event.version,
            self.version + 1,
            recorded_hash(self.hash, session_id, event) == event.hash,
            turn,
            event.turn == turn,
        )
        self.version, self.hash, self.turn = event.version, event.hash, event.turn
        return link
