"""The only place where actions and states become bytes, and bytes become them again.

Everything is orjson. *Canonical* bytes (sorted keys, no whitespace) are what the store
writes and hashes, so the same action always has the same bytes on every backend and
after an export/import round trip.

- Actions: :func:`encode_action` / :func:`decode_payload`.
- Metadata: :func:`encode_metadata` (a JSON object or ``None``).
- The hash chain: :func:`chain_hash` over a length-prefixed envelope.
- Snapshots with structure sharing: :class:`SnapshotCodec` splits a state into chunks
  of consecutive top-level messages, each chunk stored once under a digest of its bytes,
  and the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import orjson

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
    "decode_many",
]

_SORT = orjson.OPT_SORT_KEYS
#: Bytes of SHA-256 kept as a message digest: 128 bits, collision-free in practice.
DIGEST_SIZE = 16
#: Messages per snapshot blob (see :class:`SnapshotCodec`); chosen by ``benchmarks store``.
CHUNK_MESSAGES = 16
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


class SnapshotCodec:
    """Encode states as shared message-chunk blobs and decode them back.

    A state ``{"messages": [m1, m2, ...], "status": ..., "error"?: ...}`` is stored as
    ``rest`` (canonical JSON of everything but the messages), the concatenated digests of
    its message *chunks*, and one blob per chunk. Chunk ``j`` holds messages
    ``j*k .. j*k+k-1`` (``k`` = ``chunk_messages``), their canonical bytes joined by commas,
    so the bodies of a snapshot joined by commas are its message array without brackets.
    A chunk that did not change between two snapshots has the same bytes and so the same
    digest: it is stored once. Chat sessions change at their end, so every full chunk
    before the newest messages is shared, and storage grows with the *changes* between
    snapshots, not with their full size.

    Why chunks and not one blob per message: a load fetches one blob row per chunk, and
    ~600 index probes for a 200-turn session cost more than the few KB a re-stored
    partial chunk takes per snapshot. A chunk of one message is exactly the old
    one-blob-per-message format, so snapshots written with any chunk size decode alike.

    The reducer shares untouched message dicts between states, so the codec remembers
    the encoding of a message by object identity (holding a reference, so the id cannot
    be reused) and does not re-serialise or re-hash it at the next snapshot; a chunk is
    remembered by the digests of its messages.
    """

    def __init__(self, max_cached: int = 50_000, chunk_messages: int = CHUNK_MESSAGES) -> None:
        if chunk_messages < 1:
            raise ValueError("chunk_messages must be positive")
        self._max = max_cached
        self._k = chunk_messages
        self._by_id: dict[int, tuple[Any, bytes, bytes]] = {}
        self._chunks: dict[bytes, tuple[bytes, bytes]] = {}

    def encode(self, state: Mapping[str, Any]) -> tuple[bytes, bytes, dict[bytes, bytes]]:
        """Split a state.

        Returns:
            ``(rest, chunk_digests, blobs)``; ``blobs`` maps each chunk digest to its body.
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
        size = self._k
        chunks = self._chunks
        digests: list[bytes] = []
        blobs: dict[bytes, bytes] = {}
        for j in range(0, len(bodies), size):
            ck = b"".join(keys[j : j + size])
            chunk = chunks.get(ck)
            if chunk is None:
                body = b",".join(bodies[j : j + size])
                # A chunk of one message: its key is already the digest of these bytes.
                single = j + 1 == len(bodies) or size == 1
                digest = ck if single else hashlib.sha256(body).digest()[:DIGEST_SIZE]
                chunk = chunks[ck] = (digest, body)
            digests.append(chunk[0])
            blobs[chunk[0]] = chunk[1]
        rest = canonical({k: v for k, v in state.items() if k != "messages"})
        return rest, b"".join(digests), blobs

    @staticmethod
    def decode(rest: bytes, bodies: Sequence[bytes]) -> dict[str, Any]:
        """Rebuild the state dict from ``rest`` and the message bodies in order."""
        # One parse of a JSON array is much faster than one orjson call per message.
        messages = orjson.loads(b"[" + b",".join(bodies) + b"]")
        state: dict[str, Any] = {"messages": messages}
        state.update(orjson.loads(rest))
        return state

    @staticmethod
    def decode_joined(rest: bytes, joined: bytes) -> dict[str, Any]:
        """:meth:`decode` of bodies already joined by commas (in order, no brackets)."""
        state: dict[str, Any] = {"messages": orjson.loads(b"[" + joined + b"]")}
        state.update(orjson.loads(rest))
        return state


def decode_many(payloads: Iterable[bytes]) -> list[dict[str, Any]]:
    """Decode a run of payloads (the tail of a checkout) in one parse."""
    data = list(payloads)
    if not data:
        return []
    return orjson.loads(b"[" + b",".join(data) + b"]")  # type: ignore[no-any-return]
