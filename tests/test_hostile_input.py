"""Hostile input: whatever a client sends is either stored and loaded back identically, or
refused with ``InvalidEvent`` and nothing written — never a crash, never a driver error.

Two layers are attacked:

- the parser (``parse_action`` / ``parse_action_json``) with random JSON values, wrong types,
  unknown action and part types, deep nesting, NaN/Infinity, lone surrogates, invalid UTF-8;
- the store on both backends (``append`` / ``load`` / ``history``) with the same values plus
  NUL characters, huge strings over the configured ``max_event_bytes``, and session / event ids
  carrying quotes, semicolons, ``%``, unicode, NUL, nothing at all, or 10 kB of text;
- the CLI ``append`` file path with bytes that are not UTF-8 or not JSON.

``max_examples`` stays small: the suite must stay fast; the strategies aim at edges instead.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import samples
from eventstore.errors import EventStoreError, InvalidEvent
from eventstore.core.models import parse_action, parse_action_json

pytestmark = pytest.mark.twins  # only the tests that use the `store` fixture

# --------------------------------------------------------------------------- strategies

# Characters that break naive quoting, escaping, LIKE patterns, C strings and encodings.
NASTY_CHARS = "'\";%_\\\x00\n\r\t\u2028\u202e\ufeff\U0001f600é中\x7f/*--"
nasty_text = st.text(alphabet=st.sampled_from(NASTY_CHARS) | st.characters(), max_size=40)
# Lone surrogates are valid Python str but not Unicode text: JSON/UTF-8 cannot carry them.
any_text = st.text(
    alphabet=st.characters(codec=None, exclude_categories=()), max_size=30
) | nasty_text

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
# Values no JSON decoder could have produced.
python_junk = st.one_of(
    st.binary(max_size=8),
    st.tuples(st.integers()),
    st.sets(st.integers(), max_size=2),
    st.builds(object),
    st.complex_numbers(),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
)

TEMPLATES: list[dict[str, Any]] = samples.demo_conversation() + samples.random_actions(
    random.Random(6), 200
)
OPTIONAL_KEYS = {"reason", "code", "within", "prompt"}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))


@st.composite
def mutated_actions(draw: st.DrawFn) -> Any:
    """A well-formed action with one hostile change: a value replaced by a random JSON or
    Python value, a key dropped, an unknown key added, or an unknown type tag."""
    action = copy.deepcopy(draw(st.sampled_from(TEMPLATES)))
    paths = [p for p in _paths(action) if p]
    path = draw(st.sampled_from(paths))
    parent: Any = action
    for key in path[:-1]:
        parent = parent[key]
    how = draw(st.sampled_from(["replace", "junk", "drop", "extra", "type"]))
    if how == "replace":
        parent[path[-1]] = draw(json_values)
    elif how == "junk":
        parent[path[-1]] = draw(python_junk)
    elif how == "drop":
        del parent[path[-1]]
    elif how == "extra":
        parent[draw(any_text)] = draw(json_values)
    else:
        target = action["part"] if "part" in action and draw(st.booleans()) else action
        target["type"] = draw(any_text | st.sampled_from(["Send", "send ", "PART", "tool_call"]))
    return action


@st.composite
def valid_actions(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed action whose free-form strings and JSON payloads are hostile but legal."""
    action = copy.deepcopy(draw(st.sampled_from(TEMPLATES)))
    legal_text = st.text(max_size=30) | st.text(
        alphabet=st.sampled_from(NASTY_CHARS), max_size=30
    )
    legal_json = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | legal_text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(legal_text, inner, max_size=4),
        max_leaves=12,
    )
    for holder in (action, action.get("part", {})):
        for key in ("text", "id", "messageId", "name", "prompt", "within", "reason", "error"):
            if isinstance(holder.get(key), str) and draw(st.booleans()):
                holder[key] = draw(legal_text)
        for key in ("input", "output") + (("error",) if holder.get("type") == "tool-error" else ()):
            if key in holder and draw(st.booleans()):
                holder[key] = draw(legal_json)
    return action


def _strip_null_optionals(action: Any) -> Any:
    """The wire format: optional keys are omitted when unset; a ``null`` optional is normalised away."""
    if not isinstance(action, dict):
        return action
    out = {k: v for k, v in action.items() if not (k in OPTIONAL_KEYS and v is None)}
    if isinstance(out.get("part"), dict):
        out["part"] = _strip_null_optionals(out["part"])
    return out


