"""The only place where actions and states become bytes, and bytes become them again.

Everything is orjson. *Canonical* bytes (sorted keys, no whitespace) are what the store
writes and hashes, so the same action always has the same bytes on every backend and
after an export/import round trip.

- Actions: :func:`encode_action` / :func:`decode_payload`.
- Metadata: :func:`encode_metadata` (a JSON object or ``None``).
- The hash chain: :func:`chain_hash` over a length-prefixed envelope.
- Snapshots with structure sharing: :class:`SnapshotCodec` splits a state into chunks
  of consecutive top-level messages, each chunk compressed and stored once under a digest
  of its bytes, and the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import lz4.block
import orjson

from eventstore.core.memo import BoundedMemo
from eventstore.errors import InvalidEvent

__all__ = [
    "DIGEST_SIZE",
    "canonical",
    "state_digest",
    "encode_action",
    "decode_payload",
    "encode_metadata",
    "decode_metadata",
    "chain_hash",
    "recorded_hash",
    "encode_native",
    "decode_native",
    "SnapshotCodec",
    "chunk_spans",
    "pack_blob",
    "unpack_blob",
    "blob_array",
    "decode_many",
]

_SORT = orjson.OPT_SORT_KEYS
#: Bytes of SHA-256 kept as a message digest: 128 bits, collision-free in practice.
DIGEST_SIZE = 16
#: Messages in the smallest snapshot blob, and the factor between one blob size and the
#: next (see :func:`chunk_spans`); chosen by ``benchmarks headload``.
CHUNK_MESSAGES = 8
CHUNK_GROWTH = 8
#: Bytes of decoded blob JSON a codec's loads remember (see :meth:`SnapshotCodec.load`):
#: the messages of a few dozen long chats, about three times as many bytes in objects.
DECODED_CACHE_BYTES = 16 << 20
#: The first byte of a blob packed by :func:`pack_blob`: LZ4 of the chunk's messages as a
#: JSON array (a raw blob's is ``{``; ``\x01`` was LZ4 of the messages without brackets).
_LZ4_ARRAY = b"\x02"
_LZ4_BODY = b"\x01"
#: Bumped if the envelope layout ever changes (it is hashed first).
_ENVELOPE_FORMAT = 1
_NONE = b"\xff\xff\xff\xff"


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, compact.

    Raises:
        InvalidEvent: the value cannot be JSON (e.g. an integer beyond 64 bits, a non-str key).
    """
    try:
        return orjson.dumps(obj, option=_SORT)
    except (orjson.JSONEncodeError, TypeError) as exc:
        raise InvalidEvent(f"not representable as JSON: {exc}") from None


def state_digest(state: Mapping[str, Any]) -> bytes:
    """SHA-256 of a state's canonical JSON: what a compaction record keeps of its baseline
    state, independent of how the snapshot splits it into blobs."""
    return hashlib.sha256(canonical(state)).digest()


def encode_action(action_json: Mapping[str, Any]) -> tuple[str, bytes]:
    """The ``(type, payload)`` of a validated action's wire dict (``action.to_json()``)."""
    return str(action_json["type"]), canonical(action_json)


def decode_payload(payload: bytes) -> dict[str, Any]:
    """The action dict (the wire shape, docs/format.md) stored in ``payload``."""
    obj: dict[str, Any] = orjson.loads(payload)
    return obj


def encode_metadata(metadata: Mapping[str, Any] | None) -> bytes | None:
    """Canonical bytes of an event's metadata.

    Raises:
        InvalidEvent: ``metadata`` is not a JSON object.
    """
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise InvalidEvent(
            f"metadata must be a JSON object, got {type(metadata).__name__}", field="metadata"
        )
    return canonical(dict(metadata))


def decode_metadata(data: bytes | None) -> dict[str, Any] | None:
    """The metadata object stored in ``data`` (``None`` stays ``None``)."""
    if data is None:
        return None
    obj: dict[str, Any] = orjson.loads(data)
    return obj


def encode_native(value: Any) -> bytes | None:
    """The stored bytes of an event's provider-native data (``None`` stays ``None``).

    ``bytes`` and ``str`` are JSON text, kept exactly as given (a provider's item can be
    stored byte for byte); any other value is encoded as canonical JSON.

    Raises:
        InvalidEvent: the text is not valid UTF-8 JSON, or the value is not representable
            as JSON.
    """
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        try:
            data = value.encode() if isinstance(value, str) else bytes(value)
            orjson.loads(data)
        except (UnicodeEncodeError, orjson.JSONDecodeError) as exc:
            raise InvalidEvent(f"native data is not valid JSON text: {exc}", field="native") from None
        return data
    return canonical(value)


