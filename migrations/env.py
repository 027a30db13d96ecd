"""Alembic environment for eventstore: always run from code with a connection passed in.

``eventstore.storage.migrate.upgrade(conn)`` puts the connection in
``config.attributes["connection"]``; there is no alembic.ini and no URL here.
"""

from __future__ import annotations

from alembic import context

from eventstore.storage.schema import VERSION_TABLE, metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "eventstore migrations run from code: use `eventstore migrate` or EventStore.migrate()"
    )

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER most things in place; batch mode recreates tables instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
# The caller owns the transaction (EventStore.migrate opens it and takes the lock).
context.run_migrations()
