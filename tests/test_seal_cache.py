"""The codec's decoded-segment cache: a hit is what decoding would return, an altered
segment is never a hit, and what it holds stays within its bound.

Pure: segments are encoded here from a chain of events hashed as the store hashes them
(the stores' reads through the cache are in tests/test_seal.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from eventstore.core import segments
from eventstore.core.codec import canonical, recorded_hash
from eventstore.core.rows import ZERO_HASH, EventRow, SealedEvent, SegmentHead
from eventstore.core.segments import SegmentCodec, check_segment, encode_segment, xact_digest
from eventstore.errors import SegmentCorrupt
from eventstore.samples import chat_session


def _segment(first: int, count: int, prev: bytes = ZERO_HASH) -> tuple[SegmentHead, bytes]:
    """A segment of ``count`` chat events from version ``first`` on, chained from ``prev``."""
    events: list[SealedEvent] = []
    h = prev
    for i, action in enumerate(chat_session(4, seed=first)[:count]):
        v = first + i
        unhashed = EventRow(7, v, f"e{v}", action["type"], 1, canonical(action), 1_000 + v, None, None, b"", None)
        h = recorded_hash(h, "s", unhashed)
        events.append(SealedEvent(dataclasses.replace(unhashed, hash=h), 100 + v))
    xacts = [e.xact for e in events]
    head = SegmentHead(7, first, first + count - 1, prev, h, xact_digest(xacts), min(xacts), max(xacts))
    return head, encode_segment(events, "s")


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first versions of the segments actually decoded (not served by a cache)."""
    seen: list[int] = []

    def spy(head: SegmentHead, body: bytes) -> Any:
        seen.append(head.first_version)
        return check_segment(head, body)

    monkeypatch.setattr(segments, "check_segment", spy)
    return seen


def test_a_segment_read_again_is_served_from_the_cache_as_decoding_returns_it(decodes: list[int]) -> None:
    head, body = _segment(1, 40)
    codec = SegmentCodec()
    first = codec.decode(head, body)
    # Another bytes object with the same bytes: what a second read of the row returns.
    again = codec.decode(head, bytes(bytearray(body)))
    assert decodes == [1]
    assert again == first == check_segment(head, body).events()  # the unpatched one
    assert [e.row.version for e in again] == list(range(1, 41))
    again.clear()  # each read gets a list of its own
    assert len(codec.decode(head, body)) == 40 and decodes == [1]


@pytest.mark.parametrize("part", ["body", "end_hash", "xact_digest", "prev_hash"])
def test_an_altered_segment_is_decoded_and_refused_after_the_intact_one_was_cached(
    decodes: list[int], part: str
) -> None:
    head, body = _segment(1, 40)
    codec = SegmentCodec()
    codec.decode(head, body)
    if part == "body":
        forged_head, forged_body = head, body[:-1] + bytes([body[-1] ^ 1])
    else:
        value = getattr(head, part)
        forged_head, forged_body = dataclasses.replace(head, **{part: bytes([value[0] ^ 1]) + value[1:]}), body
    for _ in range(2):  # and a corrupt segment is never remembered
        with pytest.raises(SegmentCorrupt):
            codec.decode(forged_head, forged_body)
    assert decodes == [1, 1, 1]
    assert len(codec.decode(head, body)) == 40 and decodes == [1, 1, 1]


def test_the_cache_holds_no_more_than_its_bound(decodes: list[int]) -> None:
    a, b = _segment(1, 40), _segment(41, 40)
    probe = SegmentCodec()
    probe.decode(*a)
    one = probe.cached_bytes
    assert one > 40 * 400  # fields and objects counted, not the compressed body
    codec = SegmentCodec(max_decoded=one + one // 2)  # room for one of them only
    for head, body in (a, b, a, b):
        assert len(codec.decode(head, body)) == 40
        assert 0 < codec.cached_bytes <= one + one // 2
    assert decodes == [1, 1, 41, 1, 41]  # each pushed the other out
    codec.decode(*b)
    assert decodes[-1] == 41 and len(decodes) == 5


@pytest.mark.parametrize("bound", [0, 1000])
def test_no_cache_or_a_segment_larger_than_it_decodes_every_time(decodes: list[int], bound: int) -> None:
    head, body = _segment(1, 40)
    codec = SegmentCodec(max_decoded=bound)
    for _ in range(3):
        assert [e.row.version for e in codec.decode(head, body)] == list(range(1, 41))
    assert decodes == [1, 1, 1] and codec.cached_bytes == 0


def test_a_loads_payloads_are_the_events_in_its_range_checked_and_remembered_alike(decodes: list[int]) -> None:
    head, body = _segment(11, 40)  # versions 11..50
    codec = SegmentCodec()
    events = codec.decode(head, body)
    for after, upto in [(0, 100), (10, 50), (10, 11), (20, 30), (49, 60), (0, 11), (30, 30)]:
        want = [(e.row.version, e.row.payload) for e in events if after < e.row.version <= upto]
        assert codec.payloads(head, body, after, upto) == want, (after, upto)
    assert decodes == [11]
    forged = body[:-1] + bytes([body[-1] ^ 1])
    with pytest.raises(SegmentCorrupt):
        codec.payloads(head, forged, 10, 50)
