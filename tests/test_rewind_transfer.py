"""Export and import of a session with rewinds: its kept lines come back as they were (both
backends, both twins)."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import make_store
from eventstore import EventStore, InvalidEvent, SessionClosed, SessionExists

pytestmark = [pytest.mark.twins, pytest.mark.usefixtures("twin")]


def send(i: int | str, text: str = "x") -> dict[str, Any]:
    return {"type": "send", "id": f"u-{i}", "text": text}


STOP = {"type": "stop"}


def _edited(store: EventStore) -> None:
    """s1 edited twice and undone to empty, with a title, a branch made before the rewinds
    (its parent row is now a kept line) and a second session."""
    store.append("s1", [send(1, "first"), STOP, send(2, "second"), STOP], actor="user:ada")
    store.set_info("s1", title="Mugs", owner="user:ada", metadata={"tenant": "acme"}, actor="user:ada")
    store.branch("s1", at=2, new_id="x")
    store.rewind("s1", to=2, actor="user:ada", reason="edit")
    store.append("s1", [send(3, "second, edited")])
    store.rewind("s1", to=1, reason="regenerate")
    store.rewind("s1", to=0, reason="undo")
    store.append("s1", [send(4, "start over"), STOP])
    store.set_info("s1", title="Start over")
    store.append("other", [send(1)])


def _picture(store: EventStore, session: str) -> dict[str, Any]:
    """Everything a reader sees of a session and its kept lines."""
    lines = store.lines(session)
    return {
        "lines": [line.to_json() for line in lines],
        "histories": {
            s: [e.to_json() for e in store.history(s)] for s in [session, *(line.id for line in lines)]
        },
        "info": store.info(session).to_json(),
        "info_changes": [c.to_json() for c in store.info_changes(session)],
        "state": store.load(session).to_json(),
    }


def _copy(src: EventStore, session: str, dst: EventStore) -> list[Any]:
    buf = io.StringIO()
    src.export(session, buf)
    return dst.import_(io.StringIO(buf.getvalue()))


@pytest.fixture
def second(backend: str, tmp_path: Path, twin: str) -> Iterator[Callable[[], Any]]:
    """Opens further empty, migrated stores of the same backend and twin (import targets)."""
    opened: list[Any] = []
    schemas: list[str] = []

    def open_one() -> Any:
        n = len(opened)
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / f'copy{n}.db'}"
        else:
            import psycopg

            from conftest import pg_admin_url

            admin = pg_admin_url()
            schema = f"t_{uuid.uuid4().hex[:16]}"
            with psycopg.connect(admin.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as c:
                c.execute(f'CREATE SCHEMA "{schema}"')
            schemas.append(schema)
            url = f"{admin}{'&' if '?' in admin else '?'}options=-csearch_path%3D{schema}"
        if twin == "async":
            from twins import make_async_store

            st = make_async_store(url)
        else:
            st = make_store(url)
        opened.append(st)
        return st

    yield open_one
    for st in opened:
        st.close()
    if schemas:
        import psycopg

        from conftest import pg_admin_url

        with psycopg.connect(pg_admin_url().replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as c:
            for schema in schemas:
                c.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_export_and_import_round_trip_the_kept_lines(store: EventStore, second: Callable[[], Any]) -> None:
    _edited(store)
    before = _picture(store, "s1")
    assert [line["id"] for line in before["lines"]] == ["s1~1", "s1~2", "s1~3"]
    there = second()
    results = _copy(store, "s1", there)
    assert [(r.session, r.status) for r in results] == [
        ("s1~1", "created"), ("s1~2", "created"), ("s1~3", "created"), ("s1", "created"),
    ]
    assert _picture(there, "s1") == before
    # Every session the file carried reads as it does here, parents and fork points too.
    mine = {s.id: s.to_json() for s in store.sessions() if s.id not in ("other", "x")}
    assert {s.id: s.to_json() for s in there.sessions()} == mine
    report = there.verify()
    assert report.ok, report.problems
    assert [n.kind for n in report.notices] == ["rewound"] * 3
    # A kept line still takes no events; the session does.
    with pytest.raises(SessionClosed):
        there.append("s1~1", [STOP])
    there.append("s1", [send(5)])
    # The same file again: nothing to do.
    assert {r.status for r in _copy(store, "s1", there)} == {"present"}


def test_exporting_a_kept_line_or_an_old_branch_carries_the_whole_conversation(
    store: EventStore, second: Callable[[], Any]
) -> None:
    _edited(store)
    before = _picture(store, "s1")
    for start in ("s1~2", "x"):
        there = second()
        _copy(store, start, there)
        assert _picture(there, "s1") == before
        assert [e.to_json() for e in there.history(start)] == [e.to_json() for e in store.history(start)]
        assert there.verify().ok


def test_a_compacted_kept_line_round_trips(store: EventStore, second: Callable[[], Any]) -> None:
    store.append("s1", [send(i) for i in range(10)])
    store.rewind("s1", to=6)
    store.append("s1", [send(20), send(21)])
    store.compact("s1~1", upto=9)
    store.compact("s1", upto=7)
    before = _picture(store, "s1")
    there = second()
    _copy(store, "s1", there)
    assert _picture(there, "s1") == before
    assert there.load("s1~1", version=9).to_json() == store.load("s1~1", version=9).to_json()
    assert there.verify().ok


def test_a_file_whose_rewinds_were_edited_is_refused(store: EventStore, second: Callable[[], Any]) -> None:
    _edited(store)
    buf = io.StringIO()
    store.export("s1", buf)
    lines = buf.getvalue().splitlines()
    header = json.loads(lines[0])

    def edited(change: Any) -> str:
        doc = json.loads(json.dumps(header))
        change(doc)
        return "\n".join([json.dumps(doc), *lines[1:]]) + "\n"

    def drop_rewinds(d: Any) -> None:
        d["rewinds"] = []

    def move_the_fork(d: Any) -> None:
        d["rewinds"][0]["to_version"] = 1

    def rename_the_session(d: Any) -> None:
        d["rewinds"][0]["session"] = "s2"

    there = second()
    for change in (drop_rewinds, move_the_fork, rename_the_session):
        with pytest.raises(InvalidEvent):
            there.import_(io.StringIO(edited(change)))
        assert there.sessions() == []
    # A session of the file that exists here with another history is a conflict.
    there.append("s1", [send(9, "mine")])
    with pytest.raises(SessionExists):
        there.import_(io.StringIO(buf.getvalue()))
    assert [s.id for s in there.sessions()] == ["s1"]
