"""SqlStorage: the SQL storage both backends share, assembled from its concerns."""

from __future__ import annotations

from eventstore.storage.sql.appends import SessionWrites
from eventstore.storage.sql.compaction import Compaction
from eventstore.storage.sql.feed import Feed
from eventstore.storage.sql.reads import EventReads
from eventstore.storage.sql.rewinds import Rewinds
from eventstore.storage.sql.snapshots import Snapshots

__all__ = ["SqlStorage"]


class SqlStorage(SessionWrites, EventReads, Snapshots, Feed, Compaction, Rewinds):
    """Storage on a SQLAlchemy engine; subclasses supply the dialect-specific parts.

    Each concern is a module of this package: appends (sessions and head moves), reads
    (events, merged with sealed segments), snapshots (and loads), feed, compaction
    (and erasure), rewinds; their shared transactions and error mapper are in
    ``transactions``, their statements in ``statements``.
    """
