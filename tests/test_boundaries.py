"""Layer boundaries, checked by walking imports with `ast` (no extra dependency).

- the pure layers (reducer, models, diff) import nothing from storage, store or codec;
- storage moves bytes: it imports nothing from the reducer, the models, the codec or the store;
- only storage/postgres.py imports psycopg (migrations aside);
- the CLI uses only the public names of `eventstore` (its `__all__`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import eventstore

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "eventstore"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for every import in a file of the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [a.name for a in node.names]
            if not node.module:  # `from . import x` imports submodules
                out.extend((f"{mod}.{n}", []) for n in names)
            else:
                out.append((mod, names))
    return out


def _offenders(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for f in files:
        for mod, _ in _imports(f):
            if any(mod == p or mod.startswith(p + ".") for p in forbidden):
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    return bad


@pytest.mark.parametrize("module", ["reducer", "models", "diff"])
def test_pure_layers_import_no_storage(module: str) -> None:
    path = PKG / f"{module}.py"
    assert path.is_file()
    forbidden = (
        "eventstore.storage",
        "eventstore.store",
        "eventstore.codec",
        "sqlalchemy",
        "psycopg",
        "sqlite3",
    )
    assert _offenders([path], forbidden) == []


def test_storage_moves_bytes_only() -> None:
    files = sorted((PKG / "storage").glob("*.py"))
    assert len(files) >= 6
    forbidden = (
        "eventstore.reducer",
        "eventstore.models",
        "eventstore.codec",
        "eventstore.store",
        "eventstore.diff",
        "pydantic",
        "orjson",
    )
    assert _offenders(files, forbidden) == []


def test_only_the_postgres_module_imports_psycopg() -> None:
    files = [p for p in PKG.rglob("*.py") if p != PKG / "storage" / "postgres.py"]
    assert _offenders(files, ("psycopg",)) == []
    assert _offenders([PKG / "storage" / "postgres.py"], ("psycopg",)) != []


def test_the_imports_walker_sees_relative_imports() -> None:
    mods = {m for m, _ in _imports(PKG / "store.py")}
    assert {"eventstore.storage", "eventstore.reducer", "eventstore.codec"} <= mods


def test_cli_uses_only_public_eventstore_names() -> None:
    public = set(eventstore.__all__)
    bad = []
    for f in sorted((ROOT / "cli").rglob("*.py")):
        for mod, names in _imports(f):
            if mod == "eventstore":
                bad += [
                    f"{f.relative_to(ROOT)}: eventstore.{n} is not public"
                    for n in names
                    if n not in public
                ]
            elif mod.startswith("eventstore."):
                bad.append(
                    f"{f.relative_to(ROOT)} imports {mod} (use `from eventstore import ...`)"
                )
    assert bad == []
