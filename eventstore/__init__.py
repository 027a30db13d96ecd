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

#: Every public name, grouped as the docs present them, with the module that defines it.
#: The package loads a module on first use of one of its names (PEP 562), so that
#: ``import eventstore`` and a command that needs only the SQLite store do not pay for
#: SQLAlchemy's asyncio layer, the PostgreSQL driver or the cryptography of checkpoints.
_PUBLIC: dict[str, dict[str, str]] = {
    "the store": {
        "EventStore": "eventstore.store",
        "AsyncEventStore": "eventstore.async_store",
        "SealPolicy": "eventstore.engine.sealer",
        "AppendResult": "eventstore.core.records",
        "RecordedEvent": "eventstore.core.records",
        "Follower": "eventstore.core.feed_rules",
        "AsyncFollower": "eventstore.core.feed_rules",
        "SessionInfo": "eventstore.core.records",
        "SessionPage": "eventstore.core.catalogue",
        "InfoChange": "eventstore.core.records",
        "interleave_info": "eventstore.core.catalogue",
        "VerifyReport": "eventstore.core.records",
        "Problem": "eventstore.core.records",
        "SessionDiff": "eventstore.core.diff",
        "CompactResult": "eventstore.features.compaction",
        "ImportResult": "eventstore.features.importing",
        "ReplayStep": "eventstore.features.timetravel",
        "Turn": "eventstore.core.turn_view",
        "ToolCall": "eventstore.core.turn_view",
    },
    "streaming turns": {
        "StreamingTurn": "eventstore.engine.turns",
        "AsyncStreamingTurn": "eventstore.engine.async_turns",
        "Recovery": "eventstore.core.records",
        "RecoveryStatus": "eventstore.core.turn_rules",
        "to_openai_messages": "eventstore.core.chat_messages",
        "to_anthropic_messages": "eventstore.core.chat_messages",
    },
    "the audit trail": {
        "Checkpoint": "eventstore.core.checkpoints",
        "generate_keypair": "eventstore.core.checkpoints",
        "load_private_key": "eventstore.core.checkpoints",
        "load_public_key": "eventstore.core.checkpoints",
    },
    "the pure core": {
        "session_reducer": "eventstore.core.reducer",
        "apply_action": "eventstore.core.reducer",
        "fold": "eventstore.core.reducer",
        "resumable": "eventstore.core.reducer",
        "is_cancelled": "eventstore.core.reducer",
        "initial_state": "eventstore.core.reducer",
        "parse_action": "eventstore.core.models",
        "parse_actions": "eventstore.core.models",
        "parse_action_json": "eventstore.core.models",
        "check_json_text": "eventstore.core.json_limits",
        "visible": "eventstore.core.text",
        "one_line": "eventstore.core.text",
        "visible_json": "eventstore.core.text",
        "UNSAFE": "eventstore.core.text",
        "MAX_JSON_DEPTH": "eventstore.core.json_limits",
        "parse_state": "eventstore.core.models",
        "SessionState": "eventstore.core.models",
    },
    "typed actions and stream parts (what append accepts besides wire dicts)": {
        "Action": "eventstore.core.models",
        "SendAction": "eventstore.core.models",
        "PartAction": "eventstore.core.models",
        "ToolPhaseAction": "eventstore.core.models",
        "StopAction": "eventstore.core.models",
        "RetryAction": "eventstore.core.models",
        "ResetAction": "eventstore.core.models",
        "StreamPart": "eventstore.core.models",
        "MessageStartPart": "eventstore.core.models",
        "TextDeltaPart": "eventstore.core.models",
        "ReasoningDeltaPart": "eventstore.core.models",
        "ToolCallPart": "eventstore.core.models",
        "ToolResultPart": "eventstore.core.models",
        "ToolErrorPart": "eventstore.core.models",
        "StepFinishPart": "eventstore.core.models",
        "FinishPart": "eventstore.core.models",
        "ErrorPart": "eventstore.core.models",
        "REDUCER_VERSION": "eventstore.core.reducer",
    },
    "errors": {
        "EventStoreError": "eventstore.errors",
        "InvalidEvent": "eventstore.errors",
        "EventIdConflict": "eventstore.errors",
        "InvalidState": "eventstore.errors",
        "ConcurrencyError": "eventstore.errors",
        "SessionNotFound": "eventstore.errors",
        "SessionExists": "eventstore.errors",
        "VersionNotFound": "eventstore.errors",
        "CompactedError": "eventstore.errors",
        "SessionErased": "eventstore.errors",
        "SessionClosed": "eventstore.errors",
        "TurnStopped": "eventstore.errors",
        "TurnBusy": "eventstore.errors",
        "SessionRewound": "eventstore.errors",
        "CheckpointError": "eventstore.errors",
        "SchemaError": "eventstore.errors",
        "StorageError": "eventstore.errors",
        "ReplicaMismatch": "eventstore.storage.replicas",
    },
    "the explorer (the ui extra)": {
        "serve_explorer": "eventstore.explorer",
    },
    "ids and database URLs as people type them": {
        "split_ref": "eventstore.core.ids",
        "check_new_session_id": "eventstore.core.ids",
        "mask_url": "eventstore.storage.urls",
    },
}

