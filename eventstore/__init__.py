"""eventstore: AI chat sessions as an event-sourced log with time travel.

Every action of a chat session (``send``, a streamed ``part``, ``toolPhase``, ``stop``,
``retry``, ``reset``) is appended as an immutable, hash-chained event to PostgreSQL or
SQLite; the session's state is the fold of :func:`session_reducer` over its events.

>>> from eventstore import EventStore
>>> with EventStore("sqlite:///chat.db") as store:          # doctest: +SKIP
...     store.migrate()
...     _ = store.append("s1", [{"type": "send", "id": "u-1", "text": "Hi"}])
...     store.load("s1").status
'streaming'

The public API is exactly the names in ``__all__``; everything else is internal. Actions
can be given as wire-shaped dicts or built with the typed models (:class:`SendAction`,
:class:`PartAction` with a :class:`TextDeltaPart`, ...), which give editor completion and
are validated on construction. The wire format and the reducer's rules are described in
``docs/format.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eventstore.checkpoint import Checkpoint, generate_keypair, load_private_key, load_public_key
    from eventstore.diff import SessionDiff
    from eventstore.errors import (
        CheckpointError,
        CompactedError,
        ConcurrencyError,
        EventIdConflict,
        EventStoreError,
        InvalidEvent,
        InvalidState,
        SchemaError,
        SessionClosed,
        SessionErased,
        SessionExists,
        SessionNotFound,
        StorageError,
        TurnBusy,
        TurnStopped,
        VersionNotFound,
    )
    from eventstore.compaction import CompactResult
    from eventstore.ids import check_new_session_id, split_ref
    from eventstore.models import (
        Action,
        ErrorPart,
        FinishPart,
        MessageStartPart,
        PartAction,
        ReasoningDeltaPart,
        ResetAction,
        RetryAction,
        SendAction,
        SessionState,
        StepFinishPart,
        StopAction,
        StreamPart,
        TextDeltaPart,
        ToolCallPart,
        ToolErrorPart,
        ToolPhaseAction,
        ToolResultPart,
        parse_action,
        parse_action_json,
        parse_actions,
        parse_state,
    )
    from eventstore.chatapi import to_anthropic_messages, to_openai_messages
    from eventstore.feed import AsyncFollower, Follower
    from eventstore.records import AppendResult, Problem, RecordedEvent, Recovery, SessionInfo, VerifyReport
    from eventstore.reducer import (
        REDUCER_VERSION,
        fold,
        initial_state,
        is_cancelled,
        resumable,
        session_reducer,
    )
    from eventstore.astreaming import AsyncStreamingTurn
    from eventstore.asyncstore import AsyncEventStore
    from eventstore.storage.urls import mask_url
    from eventstore.store import EventStore
    from eventstore.streaming import StreamingTurn
    from eventstore.timetravel import ReplayStep
    from eventstore.transfer import ImportResult
    from eventstore.turns import ToolCall, Turn

#: Where each public name lives. The package loads a module on first use of one of its
#: names (PEP 562), so that ``import eventstore`` and a command that needs only the SQLite
#: store do not pay for SQLAlchemy's asyncio layer, the PostgreSQL driver or the
#: cryptography used by checkpoints.
_EXPORTS: dict[str, str] = {
    "Checkpoint": "eventstore.checkpoint",
    "generate_keypair": "eventstore.checkpoint",
    "load_private_key": "eventstore.checkpoint",
    "load_public_key": "eventstore.checkpoint",
    "SessionDiff": "eventstore.diff",
    "CheckpointError": "eventstore.errors",
    "CompactedError": "eventstore.errors",
    "ConcurrencyError": "eventstore.errors",
    "EventIdConflict": "eventstore.errors",
    "EventStoreError": "eventstore.errors",
    "InvalidEvent": "eventstore.errors",
    "InvalidState": "eventstore.errors",
    "SchemaError": "eventstore.errors",
    "SessionClosed": "eventstore.errors",
    "SessionErased": "eventstore.errors",
    "SessionExists": "eventstore.errors",
    "SessionNotFound": "eventstore.errors",
    "StorageError": "eventstore.errors",
    "TurnBusy": "eventstore.errors",
    "TurnStopped": "eventstore.errors",
    "VersionNotFound": "eventstore.errors",
    "CompactResult": "eventstore.compaction",
    "check_new_session_id": "eventstore.ids",
    "split_ref": "eventstore.ids",
    "Action": "eventstore.models",
    "ErrorPart": "eventstore.models",
    "FinishPart": "eventstore.models",
    "MessageStartPart": "eventstore.models",
    "PartAction": "eventstore.models",
    "ReasoningDeltaPart": "eventstore.models",
    "ResetAction": "eventstore.models",
    "RetryAction": "eventstore.models",
    "SendAction": "eventstore.models",
    "SessionState": "eventstore.models",
    "StepFinishPart": "eventstore.models",
    "StopAction": "eventstore.models",
    "StreamPart": "eventstore.models",
    "TextDeltaPart": "eventstore.models",
    "ToolCallPart": "eventstore.models",
    "ToolErrorPart": "eventstore.models",
    "ToolPhaseAction": "eventstore.models",
    "ToolResultPart": "eventstore.models",
    "parse_action": "eventstore.models",
    "parse_action_json": "eventstore.models",
    "parse_actions": "eventstore.models",
    "parse_state": "eventstore.models",
    "to_anthropic_messages": "eventstore.chatapi",
    "to_openai_messages": "eventstore.chatapi",
    "AsyncFollower": "eventstore.feed",
    "Follower": "eventstore.feed",
    "AppendResult": "eventstore.records",
    "Problem": "eventstore.records",
    "RecordedEvent": "eventstore.records",
    "Recovery": "eventstore.records",
    "SessionInfo": "eventstore.records",
    "VerifyReport": "eventstore.records",
    "REDUCER_VERSION": "eventstore.reducer",
    "fold": "eventstore.reducer",
    "initial_state": "eventstore.reducer",
    "is_cancelled": "eventstore.reducer",
    "resumable": "eventstore.reducer",
    "session_reducer": "eventstore.reducer",
    "AsyncStreamingTurn": "eventstore.astreaming",
    "AsyncEventStore": "eventstore.asyncstore",
    "mask_url": "eventstore.storage.urls",
    "EventStore": "eventstore.store",
    "StreamingTurn": "eventstore.streaming",
    "ReplayStep": "eventstore.timetravel",
    "ImportResult": "eventstore.transfer",
    "ToolCall": "eventstore.turns",
    "Turn": "eventstore.turns",
}

__version__ = "0.1.0"

__all__ = [
    # the store
    "EventStore",
    "AsyncEventStore",
    "AppendResult",
    "RecordedEvent",
    "Follower",
    "AsyncFollower",
    "SessionInfo",
    "VerifyReport",
    "Problem",
    "SessionDiff",
    "CompactResult",
    "ImportResult",
    "ReplayStep",
    "Turn",
    "ToolCall",
    # streaming turns
    "StreamingTurn",
    "AsyncStreamingTurn",
    "Recovery",
    "to_openai_messages",
    "to_anthropic_messages",
    # the audit trail
    "Checkpoint",
    "generate_keypair",
    "load_private_key",
    "load_public_key",
    # the pure core
    "session_reducer",
    "fold",
    "resumable",
    "is_cancelled",
    "initial_state",
    "parse_action",
    "parse_actions",
    "parse_action_json",
    "parse_state",
    "SessionState",
    # typed actions and stream parts (what append accepts besides wire dicts)
    "Action",
    "SendAction",
    "PartAction",
    "ToolPhaseAction",
    "StopAction",
    "RetryAction",
    "ResetAction",
    "StreamPart",
    "MessageStartPart",
    "TextDeltaPart",
    "ReasoningDeltaPart",
    "ToolCallPart",
    "ToolResultPart",
    "ToolErrorPart",
    "StepFinishPart",
    "FinishPart",
    "ErrorPart",
    "REDUCER_VERSION",
    # errors
    "EventStoreError",
    "InvalidEvent",
    "EventIdConflict",
    "InvalidState",
    "ConcurrencyError",
    "SessionNotFound",
    "SessionExists",
    "VersionNotFound",
    "CompactedError",
    "SessionErased",
    "SessionClosed",
    "TurnStopped",
    "TurnBusy",
    "CheckpointError",
    "SchemaError",
    "StorageError",
    # ids and database URLs as people type them
    "split_ref",
    "check_new_session_id",
    "mask_url",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'eventstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
