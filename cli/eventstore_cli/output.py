"""How commands print: one JSON document, a progress bar or spinner on stderr, the width.

Rich loads only inside these functions, when a command first shows progress.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

from .terminal import console, is_terminal, json_text

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["print_json", "progress_bar", "working", "terminal_width"]


def print_json(doc: Any) -> None:
    """``doc`` as JSON on stdout: exact values, terminal-safe spelling."""
    typer.echo(json_text(doc))


def progress_bar() -> Progress:
    """A Rich progress bar on stderr, shown only when stderr is a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}", markup=False),  # descriptions may name stored ids
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
        disable=not is_terminal(sys.stderr),
    )


@contextmanager
def working(what: str) -> Iterator[None]:
    """A transient spinner on stderr while a long read runs (only on a terminal)."""
    if not is_terminal(sys.stderr):
        yield
        return
    with progress_bar() as bar:
        bar.add_task(what, total=None)
        yield


def terminal_width() -> int | None:
    """The terminal's width when stdout is one, else ``None`` (lines are not cut)."""
    if not is_terminal():
        return None
    import shutil

    return shutil.get_terminal_size().columns
