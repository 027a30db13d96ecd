"""The SQL storage both backends share (SQLAlchemy Core), one module per concern.

The dialect modules (``eventstore.storage.sqlite``, ``eventstore.storage.postgres``)
override only what differs: how a write transaction begins, row locking, "insert unless
present" / upsert, and how a driver error is classified.
"""

from eventstore.storage.sql.fair_pool import FairAsyncQueuePool
from eventstore.storage.sql.statements import Compiled, compiled, session_row
from eventstore.storage.sql.storage import SqlStorage
from eventstore.storage.sql.transactions import ErrorKind

__all__ = ["Compiled", "compiled", "ErrorKind", "FairAsyncQueuePool", "SqlStorage", "session_row"]
