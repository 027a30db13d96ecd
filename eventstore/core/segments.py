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

Layout, before compression: a JSON header (the id the events were hashed under, event
ids, types, turns, time deltas, actors, feed-number deltas and the byte lengths of the
payloads, metadata and native data, ``-1`` for none), a newline, then the payloads, the
metadata and the native data concatenated. Similar fields side by side compress best.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import orjson

from eventstore.core.codec import chain_hash, recorded_hash
from eventstore.core.rows import EventRow, SealedEvent, SegmentHead
from eventstore.errors import SegmentCorrupt

__all__ = [
    "FORMAT",
    "SegmentCodec",
    "encode_segment",
    "decode_segment",
    "chain_end",
    "xact_digest",
]

#: The body's format byte; a reader refuses any other.
FORMAT = 1
#: zlib at its best ratio: the measured choice (see benchmarks/RESULTS.md, "segment codec").
_LEVEL = 9


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


def decode_segment(head: SegmentHead, body: bytes) -> list[SealedEvent]:
    """The events a segment stands for, their hashes recomputed and checked.

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
        cols = [h["id"], h["ty"], h["tu"], h["t"], h["a"], h["x"], h["p"], h["m"], h["n"]]
        if any(len(c) != n for c in cols):
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
        out: list[SealedEvent] = []
        prev, t, x = head.prev_hash, 0, 0
        for i in range(n):
            t += h["t"][i]
            x += h["x"][i]
            version = head.first_version + i
            payload = payloads[i]
            assert payload is not None
            digest = chain_hash(
                prev,
                session_id=hashed_as,
                version=version,
                event_id=h["id"][i],
                type=h["ty"][i],
                turn=h["tu"][i],
                payload=payload,
                recorded_at=t,
                actor=h["a"][i],
                metadata=metas[i],
                native=natives[i],
            )
            row = EventRow(
                head.session_pk, version, h["id"][i], h["ty"][i], h["tu"][i], payload, t,
                h["a"][i], metas[i], digest, natives[i],
            )
            out.append(SealedEvent(row, x))
            prev = digest
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
    if xact_digest([e.xact for e in out]) != head.xact_digest:
        raise SegmentCorrupt(
            f"{where} was altered: its feed numbers do not match their digest", version=head.first_version
        )
    return out


def chain_end(prev: bytes, hashed_as: str, rows: Sequence[EventRow]) -> bytes:
    """The chain hash after ``rows`` recomputed from ``prev``: equal to the last row's hash
    exactly when every row is what was hashed (a sealer checks this before sealing)."""
    for r in rows:
        prev = recorded_hash(prev, hashed_as, r)
    return prev


class SegmentCodec:
    """The segment functions as one object: what the engine hands its storage (storage
    moves bytes and imports no codec; see ``eventstore.storage.interface.SegmentCoder``)."""

    encode = staticmethod(encode_segment)
    decode = staticmethod(decode_segment)
    chain_end = staticmethod(chain_end)
    xact_digest = staticmethod(xact_digest)