def _nested(depth: int, leaf: Any = "x") -> Any:
    value: Any = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _tool_call(input_value: Any) -> dict[str, Any]:
    return {
        "type": "part",
        "part": {"type": "tool-call", "messageId": "a-1", "id": "c-1", "name": "t", "input": input_value},
    }


# --------------------------------------------------------------------------- the parser


def _parse_or_refuse(obj: Any) -> Any:
    """parse_action either accepts (and round-trips) or raises InvalidEvent — nothing else."""
    try:
        model = parse_action(obj)
    except InvalidEvent as exc:
        assert str(exc).startswith("invalid event"), str(exc)
        return None
    wire = model.to_json()
    assert wire == _strip_null_optionals(obj)
    assert parse_action(wire) == model
    return model


@settings(max_examples=150)
@given(json_values | python_junk)
def test_random_values_are_refused_or_accepted_never_crash(value: Any) -> None:
    _parse_or_refuse(value)


@settings(max_examples=250)
@given(mutated_actions())
def test_mutated_actions_are_refused_or_round_trip(action: Any) -> None:
    _parse_or_refuse(action)


@settings(max_examples=60)
@given(valid_actions())
def test_hostile_but_legal_payloads_round_trip(action: dict[str, Any]) -> None:
    assert _parse_or_refuse(action) is not None


@pytest.mark.parametrize(
    "action, field",
    [
        ({"type": "teleport"}, "type"),
        ({"type": "part", "part": {"type": "image", "url": "x"}}, "part.type"),
        ({"type": "send", "id": 5, "text": "hi"}, "id"),
        ({"type": "send", "id": "u", "text": ["hi"]}, "text"),
        ({"type": "send", "id": "u", "text": "hi", "extra": 1}, "extra"),
        ({"type": "send", "id": "u"}, "text"),
        ({"type": "toolPhase", "name": "t", "state": "done"}, "state"),
        ({"type": "part", "part": {"type": "error", "error": "x", "code": "teapot"}}, "part.code"),
        (_tool_call(float("nan")), "part.input"),
        (_tool_call({"a": [1, float("inf")]}), "part.input.a.1"),
        (_tool_call(-float("inf")), "part.input"),
        (_tool_call("\ud800"), "part.input"),
        ({"type": "send", "id": "u\udfff", "text": "x"}, None),
        (_tool_call(2**64), "part.input"),
        (_tool_call({1: "int key"}), "part.input"),
        (_tool_call(b"bytes"), "part.input"),
        ({"type": "send", "id": "u", "text": True}, "text"),
        ({"type": "stop", "id": None}, None),
    ],
)
def test_refusals_name_the_field(action: Any, field: str | None) -> None:
    with pytest.raises(InvalidEvent) as info:
        parse_action(action)
    if field is not None:
        assert info.value.field == field, str(info.value)


@pytest.mark.parametrize("value", [None, [], "send", 7, 1.5, [{"type": "stop"}], True])
def test_non_objects_are_refused(value: Any) -> None:
    with pytest.raises(InvalidEvent):
        parse_action(value)


@pytest.mark.parametrize("depth", [100, 1_000, 20_000])
def test_deep_nesting_never_overflows_the_stack(depth: int) -> None:
    # Either accepted intact or refused cleanly; RecursionError or a segfault would fail.
    _parse_or_refuse(_tool_call(_nested(depth)))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"null",
        b'{"type": "stop"} trailing',
        b'{"type": "part", "part": {"type": "tool-call", "messageId": "a", "id": "c", '
        b'"name": "t", "input": NaN}}',
        b'{"type": "part", "part": {"type": "tool-result", "id": "c", "output": Infinity}}',
        b'{"type": "part", "part": {"type": "tool-result", "id": "c", "output": -Infinity}}',
        b'{"type": "send", "id": "u", "text": "\xff\xfe"}',
        b'{"type": "send", "id": "u", "text": "\xed\xa0\x80"}',  # an encoded surrogate
        b'{"type": "send", "id": "u", "text": "\\ud800"}',  # an escaped lone surrogate
        b'{"type": "send", "id": "u", "text": "\xc3"}',  # truncated sequence
        b"\xef\xbb\xbf" + b'{"type": "stop"}',  # a BOM is not JSON
        b"[" * 5000 + b"]" * 5000,
        b'{"type": "send", "id": "u", "text": "a", "text": 5}',  # duplicate keys: the last wins, and is no string
    ],
)
def test_raw_json_that_is_not_valid_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidEvent):
        parse_action_json(raw)


