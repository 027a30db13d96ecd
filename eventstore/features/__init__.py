"""Capabilities built on the engine, one module each.

Time travel, compaction, export and import, verify, signed checkpoints and erasure, and
the HTML report.

Each module takes an :class:`~eventstore.engine.engine.Engine` as its first argument and
imports nothing from storage: what it needs from the database, it asks of the engine, in
the transactions the engine opens (``engine.reading()``, ``engine.writing()``) and in the
engine's terms (:class:`~eventstore.engine.row_steps.RowSteps`,
:class:`~eventstore.engine.transaction_steps.TransactionSteps`).
"""
