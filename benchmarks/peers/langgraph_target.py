"""LangGraph persistence: the ``PostgresSaver`` checkpointer and the beta ``DeltaChannel``.

``SaverTarget`` uses the checkpointer directly, the cheapest way to use it: each durable
write is one ``PostgresSaver.put`` of a checkpoint whose single channel ``session`` holds
the folded session state (computed with eventstore's reducer *outside* the timed call, as
a graph would already hold it in memory). ``every="event"`` puts one checkpoint per event,
``every="turn"`` one per turn. Loading is ``get_tuple`` (head, or a remembered checkpoint
id for an old version), history is ``list``. The connection is the one
``PostgresSaver.from_conn_string`` opens (autocommit, each ``put`` pipelined).

``DeltaChannelTarget`` is how LangGraph itself proposes to store a growing log without
rewriting it: a one-node ``StateGraph`` whose state field is
``Annotated[dict, DeltaChannel(reducer)]``. Each durable write is one ``graph.invoke`` with
the new actions as the channel update (``durability="sync"``); the channel stores the
writes and a full snapshot every ``snapshot_frequency`` updates, and ``get_state`` rebuilds
the value by replaying writes through the reducer (eventstore's ``fold_json``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver

from benchmarks.peers.base import (
    Action,
    State,
    Unsupported,
    db_name,
    fresh_database,
    pg_size,
    pg_url,
)
from eventstore.core.reducer import fold_json

try:  # beta API; absent before langgraph 1.2
    from langgraph.channels.delta import DeltaChannel
except ImportError:  # pragma: no cover - depends on the installed version
    DeltaChannel = None  # type: ignore[assignment,misc]


def _config(session: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": session, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


class _SaverDatabase:
    """A PostgresSaver on a database of its own: what both LangGraph targets open and close."""

    key: str
    _cm: Any
    saver: PostgresSaver | None
    db: str

    def _open_saver(self, tag: str, create: bool) -> PostgresSaver:
        self.db = db_name(self.key, tag)
        if create:
            fresh_database(self.db)
        self._cm = PostgresSaver.from_conn_string(pg_url(self.db))
        saver: PostgresSaver = self._cm.__enter__()
        self.saver = saver
        if create:
            saver.setup()
        return saver

    def size_bytes(self) -> int:
        return pg_size(self.db)

    def close(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
            self._cm = None
            self.saver = None


class SaverTarget(_SaverDatabase):
    def __init__(self, every: str) -> None:
        assert every in ("event", "turn")
        self.every = every
        self.key = f"lg-{every}"
        self.label = f"LangGraph PostgresSaver (checkpoint per {every})"
        self.per_event = every == "event"
        self.per_turn = every == "turn"
        self.note = (
            f"PostgresSaver.put of the folded state once per {every}; state folded outside "
            "the timed call; old versions by a remembered checkpoint id"
        )
        self._cm: Any = None
        self.saver: PostgresSaver | None = None
        self.db = ""
        self.state: dict[str, State] = {}
        self.version: dict[str, int] = {}
        self.chan_version: dict[str, str | None] = {}
        self.parent: dict[str, str | None] = {}
        self.ids: dict[str, dict[int, str]] = {}

    def open(self, tag: str, *, create: bool = True) -> None:
        self._open_saver(tag, create)
        self.state, self.version, self.chan_version, self.parent, self.ids = {}, {}, {}, {}, {}

    def prepare(self, session: str, actions: Sequence[Action]) -> list[tuple[int, State]]:
        """Fold the new actions (untimed): the states to checkpoint, with their versions."""
        state = self.state.get(session)
        version = self.version.get(session, 0)
        out: list[tuple[int, State]] = []
        if self.every == "event":
            for a in actions:
                state = fold_json(state, [a])
                version += 1
                out.append((version, state))
        else:
            state = fold_json(state, actions)
            version += len(actions)
            out.append((version, state))
        assert state is not None
        self.state[session] = state
        self.version[session] = version
        return out

    def append_prepared(self, session: str, states: list[tuple[int, State]]) -> None:
        saver = self.saver
        assert saver is not None
        ids = self.ids.setdefault(session, {})
        for version, state in states:
            ck = empty_checkpoint()
            cv = saver.get_next_version(self.chan_version.get(session), None)
            ck["channel_values"] = {"session": state}
            ck["channel_versions"] = {"session": cv}
            saved = saver.put(
                _config(session, self.parent.get(session)),
                ck,
                {"source": "loop", "step": version, "parents": {}},
                {"session": cv},
            )
            self.chan_version[session] = cv
            self.parent[session] = saved["configurable"]["checkpoint_id"]
            ids[version] = saved["configurable"]["checkpoint_id"]

    def append(self, session: str, actions: Sequence[Action]) -> None:
        self.append_prepared(session, self.prepare(session, actions))

    def load(self, session: str, version: int | None = None) -> State:
        assert self.saver is not None
        if version is None:
            tup = self.saver.get_tuple(_config(session))
        else:
            cid = self.ids.get(session, {}).get(version)
            if cid is None:
                raise Unsupported(f"no checkpoint at version {version}")
            tup = self.saver.get_tuple(_config(session, cid))
        if tup is None:
            raise Unsupported("no checkpoint")
        return tup.checkpoint["channel_values"]["session"]  # type: ignore[no-any-return]

    def history(self, session: str) -> Iterator[Any]:
        assert self.saver is not None
        return iter(self.saver.list(_config(session)))

    def mark(self, session: str, version: int) -> None:
        pass  # ids are recorded by every put


def _delta_reducer(state: dict[str, Any], writes: Sequence[Sequence[Action]]) -> dict[str, Any]:
    # Batching-invariant, as DeltaChannel requires: folding two batches one after the
    # other equals folding their concatenation. `{}` is the channel's empty value.
    actions = [a for batch in writes for a in batch]
    return fold_json(state or None, actions)


class DeltaChannelTarget(_SaverDatabase):
    per_event = True
    per_turn = True

    def __init__(self, snapshot_frequency: int = 100) -> None:
        if DeltaChannel is None:
            raise ImportError("langgraph.channels.delta.DeltaChannel is not available")
        from langgraph.graph import END, START, StateGraph

        self.key = "lg-delta"
        self.label = "LangGraph DeltaChannel (beta)"
        self.note = (
            f"one-node StateGraph, state Annotated[dict, DeltaChannel(fold, "
            f"snapshot_frequency={snapshot_frequency})], one invoke per write "
            "(durability='sync'), load = graph.get_state"
        )

        # Functional form: the annotation must be a live object, not a postponed string.
        channel = DeltaChannel(_delta_reducer, snapshot_frequency=snapshot_frequency)
        ChatState = TypedDict("ChatState", {"session": Annotated[dict, channel]})  # type: ignore[misc]

        graph = StateGraph(ChatState)
        graph.add_node("record", lambda s: {})
        graph.add_edge(START, "record")
        graph.add_edge("record", END)
        self._graph = graph
        self._cm: Any = None
        self.saver: PostgresSaver | None = None
        self.app: Any = None
        self.db = ""
        self.ids: dict[str, dict[int, str]] = {}

    def open(self, tag: str, *, create: bool = True) -> None:
        self.app = self._graph.compile(checkpointer=self._open_saver(tag, create))
        self.ids = {}

    def append(self, session: str, actions: Sequence[Action]) -> None:
        self.app.invoke({"session": list(actions)}, _config(session), durability="sync")

    def mark(self, session: str, version: int) -> None:
        assert self.saver is not None
        tup = self.saver.get_tuple(_config(session))
        assert tup is not None
        self.ids.setdefault(session, {})[version] = tup.config["configurable"]["checkpoint_id"]

    def load(self, session: str, version: int | None = None) -> State:
        if version is None:
            snap = self.app.get_state(_config(session))
        else:
            cid = self.ids.get(session, {}).get(version)
            if cid is None:
                raise Unsupported(f"no checkpoint id remembered for version {version}")
            snap = self.app.get_state(_config(session, cid))
        return snap.values["session"]  # type: ignore[no-any-return]

    def history(self, session: str) -> Iterator[Any]:
        return iter(self.app.get_state_history(_config(session)))