def test_raw_json_with_nul_and_unicode_escapes_round_trips() -> None:
    model = parse_action_json(b'{"type": "send", "id": "u\\u0000;\'\\"%", "text": "\\u0000\\ud83d\\ude00"}')
    assert model.to_json() == {"type": "send", "id": "u\x00;'\"%", "text": "\x00\U0001f600"}


@settings(max_examples=100)
@given(st.binary(max_size=64))
def test_random_bytes_are_refused_or_accepted_never_crash(raw: bytes) -> None:
    try:
        model = parse_action_json(raw)
    except InvalidEvent:
        return
    assert model.to_json() == _strip_null_optionals(json.loads(raw))


# --------------------------------------------------------------------------- the store

from eventstore.errors import SessionNotFound  # noqa: E402
from eventstore import EventStore  # noqa: E402

MAX_EVENT_BYTES = 64 * 1024
MAX_ID_LENGTH = 256


@pytest.fixture
def hostile_store(db_url: str) -> Iterator[EventStore]:
    store = EventStore(db_url, max_event_bytes=MAX_EVENT_BYTES, max_id_length=MAX_ID_LENGTH, snapshot_every=4)
    store.migrate()
    try:
        yield store
    finally:
        store.close()


def _snapshot_of(store: EventStore) -> list[tuple[str, int]]:
    return sorted((s.id, s.head) for s in store.sessions())


def _append_or_refuse(
    store: EventStore, session: str, actions: list[Any], **kwargs: Any
) -> bool:
    """Append, or check that the refusal is InvalidEvent and that nothing was written.

    Returns whether the batch was stored; when stored, history and load give back exactly
    the validated actions (and their metadata / actor / ids).
    """
    before = _snapshot_of(store)
    try:
        result = store.append(session, actions, **kwargs)
    except InvalidEvent as exc:
        assert str(exc).startswith("invalid event"), str(exc)
        assert _snapshot_of(store) == before, "a refused append wrote something"
        return False
    except EventStoreError as exc:  # a driver error, mapped or not, is a failure here
        pytest.fail(f"hostile input gave {type(exc).__name__} instead of InvalidEvent: {exc}")
    assert result.count == len(actions)
    events = list(store.history(session, after=result.first_version - 1))
    assert [e.action for e in events] == [_strip_null_optionals(a) for a in actions]
    assert [e.session_id for e in events] == [session] * len(actions)
    if kwargs.get("event_ids") is not None:
        assert [e.event_id for e in events] == list(kwargs["event_ids"])
    for e in events:
        assert e.actor == kwargs.get("actor")
        assert e.metadata == kwargs.get("metadata")
    assert store.head(session) == result.version
    assert session in {s.id for s in store.sessions()}
    # A checkout folds the stored actions: it must not fail on anything that was accepted.
    store.load(session)
    return True


SESSION_IDS = [
    "plain",
    "it's",
    'say "hi"',
    "a;DROP TABLE events;--",
    "100%",
    "%s%s%n",
    "_%_",
    "back\\slash",
    "naïve-中文-🙂",
    "\u202eright-to-left",
    "\ufeffbom",
    " leading and trailing ",
    "x" * MAX_ID_LENGTH,
    "🙂" * MAX_ID_LENGTH,  # 1 kB of UTF-8 in 256 characters
]
BAD_SESSION_IDS = [
    "",
    "nul\x00byte",
    "new\nline",
    "x" * (MAX_ID_LENGTH + 1),
    "x" * 10_240,
    "lone\ud800surrogate",
    "\udfff",
    None,
    5,
    b"bytes",
    ["list"],
]


@pytest.mark.parametrize("session", SESSION_IDS, ids=lambda s: repr(s)[:24])
def test_odd_session_ids_round_trip(hostile_store: EventStore, session: str) -> None:
    actions = [{"type": "send", "id": "u-1", "text": session}, {"type": "stop"}]
    assert _append_or_refuse(
        hostile_store, session, actions, expected_version=0, event_ids=[session, "e-2"]
    )
    assert hostile_store.load(session).to_json()["messages"][0]["parts"][0]["text"] == session
    branch = hostile_store.branch(session, at=1, new_id=session[:-1] + "'")
    assert hostile_store.head(branch) == 1
    assert hostile_store.verify(session).ok


