"""The engine: the one place that joins the core to storage.

:class:`~eventstore.engine.engine.Engine` validates, reads and writes through the storage
interface and applies the core's rules; group commit, streaming turns and the asyncio
bridge are built on it. Features and both public stores go through it; nothing here knows
the CLI or the facades.
"""
