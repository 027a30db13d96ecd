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