@pytest.mark.parametrize("session", BAD_SESSION_IDS, ids=lambda s: repr(s)[:24])
def test_bad_session_ids_are_refused(hostile_store: EventStore, session: Any) -> None:
    assert not _append_or_refuse(hostile_store, session, [{"type": "stop"}])
    # Reads and a branch with the same id fail cleanly: not found, or refused.
    for call in (
        lambda: hostile_store.head(session),
        lambda: hostile_store.load(session),
        lambda: list(hostile_store.history(session)),
        lambda: hostile_store.branch(session),
        # verify(None) means "every session": only a real id can be hostile here.
        *([lambda: hostile_store.verify(session)] if session is not None else []),
    ):
        with pytest.raises((SessionNotFound, InvalidEvent)):
            call()
    hostile_store.append("parent", [{"type": "stop"}])
    if session is not None:  # new_id=None asks for a generated id
        with pytest.raises(InvalidEvent):
            hostile_store.branch("parent", new_id=session)
    assert _snapshot_of(hostile_store) == [("parent", 1)]


@pytest.mark.parametrize("event_id", BAD_SESSION_IDS, ids=lambda s: repr(s)[:24])
def test_bad_event_ids_are_refused(hostile_store: EventStore, event_id: Any) -> None:
    assert not _append_or_refuse(hostile_store, "s", [{"type": "stop"}], event_ids=[event_id])


@pytest.mark.parametrize("actor", BAD_SESSION_IDS[:-4], ids=lambda s: repr(s)[:24])
def test_bad_actors_are_refused(hostile_store: EventStore, actor: Any) -> None:
    assert not _append_or_refuse(hostile_store, "s", [{"type": "stop"}], actor=actor)


@pytest.mark.parametrize(
    "metadata",
    [
        {"nan": float("nan")},
        {"inf": [float("inf")]},
        {"big": 2**64},
        {"surrogate": "\ud800"},
        {1: "int key"},
        {"deep": _nested(5_000)},
        ["not", "an", "object"],
        "string",
        {"bytes": b"x"},
        {"huge": "x" * (MAX_EVENT_BYTES + 1)},
    ],
    ids=["nan", "inf", "2**64", "surrogate", "int-key", "deep", "list", "str", "bytes", "huge"],
)
def test_bad_metadata_is_refused(hostile_store: EventStore, metadata: Any) -> None:
    assert not _append_or_refuse(hostile_store, "s", [{"type": "stop"}], metadata=metadata)


def test_odd_metadata_and_actor_round_trip(hostile_store: EventStore) -> None:
    metadata = {"nul": "a\x00b", "quote": "'\";--", "pct": "%", "uni": "🙂", "n": [0, -1, 2**63 - 1, 1.5e300]}
    assert _append_or_refuse(
        hostile_store, "s", [{"type": "stop"}], actor="o'brien; 100% 🙂", metadata=metadata
    )


def test_huge_strings_over_the_limit_are_refused(hostile_store: EventStore) -> None:
    under = "x" * (MAX_EVENT_BYTES - 200)
    assert _append_or_refuse(hostile_store, "s", [{"type": "send", "id": "u", "text": under}])
    over = "🙂" * (MAX_EVENT_BYTES // 4 + 1)  # few characters, too many bytes
    batch = [{"type": "stop"}, {"type": "send", "id": "u", "text": over}]
    with pytest.raises(InvalidEvent) as info:
        hostile_store.append("s", batch)
    assert info.value.index == 1 and "max_event_bytes" in str(info.value)
    assert hostile_store.head("s") == 1
    with pytest.raises(InvalidEvent):
        hostile_store.append("s", [_tool_call({"blob": "y" * MAX_EVENT_BYTES})])
    assert hostile_store.head("s") == 1


def test_the_limits_are_configurable(db_url: str) -> None:
    with EventStore(db_url, max_event_bytes=100, max_id_length=3) as small:
        small.migrate()
        with pytest.raises(InvalidEvent):
            small.append("abcd", [{"type": "stop"}])
        with pytest.raises(InvalidEvent):
            small.append("abc", [{"type": "send", "id": "u", "text": "x" * 100}])
        small.append("abc", [{"type": "send", "id": "u", "text": "x" * 50}], event_ids=["e1"])
        assert small.head("abc") == 1


@pytest.mark.parametrize("depth", [200, 5_000])
def test_deep_nesting_is_stored_or_refused(hostile_store: EventStore, depth: int) -> None:
    _append_or_refuse(hostile_store, f"deep-{depth}", [_tool_call(_nested(depth))])


def test_nul_characters_round_trip_on_both_backends(hostile_store: EventStore) -> None:
    actions = [
        {"type": "send", "id": "u\x00", "text": "\x00nul\x00"},
        {"type": "part", "part": {"type": "message-start", "messageId": "a\x00"}},
        {"type": "part", "part": {"type": "text-delta", "messageId": "a\x00", "text": "\x00"}},
        _tool_call({"k\x00": ["\x00", {"\x00": None}]}),
    ]
    assert _append_or_refuse(hostile_store, "nul", actions, metadata={"\x00": "\x00"})
    assert hostile_store.load("nul").to_json()["messages"][0]["parts"][0]["text"] == "\x00nul\x00"


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(mutated_actions() | valid_actions(), min_size=1, max_size=4))
def test_random_batches_are_stored_identically_or_refused(
    hostile_store: EventStore, batch: list[Any]
) -> None:
    session = f"h-{uuid.uuid4().hex[:12]}"
    ids = [f"{session}-{i}" for i in range(len(batch))]
    stored = _append_or_refuse(hostile_store, session, batch, event_ids=ids)
    if stored:
        # An idempotent retry of what was stored writes nothing and returns the same result.
        again = hostile_store.append(session, batch, event_ids=ids)
        assert again.version == len(batch) and hostile_store.head(session) == len(batch)
    else:
        with pytest.raises(SessionNotFound):
            hostile_store.head(session)


