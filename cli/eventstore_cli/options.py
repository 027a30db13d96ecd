"""The arguments and options several commands share: ``--json`` and the metavars of ids."""

from __future__ import annotations

import typer

__all__ = ["JsonOpt", "SESSION", "REF"]

JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout instead of tables.")
SESSION = "SESSION"
REF = "SESSION[@V]"
