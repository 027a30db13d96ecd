"""Adapters between eventstore and the client libraries chat apps already use; each imports its peer only when used."""