@pytest.mark.parametrize("session", ["x" * 10_240, "".join(chr(0x4E00 + i % 2000) for i in range(10_240))], ids=["ascii", "cjk"])
def test_10_kb_ids_with_a_raised_limit_are_refused_not_a_driver_error(db_url: str, session: str) -> None:
    with EventStore(db_url, max_id_length=20_000) as store:
        store.migrate()
        assert not _append_or_refuse(store, session, [{"type": "stop"}])
        assert not _append_or_refuse(store, "s", [{"type": "stop"}], event_ids=[session])
        assert _append_or_refuse(store, "y" * 2000, [{"type": "stop"}], event_ids=["z" * 2000])


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    "raw",
    [
        b'[{"type": "send", "id": "u", "text": "\xff\xfe"}]',  # not UTF-8
        b'{"type": "send", "id": "u", "text": "\xed\xa0\x80"}',  # an encoded surrogate
        b'[{"type": "part", "part": {"type": "tool-result", "id": "c", "output": NaN}}]',
        b'[{"type": "part", "part": {"type": "tool-result", "id": "c", "output": Infinity}}]',
        b'[{"type": "send", "id": "u", "text": "\\ud800"}]',  # an escaped lone surrogate
        b'[{"type": "teleport"}]',
        b'{"type": "stop"}\n{"type": "send"}\n',  # the second line is malformed: nothing written
        b"[" * 100_000 + b"]" * 100_000,
        b'[{"type": "send", "id": "u", "text": "' + b"x" * (2 << 20) + b'"}]',
        b"\x00\x01\x02",
        b"",
    ],
    ids=["latin1", "surrogate-bytes", "nan", "infinity", "escaped-surrogate", "unknown-type",
         "bad-second-line", "deep", "huge", "binary", "empty"],
)
def test_cli_append_refuses_hostile_files_cleanly(db_url: str, tmp_path: Path, raw: bytes) -> None:
    from typer.testing import CliRunner

    from eventstore_cli.app import app

    with EventStore(db_url) as store:
        store.migrate()
        store.append("s", [{"type": "stop"}])
    path = tmp_path / "actions.json"
    path.write_bytes(raw)
    r = CliRunner().invoke(app, ["--db", db_url, "append", "s", str(path)])
    assert r.exit_code == 1, (r.exit_code, r.stdout, r.stderr[-500:])
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr[-500:]
    assert "Traceback" not in r.stdout + r.stderr
    with EventStore(db_url) as store:
        assert store.head("s") == 1 and [s.id for s in store.sessions()] == ["s"]


def test_cli_append_stores_nul_and_odd_ids_exactly(db_url: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from eventstore_cli.app import app

    with EventStore(db_url) as store:
        store.migrate()
    action = {"type": "send", "id": "u\x00'\";%", "text": "\x00🙂\u2028"}
    path = tmp_path / "actions.jsonl"
    path.write_text(json.dumps(action) + "\n", encoding="utf-8")
    session = "it's; 100% 🙂"
    r = CliRunner().invoke(app, ["--db", db_url, "append", session, str(path)])
    assert r.exit_code == 0, r.stderr
    with EventStore(db_url) as store:
        assert [e.action for e in store.history(session)] == [action]
