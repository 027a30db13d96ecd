"""The one argument validator behind every public entry point (pure: no storage, no I/O).

Every public method of the store, and of the modules under it, checks its arguments here
before it touches storage, so a hostile value (a lone surrogate, a list where an id
belongs, ``None`` actions, a string version, a negative limit) is refused with
:class:`~eventstore.errors.InvalidEvent` naming the argument, never a driver error or a
raw ``TypeError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eventstore.core.codec import encode_native
from eventstore.core.feed_rules import FeedKey, parse_position
from eventstore.core.models import check_json
from eventstore.errors import InvalidEvent

__all__ = ["MAX_VERSION", "MAX_INT", "MAX_SECONDS", "CONTROL", "check_text", "Limits", "Validator"]

#: Versions are 32-bit integers in the schema.
MAX_VERSION = 2**31 - 1
#: The largest integer argument passed on to the database (a 64-bit signed integer).
MAX_INT = 2**63 - 1
#: The longest duration accepted (``idle_timeout``, ``stale_after``): about 31 years. Longer
#: waits overflow the platform's timers; ``None`` is how to wait forever.
MAX_SECONDS = 1e9
#: The control characters no id, title or metadata key may hold.
CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_text(value: str, what: str, controls: re.Pattern[str] = CONTROL) -> None:
    """Refuse a string argument holding a control character (one of ``controls``) or a
    lone surrogate (not valid Unicode text, which no database column stores).

    Raises:
        InvalidEvent: it holds one (``field`` is ``what``).
    """
    if controls.search(value):
        raise InvalidEvent(f"{what} must not contain control characters", field=what)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidEvent(
                f"{what} contains a lone surrogate (not valid Unicode text)", field=what
            ) from None


@dataclass(frozen=True)
class Limits:
    """The size limits a store enforces.

    Attributes:
        max_event_bytes: the largest encoded action (and metadata) accepted.
        max_id_length: the longest session id, event id or actor accepted.
    """

    max_event_bytes: int = 1 << 20
    max_id_length: int = 256


def _per_action(value: Any, n: int, field: str, kind: str, noun: str) -> tuple[Any, ...]:
    """``value`` as a tuple of one entry per action.

    Raises:
        InvalidEvent: it is a string, a mapping or not iterable, or its length is not ``n``.
    """
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidEvent(f"{field} must be {kind}, one entry per action", field=field)
    items = tuple(value)
    if len(items) != n:
        raise InvalidEvent(
            f"{field} has {len(items)} {noun} for {n} actions; give one per action", field=field
        )
    return items


class Validator:
    """Checks the arguments of public calls against a store's :class:`Limits`.

    Stateless apart from the limits, so one instance is shared by every thread.
    """

    def __init__(self, limits: Limits) -> None:
        if limits.max_event_bytes < 1 or limits.max_id_length < 1:
            raise ValueError("max_event_bytes and max_id_length must be positive")
        self.limits = limits

    def id(self, value: Any, what: str = "session") -> str:
        """A session id, event id or actor: a non-empty string of valid Unicode text,
        no control characters, within ``max_id_length`` characters and 2048 UTF-8 bytes.

        Raises:
            InvalidEvent: it is not (``field`` is ``what``).
        """
        if not isinstance(value, str) or not value:
            raise InvalidEvent(f"{what} must be a non-empty string, got {value!r}", field=what)
        if len(value) > self.limits.max_id_length:
            raise InvalidEvent(
                f"{what} is {len(value)} characters long, more than max_id_length="
                f"{self.limits.max_id_length}",
                field=what,
            )
        check_text(value, what)
        # Ids are indexed: PostgreSQL's btree refuses entries over ~2.7 kB whatever
        # max_id_length says, so cap the UTF-8 size too (an InvalidEvent, not a driver error).
        if len(value) > 512 and len(value.encode("utf-8")) > 2048:
            raise InvalidEvent(f"{what} is more than 2048 bytes of UTF-8 (ids are indexed)", field=what)
        return value

    def optional_id(self, value: Any, what: str) -> str | None:
        """:meth:`id`, or ``None``."""
        return None if value is None else self.id(value, what)

    def event_ids(self, event_ids: Any, n: int) -> tuple[str, ...] | None:
        """One distinct valid id per action, or ``None``.

        Raises:
            InvalidEvent: ``field="event_ids"``, ``index`` the offending position.
        """
        if event_ids is None:
            return None
        ids = _per_action(event_ids, n, "event_ids", "a list of strings", "ids")
        for i, event_id in enumerate(ids):
            try:
                self.id(event_id, "event_ids")
            except InvalidEvent as exc:
                raise InvalidEvent(exc.reason, field="event_ids", index=i) from None
        if len(set(ids)) != len(ids):
            raise InvalidEvent("event_ids repeats an id within the batch", field="event_ids")
        return ids

    def natives(self, native: Any, n: int) -> tuple[bytes | None, ...] | None:
        """The stored bytes of an append's provider-native data: one entry per action
        (``None`` for none), or ``None`` when no action carries any.

        An entry is ``bytes`` or ``str`` of JSON text (kept byte for byte) or any JSON
        value (stored as canonical JSON), within ``max_event_bytes`` once encoded.

        Raises:
            InvalidEvent: ``field="native"``, ``index`` the offending position.
        """
        if native is None:
            return None
        items = _per_action(native, n, "native", "a list (None for an action without)", "entries")
        out = tuple(self.native(item, index=i) for i, item in enumerate(items))
        return out if any(b is not None for b in out) else None

    def native(self, value: Any, *, index: int | None = None) -> bytes | None:
        """The stored bytes of one event's provider-native data (see :meth:`natives`).

        Raises:
            InvalidEvent: ``field="native"``.
        """
        try:
            if not isinstance(value, (str, bytes, bytearray, memoryview)):
                check_json(value, "native")  # orjson would turn NaN into null
            data = encode_native(value)
        except InvalidEvent as exc:
            raise InvalidEvent(exc.reason, field="native", index=index) from None
        if data is not None:
            self.size(data, "native data", field="native", index=index)
        return data

    @staticmethod
    def version(value: Any, what: str = "version") -> int | None:
        """An optional version argument: ``None`` or an integer (not a ``bool``).

        Whether the version exists in a session is checked against its row later
        (:class:`~eventstore.errors.VersionNotFound`, :class:`~eventstore.errors.CompactedError`).

        Raises:
            InvalidEvent: it is another type (a ``bool``, a string, a float).
        """
        if value is not None and (type(value) is not int or not -MAX_INT <= value <= MAX_INT):
            raise InvalidEvent(f"{what} must be an integer or None, got {value!r}", field=what)
        return value

    @staticmethod
    def count(value: Any, what: str) -> int | None:
        """An optional count (``limit``, ``keep_last_turns``): ``None`` or an integer >= 0.

        Raises:
            InvalidEvent: it is another type or negative.
        """
        if value is None:
            return None
        if type(value) is not int or not 0 <= value <= MAX_INT:
            raise InvalidEvent(f"{what} must be an integer in 0..2**63-1, got {value!r}", field=what)
        return value

    @staticmethod
    def timeout(value: Any, what: str = "idle_timeout") -> float | None:
        """An optional duration in seconds: ``None`` (no limit) or a number in
        ``0..MAX_SECONDS``.

        Raises:
            InvalidEvent: it is another type (a ``bool``, a string), negative, not finite or
                longer than :data:`MAX_SECONDS`.
        """
        if value is None:
            return None
        if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
            raise InvalidEvent(
                f"{what} must be a number of seconds in 0..{MAX_SECONDS:.0e} or None, got {value!r}", field=what
            )
        return float(value)

    @staticmethod
    def position(value: Any, what: str = "after") -> FeedKey | None:
        """An optional feed position (an event's ``position``); its key.

        Raises:
            InvalidEvent: it is not a position string this store hands out.
        """
        return parse_position(value, what)

    @staticmethod
    def flag(value: Any, what: str) -> bool:
        """A boolean option.

        Raises:
            InvalidEvent: it is not a ``bool``.
        """
        if not isinstance(value, bool):
            raise InvalidEvent(f"{what} must be True or False, got {value!r}", field=what)
        return value

    @staticmethod
    def progress(value: Any) -> Any:
        """An optional progress callback.

        Raises:
            InvalidEvent: it is neither ``None`` nor callable.
        """
        if value is not None and not callable(value):
            raise InvalidEvent(f"progress must be callable or None, got {value!r}", field="progress")
        return value

    def ref(self, value: Any, what: str) -> tuple[str, int | None]:
        """A ref ``(session, version | None)``.

        Raises:
            InvalidEvent: it is not a pair of a valid id and an optional version.
        """
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or len(value) != 2:
            raise InvalidEvent(
                f"{what} must be a (session, version or None) pair, got {value!r}", field=what
            )
        return self.id(value[0], what), self.version(value[1], what)

    def size(
        self, payload: bytes, what: str, *, field: str | None = None, index: int | None = None
    ) -> None:
        """An encoded action or metadata within ``max_event_bytes``.

        Raises:
            InvalidEvent: it is larger.
        """
        if len(payload) > self.limits.max_event_bytes:
            raise InvalidEvent(
                f"{what} is {len(payload)} bytes encoded, more than max_event_bytes="
                f"{self.limits.max_event_bytes}",
                field=field,
                index=index,
            )
