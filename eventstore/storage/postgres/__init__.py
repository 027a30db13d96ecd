"""Storage on PostgreSQL via psycopg 3, one module per concern (the only package that imports psycopg).

Row locks per session, upserts, plpgsql immutability triggers; appends and loads in one
round trip each, in autocommit on a connection of the engine's pool.
"""

from eventstore.storage.postgres.partitions import MAX_PARTITIONS, PARTITION_SETTING
from eventstore.storage.postgres.statements import feed_channel, feed_xact
from eventstore.storage.postgres.storage import PostgresStorage

__all__ = ["PostgresStorage", "feed_xact", "feed_channel", "PARTITION_SETTING", "MAX_PARTITIONS"]