_EXPORTS: dict[str, str] = {
    name: module for group in _PUBLIC.values() for name, module in group.items()
}

__version__ = "0.1.0"

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # static checkers cannot follow the table: they read these imports
    from eventstore.async_store import (
        AsyncEventStore as AsyncEventStore,
    )
    from eventstore.core.chat_messages import (
        to_anthropic_messages as to_anthropic_messages,
    )
    from eventstore.core.chat_messages import (
        to_openai_messages as to_openai_messages,
    )
    from eventstore.core.checkpoints import (
        Checkpoint as Checkpoint,
    )
    from eventstore.core.checkpoints import (
        generate_keypair as generate_keypair,
    )
    from eventstore.core.checkpoints import (
        load_private_key as load_private_key,
    )
    from eventstore.core.checkpoints import (
        load_public_key as load_public_key,
    )
    from eventstore.core.diff import (
        SessionDiff as SessionDiff,
    )
    from eventstore.core.feed_rules import (
        AsyncFollower as AsyncFollower,
    )
    from eventstore.core.feed_rules import (
        Follower as Follower,
    )
    from eventstore.core.ids import (
        check_new_session_id as check_new_session_id,
    )
    from eventstore.explorer import (
        serve_explorer as serve_explorer,
    )
    from eventstore.core.ids import (
        split_ref as split_ref,
    )
    from eventstore.core.models import (
        Action as Action,
    )
    from eventstore.core.models import (
        ErrorPart as ErrorPart,
    )
    from eventstore.core.models import (
        FinishPart as FinishPart,
    )
    from eventstore.core.models import (
        MessageStartPart as MessageStartPart,
    )
    from eventstore.core.models import (
        PartAction as PartAction,
    )
    from eventstore.core.models import (
        ReasoningDeltaPart as ReasoningDeltaPart,
    )
    from eventstore.core.models import (
        ResetAction as ResetAction,
    )
    from eventstore.core.models import (
        RetryAction as RetryAction,
    )
    from eventstore.core.models import (
        SendAction as SendAction,
    )
    from eventstore.core.models import (
        SessionState as SessionState,
    )
    from eventstore.core.models import (
        StepFinishPart as StepFinishPart,
    )
    from eventstore.core.models import (
        StopAction as StopAction,
    )
    from eventstore.core.models import (
        StreamPart as StreamPart,
    )
    from eventstore.core.models import (
        TextDeltaPart as TextDeltaPart,
    )
    from eventstore.core.models import (
        ToolCallPart as ToolCallPart,
    )
    from eventstore.core.models import (
        ToolErrorPart as ToolErrorPart,
    )
    from eventstore.core.models import (
        ToolPhaseAction as ToolPhaseAction,
    )
    from eventstore.core.models import (
        ToolResultPart as ToolResultPart,
    )
    from eventstore.core.json_limits import (
        MAX_JSON_DEPTH as MAX_JSON_DEPTH,
    )
    from eventstore.core.json_limits import (
        check_json_text as check_json_text,
    )
    from eventstore.core.text import (
        UNSAFE as UNSAFE,
    )
    from eventstore.core.text import (
        visible as visible,
    )
    from eventstore.core.text import (
        one_line as one_line,
    )
    from eventstore.core.text import (
        visible_json as visible_json,
    )
    from eventstore.core.models import (
        parse_action as parse_action,
    )
    from eventstore.core.models import (
        parse_action_json as parse_action_json,
    )
    from eventstore.core.models import (
        parse_actions as parse_actions,
    )
    from eventstore.core.models import (
        parse_state as parse_state,
    )
    from eventstore.core.records import (
        AppendResult as AppendResult,
    )
    from eventstore.core.records import (
        Problem as Problem,
    )
    from eventstore.core.records import (
        RecordedEvent as RecordedEvent,
    )
    from eventstore.core.records import (
        Recovery as Recovery,
    )
    from eventstore.core.turn_rules import (
        RecoveryStatus as RecoveryStatus,
    )
    from eventstore.core.records import (
        SessionInfo as SessionInfo,
    )
    from eventstore.core.records import (
        InfoChange as InfoChange,
    )
    from eventstore.core.catalogue import (
        interleave_info as interleave_info,
    )
    from eventstore.core.catalogue import (
        SessionPage as SessionPage,
    )
    from eventstore.core.records import (
        VerifyReport as VerifyReport,
    )
    from eventstore.core.reducer import (
        REDUCER_VERSION as REDUCER_VERSION,
    )
    from eventstore.core.reducer import (
        fold as fold,
    )
    from eventstore.core.reducer import (
        initial_state as initial_state,
    )
    from eventstore.core.reducer import (
        is_cancelled as is_cancelled,
    )
    from eventstore.core.reducer import (
        resumable as resumable,
    )
    from eventstore.core.reducer import (
        session_reducer as session_reducer,
    )
    from eventstore.core.reducer import (
        apply_action as apply_action,
    )
    from eventstore.core.turn_view import (
        ToolCall as ToolCall,
    )
    from eventstore.core.turn_view import (
        Turn as Turn,
    )
    from eventstore.engine.async_turns import (
        AsyncStreamingTurn as AsyncStreamingTurn,
    )
    from eventstore.engine.turns import (
        StreamingTurn as StreamingTurn,
    )
    from eventstore.errors import (
        CheckpointError as CheckpointError,
    )
    from eventstore.errors import (
        CompactedError as CompactedError,
    )
    from eventstore.errors import (
        ConcurrencyError as ConcurrencyError,
    )
    from eventstore.errors import (
        EventIdConflict as EventIdConflict,
    )
    from eventstore.errors import (
        EventStoreError as EventStoreError,
    )
    from eventstore.errors import (
        InvalidEvent as InvalidEvent,
    )
    from eventstore.errors import (
        InvalidState as InvalidState,
    )
    from eventstore.errors import (
        SchemaError as SchemaError,
    )
    from eventstore.errors import (
        SessionClosed as SessionClosed,
    )
    from eventstore.errors import (
        SessionErased as SessionErased,
    )
    from eventstore.errors import (
        SessionExists as SessionExists,
    )
    from eventstore.errors import (
        SessionNotFound as SessionNotFound,
    )
    from eventstore.errors import (
        StorageError as StorageError,
    )
    from eventstore.errors import (
        TurnBusy as TurnBusy,
    )
    from eventstore.errors import (
        SessionRewound as SessionRewound,
    )
    from eventstore.errors import (
        TurnStopped as TurnStopped,
    )
    from eventstore.errors import (
        VersionNotFound as VersionNotFound,
    )
    from eventstore.features.compaction import (
        CompactResult as CompactResult,
    )
    from eventstore.features.timetravel import (
        ReplayStep as ReplayStep,
    )
    from eventstore.engine.sealer import (
        SealPolicy as SealPolicy,
    )
    from eventstore.features.importing import (
        ImportResult as ImportResult,
    )
    from eventstore.storage.replicas import (
        ReplicaMismatch as ReplicaMismatch,
    )
    from eventstore.storage.urls import (
        mask_url as mask_url,
    )
    from eventstore.store import (
        EventStore as EventStore,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'eventstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