def decode_native(data: bytes | None) -> Any:
    """The JSON value stored as native data in ``data`` (``None`` stays ``None``)."""
    return None if data is None else orjson.loads(data)


def chain_hash(
    prev: bytes,
    *,
    session_id: str,
    version: int,
    event_id: str | None,
    type: str,
    turn: int,
    payload: bytes,
    recorded_at: int,
    actor: str | None,
    metadata: bytes | None,
    native: bytes | None = None,
) -> bytes:
    """SHA-256 of the previous hash and the event's canonical envelope.

    The envelope is length-prefixed so that no two different envelopes share bytes:
    a JSON header ``[format, session, version, event_id, type, turn, recorded_at, actor]``,
    then the payload bytes, then the metadata bytes (or a marker for none), then — only
    for an event that carries provider-native data — the native bytes. An event without
    native data hashes exactly as before native data existed, so older chains verify.

    Args:
        prev: the previous event's hash (32 zero bytes before a root's first event;
            the parent's hash at the fork point for a branch's first event).
        session_id: the id of the session that records the event.
        version: the event's version.
        event_id: the caller's idempotency id, or ``None``.
        type: the action type.
        turn: the turn number.
        payload: canonical bytes of the action.
        recorded_at: microseconds since the epoch, UTC.
        actor: who recorded it, or ``None``.
        metadata: canonical bytes of the metadata object, or ``None``.
        native: the provider-native bytes, or ``None``.

    Returns:
        The 32-byte digest.
    """
    header = orjson.dumps(
        [_ENVELOPE_FORMAT, session_id, version, event_id, type, turn, recorded_at, actor]
    )
    # One sha256 call over the joined envelope (the same digest as feeding the pieces one
    # by one, with fewer calls: this runs once per appended event).
    return hashlib.sha256(
        b"".join(
            (
                prev,
                len(header).to_bytes(4, "big"),
                header,
                len(payload).to_bytes(4, "big"),
                payload,
                _NONE if metadata is None else len(metadata).to_bytes(4, "big") + metadata,
                # Self-delimiting like the parts before it, and absent rather than marked
                # when there is none (the hash of every older event stays as it was).
                b"" if native is None else len(native).to_bytes(4, "big") + native,
            )
        )
    ).digest()


class HashedFields(Protocol):
    """What :func:`recorded_hash` reads of a stored event (e.g. a storage ``EventRow``)."""

    @property
    def version(self) -> int: ...
    @property
    def event_id(self) -> str | None: ...
    @property
    def type(self) -> str: ...
    @property
    def turn(self) -> int: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def recorded_at(self) -> int: ...
    @property
    def actor(self) -> str | None: ...
    @property
    def metadata(self) -> bytes | None: ...
    @property
    def native(self) -> bytes | None: ...


def recorded_hash(prev: bytes, session_id: str, event: HashedFields) -> bytes:
    """The chain hash a stored event should carry, recomputed from its fields.

    Args:
        prev: the previous event's hash in the chain.
        session_id: the id of the session that recorded the event.
        event: the stored event's fields.
    """
    return chain_hash(
        prev,
        session_id=session_id,
        version=event.version,
        event_id=event.event_id,
        type=event.type,
        turn=event.turn,
        payload=event.payload,
        recorded_at=event.recorded_at,
        actor=event.actor,
        metadata=event.metadata,
        native=event.native,
    )


def pack_blob(body: bytes, *, array: bool = True) -> bytes:
    """A snapshot blob as stored: ``body`` (messages joined by commas) compressed with LZ4,
    after a tag byte.

    Compressing here rather than in the database means the server sends a load's snapshot
    as the few bytes it stores, instead of decompressing and sending all of it; LZ4
    because a load decompresses at memory speed (a tenth of zlib's time). Its
    high-compression mode at the lowest level: on a 200-turn state, 2 % more bytes than
    level 9 for a fifth of the time (a snapshot the codec's cache has not seen compresses
    in about twice the time of its canonical JSON and hashing), and a quarter fewer bytes
    than the fast mode.

    The brackets of a JSON array are compressed with the messages (two bytes more), so
    that a load parses what LZ4 gives back as it is, without copying every blob once more
    to add them (:func:`blob_array`). ``array=False`` writes the earlier format (tag
    ``\x01``, the messages without brackets), which loads read as well.
    """
    if array:
        return _LZ4_ARRAY + lz4.block.compress(b"[" + body + b"]", mode="high_compression", compression=3)
    return _LZ4_BODY + lz4.block.compress(body, mode="high_compression", compression=3)


