"""The CLI's rendering of the catalogue: ``sessions`` with filters, and ``info``.

Rich tables; every stored value is escaped for the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .errors import usage
from .render import session_state
from .summary import short_time
from .terminal import safe

__all__ = ["parse_meta", "catalogue_table", "info_table"]


def parse_meta(pairs: Sequence[str]) -> dict[str, str]:
    """``--meta K=V`` options as a metadata object (values are strings).

    Raises:
        typer.BadParameter: (exit 2) an option is not ``K=V`` or repeats a key.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            usage(f"--meta takes KEY=VALUE, got {pair!r}")
        if key in out:
            usage(f"--meta repeats the key {key!r}")
        out[key] = value
    return out


def _status(info: Any) -> str:
    return session_state(info) or info.status


def catalogue_table(items: Sequence[Any], next_cursor: str | None) -> Group | Table:
    """One page of sessions: id, title, owner, status, turns, last activity."""
    t = Table(title=Text("sessions"), header_style="bold")
    for name in ("session", "title", "owner", "status", "turns", "updated"):
        t.add_column(name, justify="right" if name == "turns" else "left")
    for s in items:
        t.add_row(
            Text(safe(s.id)),
            Text(safe(s.title or "")),
            Text(safe(s.owner or "")),
            Text(safe(_status(s))),
            str(s.turns),
            short_time(s.updated_at),
        )
    if next_cursor is None:
        return t
    return Group(t, Text(f"next page: --cursor {next_cursor}"))


def info_table(info: Any, changes: Sequence[Any]) -> Group:
    """A session's catalogue entry and the record of its ``set_info`` changes."""
    t = Table(show_header=False, title=Text(safe(info.id)), title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    meta = ", ".join(f"{k}={v}" for k, v in info.metadata.items())
    doc = info.to_json()  # its timestamps as every JSON output spells them
    for field, value in (
        ("title", info.title or ""),
        ("owner", info.owner or ""),
        ("metadata", meta),
        ("status", _status(info)),
        ("head", str(info.head)),
        ("turns", str(info.turns)),
        ("created", doc["created_at"]),
        ("updated", doc["updated_at"] or ""),
    ):
        t.add_row(field, Text(safe(value)))
    if not changes:
        return Group(t)
    c = Table(title=Text("info changes"), header_style="bold")
    for name in ("when", "actor", "changes"):
        c.add_column(name)
    for ch in changes:
        what = ", ".join(f"{k}={v}" for k, v in ch.changes.items())
        c.add_row(ch.to_json()["changed_at"], Text(safe(ch.actor or "")), Text(safe(what)))
    return Group(t, c)
