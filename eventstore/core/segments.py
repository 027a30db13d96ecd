"""Sealed segments: a closed turn's events as one compressed, columnar body.

A segment stands for the event rows ``first_version..last_version`` of one session. Its
body holds every field of those events except their chain hashes (32 incompressible
bytes each would cost more than the rest of a compressed event): each hash is recomputed
on decoding from the hash before the segment, and the last one must equal the segment's
``end_hash``, which the database copied from the last row it removed. So a body that was
altered in any field, or glued to another chain, fails at every read with
:class:`~eventstore.errors.SegmentCorrupt` — a forgery would need a SHA-256 preimage. The
events' feed numbers (``xact``, not hashed) are checked the same way against
``xact_digest``, a digest the database computed from the rows.

A :class:`SegmentCodec` remembers what it decoded, keyed by the segment's head *and* body
bytes (see :meth:`SegmentCodec.decode`): a segment is immutable, decoding is a function of
those bytes alone, so a hit is exactly what decoding them again would return, and a body
or head altered in the database is a different key, decoded and checked afresh.

Layout, before compression: a JSON header (the id the events were hashed under, event
ids, types, turns, time deltas, actors, feed-number deltas and the byte lengths of the
payloads, metadata and native data, ``-1`` for none), a newline, then the payloads, the
metadata and the native data concatenated. Similar fields side by side compress best.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import itertools
import zlib
from collections.abc import Sequence
from typing import Any

import orjson

from eventstore.core.codec import chain_hash, recorded_hash
from eventstore.core.memo import BoundedMemo
from eventstore.core.rows import EventRow, SealedEvent, SegmentHead
from eventstore.errors import SegmentCorrupt

__all__ = [
    "FORMAT",
    "SEGMENT_CACHE_BYTES",
    "SegmentCodec",
    "encode_segment",
    "decode_segment",
    "check_segment",
    "DecodedSegment",
    "chain_end",
    "xact_digest",
]

#: The body's format byte; a reader refuses any other.
FORMAT = 1
#: zlib at its best ratio: the measured choice (see benchmarks/RESULTS.md, "segment codec").
_LEVEL = 9
#: What a codec's decoded segments may hold before its cache is cleared (see
#: :meth:`SegmentCodec.decode`): about 30,000 events of the benchmark's chats.
SEGMENT_CACHE_BYTES = 16 << 20
#: Bytes an event decoded costs beyond its fields' bytes (its row and sealed-event objects,
#: the bytes and str headers, the ints; measured with tracemalloc: about 390).
_EVENT_OVERHEAD = 400


def xact_digest(xacts: Sequence[int]) -> bytes:
    """SHA-256 of the feed numbers as 8-byte big-endian signed integers, in order (what
    PostgreSQL's ``sha256(string_agg(int8send(xact), '' ORDER BY version))`` computes)."""
    return hashlib.sha256(b"".join(x.to_bytes(8, "big", signed=True) for x in xacts)).digest()


def _lengths(values: Sequence[bytes | None]) -> list[int]:
    return [-1 if v is None else len(v) for v in values]


def encode_segment(events: Sequence[SealedEvent], hashed_as: str) -> bytes:
    """The compressed body of consecutive events of one session.

    Args:
        events: the events, in version order, versions consecutive.
        hashed_as: the session id their chain hashes were computed with.
    """
    rows = [e.row for e in events]
    times = [r.recorded_at for r in rows]
    xacts = [e.xact for e in events]
    header = {
        "s": hashed_as,
        "id": [r.event_id for r in rows],
        "ty": [r.type for r in rows],
        "tu": [r.turn for r in rows],
        "t": [times[0], *(b - a for a, b in zip(times, times[1:]))],
        "a": [r.actor for r in rows],
        "x": [xacts[0], *(b - a for a, b in zip(xacts, xacts[1:]))],
        "p": [len(r.payload) for r in rows],
        "m": _lengths([r.metadata for r in rows]),
        "n": _lengths([r.native for r in rows]),
    }
    raw = b"".join(
        [
            orjson.dumps(header),
            b"\n",
            *(r.payload for r in rows),
            *(r.metadata for r in rows if r.metadata is not None),
            *(r.native for r in rows if r.native is not None),
        ]
    )
    return bytes([FORMAT]) + zlib.compress(raw, _LEVEL)


class DecodedSegment:
    """A segment's events once checked, as columns: the row objects (two per event, a
    third of the decoding's cost) are built the first time :meth:`events` is asked for,
    and a load, which needs only payloads, never builds them (:meth:`payloads`)."""

    __slots__ = ("head", "_payloads", "_cols", "_events")

    def __init__(self, head: SegmentHead, payloads: list[bytes], cols: tuple[list[Any], ...]) -> None:
        self.head = head
        self._payloads = payloads
        # ids, types, turns, times, actors, metadata, native data, hashes, feed numbers
        self._cols = cols
        self._events: tuple[SealedEvent, ...] | None = None

    def __len__(self) -> int:
        return len(self._payloads)

    def field_bytes(self) -> int:
        """The bytes of the events' payloads, metadata and native data."""
        _, _, _, _, _, metas, natives, _, _ = self._cols
        return sum(map(len, self._payloads)) + sum(len(m) for m in metas if m) + sum(len(n) for n in natives if n)

    def events(self) -> list[SealedEvent]:
        """The events, in version order (a list of its own for each caller)."""
        if self._events is None:
            ids, types, turns, times, actors, metas, natives, hashes, xacts = self._cols
            pk, first = self.head.session_pk, self.head.first_version
            self._events = tuple(
                SealedEvent(
                    EventRow(pk, first + i, ids[i], types[i], turns[i], p, times[i], actors[i], metas[i], hashes[i], natives[i]),
                    xacts[i],
                )
                for i, p in enumerate(self._payloads)
            )
        return list(self._events)

    def payloads(self, after: int, upto: int) -> list[tuple[int, bytes]]:
        """``(version, payload)`` of the events in ``(after, upto]``, in version order."""
        first = self.head.first_version
        lo = max(after + 1 - first, 0)
        part = self._payloads[lo : max(upto + 1 - first, 0)]
        return list(zip(range(first + lo, first + lo + len(part)), part))


def check_segment(head: SegmentHead, body: bytes) -> DecodedSegment:
    """A segment decoded, its hashes recomputed and checked.

    Raises:
        SegmentCorrupt: the body does not decode, or its events do not hash to the
            segment's ``end_hash``, or their feed numbers to its ``xact_digest``.
    """
    where = f"sealed segment of session row {head.session_pk} versions {head.first_version}..{head.last_version}"
    try:
        if not body or body[0] != FORMAT:
            raise ValueError("unknown format")
        raw = zlib.decompress(body[1:])
        cut = raw.index(b"\n")
        h = orjson.loads(raw[:cut])
        n = head.last_version - head.first_version + 1
        ids, types, turns, dt, actors, dx = h["id"], h["ty"], h["tu"], h["t"], h["a"], h["x"]
        if any(len(c) != n for c in (ids, types, turns, dt, actors, dx, h["p"], h["m"], h["n"])):
            raise ValueError("columns of the wrong length")
        pos = cut + 1

        def take(length: int) -> bytes | None:
            nonlocal pos
            if length < 0:
                return None
            out = raw[pos : pos + length]
            pos += length
            return out

        payloads = [take(k) for k in h["p"]]
        metas = [take(k) for k in h["m"]]
        natives = [take(k) for k in h["n"]]
        if pos != len(raw):
            raise ValueError("trailing bytes")
        hashed_as = h["s"]
        times = list(itertools.accumulate(dt))
        xacts = list(itertools.accumulate(dx))
        hashes: list[bytes] = []
        prev = head.prev_hash
        for i in range(n):
            payload = payloads[i]
            if payload is None:
                raise ValueError("an event without a payload")
            prev = chain_hash(
                prev,
                session_id=hashed_as,
                version=head.first_version + i,
                event_id=ids[i],
                type=types[i],
                turn=turns[i],
                payload=payload,
                recorded_at=times[i],
                actor=actors[i],
                metadata=metas[i],
                native=natives[i],
            )
            hashes.append(prev)
    except SegmentCorrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure is corruption
        raise SegmentCorrupt(
            f"{where} does not decode ({exc}); run `eventstore verify`", version=head.first_version
        ) from exc
    if prev != head.end_hash:
        raise SegmentCorrupt(
            f"{where} was altered: its events do not hash to its end hash", version=head.first_version
        )
    if xact_digest(xacts) != head.xact_digest:
        raise SegmentCorrupt(
            f"{where} was altered: its feed numbers do not match their digest", version=head.first_version
        )
    return DecodedSegment(head, payloads, (ids, types, turns, times, actors, metas, natives, hashes, xacts))  # type: ignore[arg-type]


def decode_segment(head: SegmentHead, body: bytes) -> list[SealedEvent]:
    """The events a segment stands for, their hashes recomputed and checked.

    Raises:
        SegmentCorrupt: as :func:`check_segment`.
    """
    return check_segment(head, body).events()


def chain_end(prev: bytes, hashed_as: str, rows: Sequence[EventRow]) -> bytes:
    """The chain hash after ``rows`` recomputed from ``prev``: equal to the last row's hash
    exactly when every row is what was hashed (a sealer checks this before sealing)."""
    for r in rows:
        prev = recorded_hash(prev, hashed_as, r)
    return prev


class SegmentCodec:
    """The segment functions as one object: what the engine hands its storage (storage
    moves bytes and imports no codec; see ``eventstore.storage.interface.SegmentCoder``).

    Reads of a sealed session decode the same segments again and again (an old-version
    checkout folds up to 511 sealed events, a head load the turns after its snapshot), and
    decoding costs a SHA-256 and an object per event. So :meth:`decode` remembers its
    results, keyed by the segment's head and body bytes, up to ``max_decoded`` bytes
    (fields plus objects, estimated; a :class:`~eventstore.core.memo.BoundedMemo`); ``0``
    keeps none.
    """

    encode = staticmethod(encode_segment)
    chain_end = staticmethod(chain_end)
    xact_digest = staticmethod(xact_digest)

    def __init__(self, max_decoded: int = SEGMENT_CACHE_BYTES) -> None:
        self._decoded: BoundedMemo[tuple[SegmentHead, bytes], DecodedSegment] = BoundedMemo(max_decoded)

    @property
    def cached_bytes(self) -> int:
        """The estimated bytes the decoded segments remembered hold."""
        return self._decoded.bytes

    def decode(self, head: SegmentHead, body: bytes) -> list[SealedEvent]:
        """:func:`decode_segment`, or what it returned for this head and these body bytes
        before (a tampered segment is never a hit: its bytes are not the key's).

        Raises:
            SegmentCorrupt: as :func:`check_segment` (a corrupt segment is not remembered).
        """
        return self._checked(head, body).events()

    def payloads(self, head: SegmentHead, body: bytes, after: int, upto: int) -> list[tuple[int, bytes]]:
        """``(version, payload)`` of the segment's events in ``(after, upto]`` (a load's
        part of it), checked as :meth:`decode` checks, without building the rows."""
        return self._checked(head, body).payloads(after, upto)

    def _checked(self, head: SegmentHead, body: bytes) -> DecodedSegment:
        memo = self._decoded
        if not memo.enabled:
            return check_segment(head, body)
        key = (head, body)
        found = memo.get(key)
        if found is None:
            found = check_segment(head, body)
            # The rows the events become (once asked for) counted in from the start.
            memo.put(key, found, len(body) + _EVENT_OVERHEAD * len(found) + found.field_bytes())
        return found