def blob_array(stored: bytes) -> bytes:
    """The messages of a stored snapshot blob as the bytes of a JSON array, of any format:
    :func:`pack_blob`'s as LZ4 gives them back, an earlier blob's with brackets added."""
    tag = stored[:1]
    if tag == _LZ4_ARRAY:
        return lz4.block.decompress(memoryview(stored)[1:])  # type: ignore[no-any-return]
    return b"[" + unpack_blob(stored) + b"]"


def unpack_blob(stored: bytes) -> bytes:
    """The body of a stored snapshot blob (its messages joined by commas, no brackets):
    :func:`pack_blob`'s of either tag, or a blob written before blobs were compressed,
    which is its JSON as it is (it starts with ``{``)."""
    tag = stored[:1]
    if tag == _LZ4_ARRAY:
        return lz4.block.decompress(memoryview(stored)[1:])[1:-1]  # type: ignore[no-any-return]
    if tag == _LZ4_BODY:
        return lz4.block.decompress(memoryview(stored)[1:])  # type: ignore[no-any-return]
    return stored


def chunk_spans(n: int, chunk_messages: int, growth: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` message ranges of a state of ``n`` messages, one per blob.

    Blob sizes are ``chunk_messages * growth**i``, the largest first, each range starting
    at a multiple of its size, then the last partial chunk: 600 messages in blobs of 8, 64,
    512 are 512 + 64 + 8 + 8 + 8 (5 blobs, not 75). A range that is full never changes
    while the chat grows at its end, so its blob is shared by every later snapshot; the
    small ones near the end are replaced by one larger blob when enough messages are there.
    ``growth`` 1 is flat chunks of ``chunk_messages``.
    """
    if growth == 1:
        return [(j, min(n, j + chunk_messages)) for j in range(0, n, chunk_messages)]
    size = chunk_messages
    while size * growth <= n:
        size *= growth
    spans: list[tuple[int, int]] = []
    pos = 0
    while size >= chunk_messages:
        while pos + size <= n:
            spans.append((pos, pos + size))
            pos += size
        size //= growth
    if pos < n:
        spans.append((pos, n))
    return spans


class SnapshotCodec:
    """Encode states as shared message-chunk blobs and decode them back.

    A state ``{"messages": [m1, m2, ...], "status": ..., "error"?: ...}`` is stored as
    ``rest`` (canonical JSON of everything but the messages), the concatenated digests of
    its message *chunks*, and one blob per chunk. A chunk holds consecutive messages (the
    ranges of :func:`chunk_spans`), their canonical bytes joined by commas and packed
    (:func:`pack_blob`), so the unpacked bodies of a snapshot joined by commas are its
    message array without brackets. A chunk that did not change between two snapshots has
    the same bytes and so the same digest (of the stored bytes): it is stored once. Chat
    sessions change at their end, so every full chunk before the newest messages is
    shared, and storage grows with the *changes* between snapshots, not with their full
    size.

    Why chunks of growing size: a load fetches one blob row per chunk, and each costs the
    server an index probe; with sizes 8, 64, 512, ... a 200-turn session's head is 5 blobs
    (flat chunks of 16 were 38), for ~15 % more stored bytes (a message sits in one blob
    per size it has been part of). Snapshots written in an older format (flat chunks, and
    before them one blob per message, uncompressed) decode alike: the digests list the
    blobs in order whatever their sizes, and :func:`unpack_blob` reads both kinds.

    The reducer shares untouched message dicts between states, so the codec remembers
    the encoding of a message by object identity (holding a reference, so the id cannot
    be reused) and does not re-serialise or re-hash it at the next snapshot; a chunk is
    remembered by the digests of its messages.

    A load (:meth:`load`) remembers the messages it decoded from each stored blob, keyed
    by the blob's bytes: a blob stands for the same messages wherever it is found, and a
    chat's large chunks stay the same for hundreds of turns, so a later load of that
    session, or of an older version of it, decodes only the blobs it has not seen (at the
    head, the last few small ones). The messages are then shared between the states
    returned, as the reducer already shares them: states are immutable.

    Args:
        max_cached: messages remembered before the caches are cleared.
        chunk_messages: messages in the smallest chunk.
        growth: each larger chunk size is this many times the one below (1: flat chunks).
        packed: compress the blobs (``False`` writes the older format: raw JSON).
        array: packed blobs hold JSON arrays (``False`` writes the earlier packed format,
            see :func:`pack_blob`).
        max_decoded: bytes of decoded blob JSON remembered by :meth:`load` before its
            cache is cleared (0: none).
    """

    def __init__(
        self,
        max_cached: int = 50_000,
        chunk_messages: int = CHUNK_MESSAGES,
        growth: int = CHUNK_GROWTH,
        packed: bool = True,
        array: bool = True,
        max_decoded: int = DECODED_CACHE_BYTES,
    ) -> None:
        if chunk_messages < 1 or growth < 1:
            raise ValueError("chunk_messages and growth must be positive")
        self._max = max_cached
        self._k = chunk_messages
        self._growth = growth
        self._packed = packed
        self._array = array
        self._by_id: dict[int, tuple[Any, bytes, bytes]] = {}
        self._chunks: dict[bytes, tuple[bytes, bytes]] = {}
        self._decoded: BoundedMemo[bytes, list[Any]] = BoundedMemo(max_decoded)

    def encode(self, state: Mapping[str, Any]) -> tuple[bytes, bytes, dict[bytes, bytes]]:
        """Split a state.

        Returns:
            ``(rest, chunk_digests, blobs)``; ``blobs`` maps each chunk digest to its
            stored bytes.
        """
        if len(self._by_id) > self._max:
            self._by_id.clear()
        if len(self._chunks) > self._max // self._k + 1:
            self._chunks.clear()
        cache = self._by_id
        keys: list[bytes] = []
        bodies: list[bytes] = []
        for message in state["messages"]:
            hit = cache.get(id(message))
            if hit is not None and hit[0] is message:
                key, body = hit[1], hit[2]
            else:
                body = canonical(message)
                key = hashlib.sha256(body).digest()[:DIGEST_SIZE]
                cache[id(message)] = (message, key, body)
            keys.append(key)
            bodies.append(body)
        chunks = self._chunks
        digests: list[bytes] = []
        blobs: dict[bytes, bytes] = {}
        for start, end in chunk_spans(len(bodies), self._k, self._growth):
            ck = b"".join(keys[start:end])
            chunk = chunks.get(ck)
            if chunk is None:
                body = b",".join(bodies[start:end])
                if self._packed:
                    body = pack_blob(body, array=self._array)
                    digest = hashlib.sha256(body).digest()[:DIGEST_SIZE]
                else:
                    # A raw chunk of one message: its key is already the digest of these bytes.
                    digest = ck if end - start == 1 else hashlib.sha256(body).digest()[:DIGEST_SIZE]
                chunk = chunks[ck] = (digest, body)
            digests.append(chunk[0])
            blobs[chunk[0]] = chunk[1]
        rest = canonical({k: v for k, v in state.items() if k != "messages"})
        return rest, b"".join(digests), blobs

    @staticmethod
    def messages(stored: Iterable[bytes]) -> list[Any]:
        """The messages of stored blobs, in order."""
        # One parse of a JSON array is much faster than one orjson call per message; the
        # array is joined in one copy (each temporary of the state's size costs page faults).
        pieces: list[Any] = [b"["]
        for blob in stored:
            if blob[:1] == _LZ4_ARRAY:
                pieces += (memoryview(blob_array(blob))[1:-1], b",")
            else:
                pieces += (unpack_blob(blob), b",")
        if len(pieces) == 1:
            return []
        pieces[-1] = b"]"
        return orjson.loads(b"".join(pieces))  # type: ignore[no-any-return]

    @staticmethod
    def decode(rest: bytes, stored: Iterable[bytes]) -> dict[str, Any]:
        """Rebuild the state dict from ``rest`` and the stored blobs in order."""
        state: dict[str, Any] = {"messages": SnapshotCodec.messages(stored)}
        state.update(orjson.loads(rest))
        return state

    def forget_decoded(self) -> None:
        """Forget the messages :meth:`load` remembered (a benchmark's first load)."""
        self._decoded.clear()

    def load(self, rest: bytes, stored: Iterable[bytes]) -> dict[str, Any]:
        """:meth:`decode`, reusing the messages of blobs this codec has decoded before."""
        cache = self._decoded
        if not cache.enabled:
            return self.decode(rest, stored)
        messages: list[Any] = []
        for blob in stored:
            # Keyed by the stored bytes (hashed once per bytes object): the load reads
            # blobs, not their digests.
            found = cache.get(blob)
            if found is None:
                array = blob_array(blob)
                found = orjson.loads(array)
                cache.put(blob, found, len(array))
            messages += found
        state: dict[str, Any] = {"messages": messages}
        state.update(orjson.loads(rest))
        return state


def decode_many(payloads: Iterable[bytes]) -> list[dict[str, Any]]:
    """Decode a run of payloads (the tail of a checkout) in one parse."""
    data = list(payloads)
    if not data:
        return []
    return orjson.loads(b"[" + b",".join(data) + b"]")  # type: ignore[no-any-return]
