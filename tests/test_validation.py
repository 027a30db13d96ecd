"""One validator behind every public entry point, on both backends.

Every public method of EventStore, given a bad value for any one of its arguments, raises
InvalidEvent naming the argument (or a more specific EventStoreError) and writes nothing:
never a raw TypeError / ValueError / UnicodeEncodeError or a driver error.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest

from eventstore import EventStore, EventStoreError, InvalidEvent, VersionNotFound

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]

SEND = {"type": "send", "id": "u-1", "text": "hi"}

#: Values no session id (or event id, actor, branch name) may be.
BAD_IDS: list[Any] = ["", "\ud800", "a\udfffb", ["s1"], ("s1",), None, 5, b"s1", "a\x00b", "x" * 300]
#: Values no version argument may be.
BAD_VERSIONS: list[Any] = ["1", 1.5, True, [1], b"1"]
#: Values no count (limit, keep_last_turns) may be.
BAD_COUNTS: list[Any] = [-1, "1", 1.5, True, None]

Call = Callable[[EventStore, Any], Any]

SESSION_CALLS: dict[str, Call] = {
    "append": lambda s, v: s.append(v, [SEND]),
    "head": lambda s, v: s.head(v),
    "load": lambda s, v: s.load(v),
    "history": lambda s, v: s.history(v),
    "branch": lambda s, v: s.branch(v, at=1, new_id="b"),
    "diff-left": lambda s, v: s.diff((v, None), ("s1", None)),
    "diff-right": lambda s, v: s.diff(("s1", None), (v, None)),
    "replay": lambda s, v: s.replay(v),
    "turns": lambda s, v: s.turns(v),
    "compact": lambda s, v: s.compact(v, upto=1),
    "export": lambda s, v: s.export(v, io.StringIO()),
    "verify": lambda s, v: s.verify(v),
}

VERSION_CALLS: dict[str, Call] = {
    "append expected_version": lambda s, v: s.append("s1", [SEND], expected_version=v),
    "load version": lambda s, v: s.load("s1", version=v),
    "history after": lambda s, v: s.history("s1", after=v),
    "history upto": lambda s, v: s.history("s1", upto=v),
    "branch at": lambda s, v: s.branch("s1", at=v, new_id="b"),
    "diff left version": lambda s, v: s.diff(("s1", v), ("s1", None)),
    "diff right version": lambda s, v: s.diff(("s1", None), ("s1", v)),
    "replay after": lambda s, v: s.replay("s1", after=v),
    "replay upto": lambda s, v: s.replay("s1", upto=v),
    "turns upto": lambda s, v: s.turns("s1", upto=v),
    "compact upto": lambda s, v: s.compact("s1", upto=v),
}

OTHER_CALLS: dict[str, tuple[Call, list[Any]]] = {
    "append actions": (lambda s, v: s.append("s1", v), [None, 5, "send", SEND, [None], [5], [], b"x"]),
    "append event_ids": (lambda s, v: s.append("s1", [SEND], event_ids=v), ["e", 5, [None], [""], ["\ud800"], ["a", "b"]]),
    "append actor": (lambda s, v: s.append("s1", [SEND], actor=v), [v for v in BAD_IDS if v is not None]),
    "append metadata": (lambda s, v: s.append("s1", [SEND], metadata=v), [[1], "x", 5, {"n": float("nan")}, {1: 2}]),
    "branch new_id": (lambda s, v: s.branch("s1", at=1, new_id=v), [v for v in BAD_IDS if v is not None]),
    "history limit": (lambda s, v: s.history("s1", limit=v), [c for c in BAD_COUNTS if c is not None]),
    "history desc": (lambda s, v: s.history("s1", desc=v), [None, 1, "yes"]),
    "diff ref": (lambda s, v: s.diff(v, ("s1", None)), ["s1", ("s1",), ("s1", None, 3), None, 5]),
    "diff events": (lambda s, v: s.diff(("s1", None), ("s1", None), events=v), [None, 1, "yes"]),
    "compact archive": (lambda s, v: s.compact("s1", upto=1, archive=v), [5, ["f"], b"f"]),
    "compact_all keep_last_turns": (lambda s, v: s.compact_all(keep_last_turns=v), BAD_COUNTS),
    "compact_all progress": (lambda s, v: s.compact_all(keep_last_turns=1, progress=v), [5, "f"]),
    "export out": (lambda s, v: s.export("s1", v), [None, 5, ["f"]]),
    "export progress": (lambda s, v: s.export("s1", io.StringIO(), progress=v), [5, "f"]),
    "import_ src": (lambda s, v: s.import_(v), [None, 5, "a file name", b"bytes"]),
    "import_ progress": (lambda s, v: s.import_([], progress=v), [5, "f"]),
    "verify progress": (lambda s, v: s.verify(progress=v), [5, "f"]),
}


def _state(store: EventStore) -> list[Any]:
    """What the database holds, to check that a refused call wrote nothing."""
    return [(i.id, i.head, i.baseline) for i in store.sessions()] + [
        e.hash for i in store.sessions() for e in store.history(i.id)
    ]


@pytest.fixture
def seeded(store: EventStore) -> EventStore:
    store.append("s1", [SEND, {"type": "stop"}], actor="ada")
    return store


def _refused(store: EventStore, call: Call, value: Any) -> EventStoreError:
    before = _state(store)
    with pytest.raises(EventStoreError) as info:
        result = call(store, value)
        list(result) if hasattr(result, "__next__") else None  # iterators validate eagerly anyway
    assert _state(store) == before, value
    return info.value


@pytest.mark.parametrize("method", sorted(SESSION_CALLS))
def test_every_method_refuses_bad_session_ids(seeded: EventStore, method: str) -> None:
    for bad in BAD_IDS:
        if method == "verify" and bad is None:
            continue  # verify(None) checks every session
        err = _refused(seeded, SESSION_CALLS[method], bad)
        assert isinstance(err, InvalidEvent), (method, bad, err)


@pytest.mark.parametrize("call", sorted(VERSION_CALLS))
def test_every_version_argument_refuses_other_types(seeded: EventStore, call: str) -> None:
    for bad in BAD_VERSIONS:
        err = _refused(seeded, VERSION_CALLS[call], bad)
        assert isinstance(err, InvalidEvent), (call, bad, err)


@pytest.mark.parametrize("call", sorted(VERSION_CALLS))
def test_out_of_range_versions_are_refused_specifically(seeded: EventStore, call: str) -> None:
    for bad in (-1, 99, 2**40):
        if call.startswith("history"):
            # a history range beyond the log is simply empty
            assert list(VERSION_CALLS[call](seeded, bad)) in ([], list(seeded.history("s1")))
            continue
        err = _refused(seeded, VERSION_CALLS[call], bad)
        if call == "append expected_version":
            assert isinstance(err, (InvalidEvent, EventStoreError)), err
        else:
            assert isinstance(err, VersionNotFound), (call, bad, err)


@pytest.mark.parametrize("call", sorted(OTHER_CALLS))
def test_every_other_argument_refuses_bad_values(seeded: EventStore, call: str) -> None:
    fn, values = OTHER_CALLS[call]
    for bad in values:
        err = _refused(seeded, fn, bad)
        assert isinstance(err, InvalidEvent), (call, bad, err)


def test_the_constructor_refuses_bad_options(db_url: str) -> None:
    for option in ("snapshot_every", "max_event_bytes", "max_id_length"):
        for bad in (0, -1, "5", 1.5, None):
            with pytest.raises(InvalidEvent, match=option):
                EventStore(db_url, **{option: bad})
    with pytest.raises(InvalidEvent, match="url"):
        EventStore(None)  # type: ignore[arg-type]
