"""The feed after an archive is imported back in place: each session stays in version order.

``compact(archive=...)`` deletes a prefix of a session; importing the archive puts those
events back *below* events the session still holds. The feed must keep its promises:

- from the start, each session's events come in version order (the restored ones right
  before the session's first remaining event), positions rising, none twice;
- a reader that had read past the session's remaining events (and so had the restored
  events before the compaction took them away) yields none of them again;
- a reader that had not reached the session's first remaining event yields the restored
  events in order, before it;
- with events below the restored ones kept for a branch, the restored events come after
  those and before the first remaining one.

Run on both backends, and on the async twin (whose feed reads the same positions).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from eventstore import EventStore, RecordedEvent, SessionExists

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def _send(i: int) -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": f"message {i}"}


def _keys(events: list[RecordedEvent]) -> list[tuple[str, int]]:
    return [(e.session_id, e.version) for e in events]


def _per_session(events: list[RecordedEvent]) -> dict[str, list[int]]:
    per: dict[str, list[int]] = defaultdict(list)
    for e in events:
        per[e.session_id].append(e.version)
    return dict(per)


def _assert_feed_order(events: list[RecordedEvent]) -> None:
    keys = _keys(events)
    assert len(keys) == len(set(keys)), f"an event was yielded twice: {keys}"
    for session, versions in _per_session(events).items():
        assert versions == sorted(versions), f"session {session} out of order: {versions}"
    positions = [e.position for e in events]
    assert positions == sorted(positions)  # type: ignore[type-var]


def _interleaved(store: EventStore, n: int) -> None:
    """``s1`` and ``s2`` written in turns: the feed numbers s1's compaction frees lie between s2's."""
    for i in range(n):
        store.append("s1", [_send(i)])
        store.append("s2", [_send(i)])


def test_an_archive_restored_in_place_keeps_each_sessions_feed_in_version_order(
    store: EventStore, tmp_path: Path, backend: str
) -> None:
    _interleaved(store, 6)
    before = list(store.feed(idle_timeout=0))
    read_all = before[-1].position
    archive = tmp_path / "s1.jsonl"
    store.compact("s1", upto=4, archive=archive)
    compacted = list(store.feed(idle_timeout=0))
    assert _per_session(compacted) == {"s1": [5, 6], "s2": [1, 2, 3, 4, 5, 6]}
    # A reader that stopped just before s1's first remaining event, and one that read it all.
    first_left = _keys(compacted).index(("s1", 5))
    short_of_it = compacted[first_left - 1].position
    read_compacted = compacted[-1].position

    results = store.import_(archive.read_text(encoding="utf-8").splitlines())
    assert [(r.session, r.status) for r in results] == [("s1", "restored")]

    got = list(store.feed(idle_timeout=0))
    _assert_feed_order(got)
    assert _per_session(got) == {"s1": [1, 2, 3, 4, 5, 6], "s2": [1, 2, 3, 4, 5, 6]}
    # Everything else keeps its place.
    assert [e.position for e in got if e.session_id == "s2"] == [
        e.position for e in compacted if e.session_id == "s2"
    ]
    assert [e.event_id for e in got if e.session_id == "s1"] == [e.event_id for e in before if e.session_id == "s1"]

    # Read past s1's remaining events already (before or after the compaction): nothing again.
    assert list(store.feed(after=read_all, idle_timeout=0)) == []
    assert list(store.feed(after=read_compacted, idle_timeout=0)) == []
    # Not there yet: the restored events, in order, then the rest.
    first_back = _keys(got).index(("s1", 1))
    rest = list(store.feed(after=got[first_back - 1].position if first_back else None, idle_timeout=0))
    _assert_feed_order(rest)
    assert _per_session(rest)["s1"] == [1, 2, 3, 4, 5, 6]
    if backend == "sqlite":
        # Positions are row numbers: the free ones nearest before s1@5 are those the
        # compaction freed, so the events are back where they were.
        assert [e.position for e in got if e.session_id == "s1"] == [
            e.position for e in before if e.session_id == "s1"
        ]
    else:
        # Right before s1@5: a reader that stopped short of it gets them all, in order.
        rest = list(store.feed(after=short_of_it, idle_timeout=0))
        _assert_feed_order(rest)
        assert _per_session(rest) == {"s1": [1, 2, 3, 4, 5, 6], "s2": [5, 6]}

    # New events still come after everything, once.
    store.append("s1", [_send(6)])
    assert _keys(list(store.feed(after=read_all, idle_timeout=0))) == [("s1", 7)]
    assert _keys(list(store.feed(after=read_compacted, idle_timeout=0))) == [("s1", 7)]


def test_restored_events_come_after_the_ones_a_branch_kept_and_before_the_remaining_ones(
    store: EventStore, tmp_path: Path
) -> None:
    _interleaved(store, 6)
    store.branch("s1", at=2, new_id="alt")
    store.append("alt", [_send(99)])
    archive = tmp_path / "s1.jsonl"
    res = store.compact("s1", upto=4, archive=archive)
    assert res.kept_for_branches == 2 and res.removed == 2
    results = store.import_(archive.read_text(encoding="utf-8").splitlines())
    assert {r.session: r.status for r in results}["s1"] == "restored"
    got = list(store.feed(idle_timeout=0))
    _assert_feed_order(got)
    assert _per_session(got)["s1"] == [1, 2, 3, 4, 5, 6]
    assert [e.version for e in store.history("s1")] == [1, 2, 3, 4, 5, 6]


def test_an_archive_of_a_session_compacted_to_its_head_restores_in_order_too(
    store: EventStore, tmp_path: Path
) -> None:
    _interleaved(store, 3)
    archive = tmp_path / "s1.jsonl"
    store.compact("s1", upto=3, archive=archive)
    read_compacted = list(store.feed(idle_timeout=0))[-1].position
    store.import_(archive.read_text(encoding="utf-8").splitlines())
    store.append("s1", [_send(3)])
    got = list(store.feed(idle_timeout=0))
    _assert_feed_order(got)
    assert _per_session(got) == {"s1": [1, 2, 3, 4], "s2": [1, 2, 3]}
    # No event of s1 was left to hold a place: the restored ones come at the end, once.
    assert _keys(list(store.feed(after=read_compacted, idle_timeout=0))) == [("s1", v) for v in (1, 2, 3, 4)]


# SQLite only: PostgreSQL's restored events share their successor's number, never run out.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_refuses_a_restore_whose_feed_numbers_ran_out_and_writes_nothing(
    store: EventStore, tmp_path: Path
) -> None:
    """SQLite's positions are row numbers: restored events need free ones between the
    session's kept events and its first remaining one. Another session's restore can take
    them first (here s2's, whose free numbers lie below s1's kept events)."""
    store.append("s2", [_send(0), _send(1)])
    store.append("s1", [_send(0), _send(1)])
    store.branch("s1", at=2, new_id="alt")
    store.append("s1", [_send(2), _send(3)])
    store.append("s2", [_send(2)])
    store.append("s1", [_send(4)])
    a2, a1 = tmp_path / "s2.jsonl", tmp_path / "s1.jsonl"
    store.compact("s2", upto=2, archive=a2)
    store.compact("s1", upto=4, archive=a1)
    store.import_(a2.read_text(encoding="utf-8").splitlines())
    before = _keys(list(store.feed(idle_timeout=0)))
    with pytest.raises(SessionExists, match="cannot be put back before it in the feed's order"):
        store.import_(a1.read_text(encoding="utf-8").splitlines())
    assert _keys(list(store.feed(idle_timeout=0))) == before
    assert [e.version for e in store.history("s1")] == [5]  # still compacted up to 4
    _assert_feed_order(list(store.feed(idle_timeout=0)))
