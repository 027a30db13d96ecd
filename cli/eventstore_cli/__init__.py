"""The `eventstore` command line: a thin Typer layer over the public eventstore API."""
