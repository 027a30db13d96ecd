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

The public API is exactly the names in ``__all__``; everything else is internal.
"""

from __future__ import annotations

from eventstore import samples
from eventstore.diff import SessionDiff
from eventstore.errors import (
    CompactedError,
    ConcurrencyError,
    EventIdConflict,
    EventStoreError,
    InvalidEvent,
    InvalidState,
    SchemaError,
    SessionExists,
    SessionNotFound,
    StorageError,
    VersionNotFound,
)
from eventstore.ids import check_new_session_id, split_ref
from eventstore.models import (
    Action,
    SessionState,
    parse_action,
    parse_action_json,
    parse_actions,
    parse_state,
)
from eventstore.records import AppendResult, RecordedEvent, SessionInfo, VerifyReport
from eventstore.reducer import (
    REDUCER_VERSION,
    fold,
    initial_state,
    is_cancelled,
    resumable,
    session_reducer,
)
from eventstore.storage.urls import mask_url
from eventstore.store import EventStore
from eventstore.timetravel import CompactResult, ImportResult, ReplayStep
from eventstore.turns import ToolCall, Turn

__version__ = "0.1.0"

__all__ = [
    # the store
    "EventStore",
    "AppendResult",
    "RecordedEvent",
    "SessionInfo",
    "VerifyReport",
    "SessionDiff",
    "CompactResult",
    "ImportResult",
    "ReplayStep",
    "Turn",
    "ToolCall",
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
    "Action",
    "SessionState",
    "REDUCER_VERSION",
    # sample sessions (demo, benchmarks, tests)
    "samples",
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
    "SchemaError",
    "StorageError",
    # ids and database URLs as people type them
    "split_ref",
    "check_new_session_id",
    "mask_url",
]
