"""Provider-native data on events: stored byte for byte, hashed, exported, erased, shown.

Every test runs on both backends and on both twins (the async store behind its test
adapter). The tampering tests take the attacker of ``tests/test_tamper.py``: a superuser
(PostgreSQL) or someone who drops the triggers (SQLite).
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from eventstore import EventIdConflict, EventStore, InvalidEvent
from eventstore import EventStore as SyncStore
from eventstore.core.codec import chain_hash
from eventstore_cli.app import app
from conftest import make_store
from test_audit import other_url  # noqa: F401 - a fixture
from test_tamper import _as_attacker, _pk

pytestmark = pytest.mark.twins

SEND = {"type": "send", "id": "u-1", "text": "hi"}
START = {"type": "part", "part": {"type": "message-start", "messageId": "a-1"}}
TEXT = {"type": "part", "part": {"type": "text-delta", "messageId": "a-1", "text": "Hello"}}
FINISH = {"type": "part", "part": {"type": "finish"}}

#: JSON text as a provider sent it: spacing, key order and number spelling are its own.
ITEM = b'{"type": "message",  "role": "user", "content": [{"text": "hi", "n": 1.50}], "id": "m1"}'


def _events(store: Any, session: str) -> list[Any]:
    return list(store.history(session))


def test_native_data_is_stored_byte_for_byte_and_parsed_on_request(store: EventStore) -> None:
    store.append(
        "s", [SEND, START, TEXT, FINISH], native=[ITEM, ITEM.decode(), {"usage": {"in": 3}}, None]
    )
    evs = _events(store, "s")
    assert [e.native_bytes for e in evs] == [ITEM, ITEM, b'{"usage":{"in":3}}', None]
    assert evs[0].native == json.loads(ITEM) and evs[2].native == {"usage": {"in": 3}}
    assert evs[3].native is None
    # The reducer never sees it: the state is the one of the same actions without it.
    store.append("plain", [SEND, START, TEXT, FINISH])
    assert store.load("s").to_json() == store.load("plain").to_json()
    # --json of the history carries it only where present (older shapes unchanged).
    docs = [e.to_json() for e in evs]
    assert docs[0]["native"] == json.loads(ITEM) and "native" not in docs[3]
    assert store.verify("s").ok


def test_an_event_without_native_data_keeps_the_hash_it_always_had(store: EventStore) -> None:
    store.append("s", [SEND], native=None)
    store.append("s", [TEXT], native=[None])
    store.append("plain", [SEND])
    store.append("plain", [TEXT])
    assert store.verify().ok
    # The layout, pinned: nothing is appended for an event without native data, and the
    # native bytes follow the metadata, length-prefixed, for one that has some.
    head = b'[1,"s",1,null,"part",0,5,null]'
    payload = b'{"type":"stop"}'
    body = b"\x01" * 32 + len(head).to_bytes(4, "big") + head + len(payload).to_bytes(4, "big") + payload
    args: dict[str, Any] = dict(
        session_id="s", version=1, event_id=None, type="part", turn=0, payload=payload,
        recorded_at=5, actor=None, metadata=None,
    )
    assert chain_hash(b"\x01" * 32, **args) == hashlib.sha256(body + b"\xff" * 4).digest()
    assert chain_hash(b"\x01" * 32, **args, native=None) == chain_hash(b"\x01" * 32, **args)
    assert chain_hash(b"\x01" * 32, **args, native=b"[]") == hashlib.sha256(
        body + b"\xff" * 4 + b"\x00\x00\x00\x02[]"
    ).digest()


@pytest.mark.parametrize(
    "native, why",
    [
        ({"a": 1}, "a list"),
        (b"[]", "a list"),
        ([None, None], "entries for 1 actions"),
        ([b"{not json"], "not valid JSON"),
        (["\ud800"], "not valid JSON"),
        ([float("nan")], "native"),
        ([b"\xff"], "not valid JSON"),
        (["[" + "1," * 600_000 + "1]"], "max_event_bytes"),
    ],
)
def test_malformed_native_data_is_refused_before_anything_is_stored(
    store: EventStore, native: Any, why: str
) -> None:
    with pytest.raises(InvalidEvent, match=why) as info:
        store.append("s", [SEND], native=native)
    assert info.value.field == "native"
    assert store.sessions() == []


def test_an_idempotent_retry_compares_native_data(store: EventStore) -> None:
    first = store.append("s", [SEND, TEXT], event_ids=["e1", "e2"], native=[ITEM, None])
    again = store.append("s", [SEND, TEXT], event_ids=["e1", "e2"], native=[ITEM, None])
    assert again.replayed and again == first
    for other in ([ITEM + b" ", None], [None, None], [ITEM, b"1"]):
        with pytest.raises(EventIdConflict):
            store.append("s", [SEND, TEXT], event_ids=["e1", "e2"], native=other)
    assert store.head("s") == 2


def test_a_streaming_turn_writes_native_data_with_a_part(store: EventStore) -> None:
    with store.turn("s", SEND) as turn:
        turn.write(START["part"], native=b'{"raw": "start"}')
        turn.write(TEXT["part"])  # a delta, buffered with the next part's group commit
        turn.write(FINISH["part"], native={"usage": {"out": 7}})
        with pytest.raises(InvalidEvent):
            turn.write(TEXT["part"], native=b"nope")
    evs = _events(store, "s")
    assert [e.native_bytes for e in evs] == [None, b'{"raw": "start"}', None, b'{"usage":{"out":7}}']
    assert store.load("s").status == "idle"
    assert store.verify("s").ok


def test_the_feed_carries_native_data(store: EventStore, db_url: str) -> None:
    store.append("s", [SEND, TEXT], native=[ITEM, None])
    # Read by a sync store (the twins write; the feed's own twin tests are elsewhere).
    with SyncStore(db_url) as reader:
        got = [(e.session_id, e.version, e.native_bytes) for e in reader.feed(idle_timeout=0.2)]
    assert got == [("s", 1, ITEM), ("s", 2, None)]


def test_export_and_import_keep_native_data_byte_for_byte(
    store: EventStore, other_url: str
) -> None:
    store.append("s", [SEND, START], native=[ITEM, None])
    store.branch("s", at=1, new_id="s-alt")
    store.append("s-alt", [TEXT], native=['{"x" : [1, 2]}'])
    out = io.StringIO()
    store.export("s-alt", out)
    exported = out.getvalue()
    # The file is checked: native text changed in transit breaks the chain.
    forged = exported.replace('{\\"x\\" : [1, 2]}', '{\\"x\\" : [1, 3]}')
    assert forged != exported
    with make_store(other_url) as target:
        with pytest.raises(InvalidEvent, match="hash"):
            target.import_(io.StringIO(forged))
        assert target.sessions() == []
        target.import_(io.StringIO(exported))
        assert [(e.session_id, e.version, e.hash, e.native_bytes) for e in target.history("s-alt")] == [
            (e.session_id, e.version, e.hash, e.native_bytes) for e in store.history("s-alt")
        ]
        assert target.verify().ok


def test_the_triggers_refuse_changing_native_data(store: EventStore, raw_engine: Engine) -> None:
    store.append("s", [SEND, TEXT], native=[ITEM, None])
    for value in (b'{"forged":1}', None):
        with pytest.raises(DBAPIError, match="immutable"):
            with raw_engine.begin() as conn:
                conn.execute(
                    text("UPDATE events SET native = :v WHERE version = 1"), {"v": value}
                )
    assert _events(store, "s")[0].native_bytes == ITEM


@pytest.mark.parametrize(
    "version, value",
    [(1, ITEM.replace(b"hi", b"ho")), (1, None), (2, b'{"added":true}'), (2, b"{broken")],
)
def test_verify_catches_changed_native_bytes(
    store: EventStore, raw_engine: Engine, db_url: str, backend: str, version: int, value: bytes | None
) -> None:
    store.append("s", [SEND, TEXT, FINISH], native=[ITEM, None, None])
    store.append("bystander", [SEND], native=[ITEM])
    with _as_attacker(raw_engine, "sqlite" if backend == "sqlite" else "postgresql") as conn:
        n = conn.execute(
            text("UPDATE events SET native = :v WHERE session_pk = :pk AND version = :ver"),
            {"v": value, "pk": _pk(conn, "s"), "ver": version},
        ).rowcount
        assert n == 1
    report = store.verify("s")
    assert not report.ok
    kinds = {(p.version, p.kind) for p in report.problems}
    assert (version, "hash-mismatch") in kinds
    if value == b"{broken":
        assert (version, "bad-native") in kinds
    assert store.verify("bystander").ok
    r = CliRunner().invoke(app, ["--db", db_url, "verify", "s"])
    assert r.exit_code == 1


def test_erase_removes_native_data(store: EventStore, raw_engine: Engine) -> None:
    store.append("s", [SEND, TEXT], native=[ITEM, b'{"file":"f-1"}'])
    store.branch("s", at=1, new_id="s-b")
    store.append("s-b", [TEXT], native=[b'{"file":"f-2"}'])
    store.append("keep", [SEND], native=[b'{"kept":1}'])
    assert store.erase("s", reason="user request") == ["s", "s-b"]
    with raw_engine.connect() as conn:
        left = [bytes(r[0]) for r in conn.execute(text("SELECT native FROM events WHERE native IS NOT NULL"))]
    assert left == [b'{"kept":1}']
    assert store.verify().ok


def test_the_report_shows_native_data_escaped(store: EventStore) -> None:
    hostile = b'{"note": "<script>alert(1)</script>", "bidi": "\\u202e"}'
    store.append("s", [SEND, START, TEXT, FINISH], native=[None, hostile, None, None])
    page = store.report("s")
    assert "Provider-native data (1 event)" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page


def test_history_json_shows_native_data(store: EventStore, db_url: str) -> None:
    store.append("s", [SEND, TEXT], native=[ITEM, None])
    r = CliRunner().invoke(app, ["--db", db_url, "history", "s", "--json"])
    assert r.exit_code == 0, r.stderr
    docs = json.loads(r.stdout)
    assert docs[0]["native"] == json.loads(ITEM) and "native" not in docs[1]
