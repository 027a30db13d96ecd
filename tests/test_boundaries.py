"""Layer boundaries, checked by walking imports with `ast` (no extra dependency).

The folders are the layers, and each rule below is one a newcomer can read off them:
- `eventstore/core/` is pure: it imports nothing from the engine, features, storage or the
  facades, no database driver or migration tool, no thread, event loop or clock;
- `eventstore/features/` go through the engine: they import nothing from storage, and
  neither they nor the facades, the explorer, the integrations or the CLI read an
  engine's `.storage` (only the engine and storage hold the database);
- `eventstore/storage/` moves bytes and integers: it imports nothing from the engine, the
  features, the facades, nor the core's domain modules (models, reducer, codec, diff), only
  the rows it exchanges (`core.rows`) and the error tree;
- only the PostgreSQL storage imports psycopg (migrations aside);
- the CLI and the integrations (`eventstore/integrations/`) use only the public names of
  `eventstore` (its `__all__`), the CLI also the sample-data module for its demo;
- `__all__` comes from one table (`_PUBLIC`), and the imports static checkers read name
  exactly its names, each from the module the table says;
- nothing outside the facades (`eventstore/store.py`, `eventstore/async_store.py` and their
  shared base) imports them, except the package's `__init__` that re-exports them;
- nothing outside the facades reads their private attributes (`store._x`);
- the engine and the features import neither the CLI nor a facade;
- no module reads another module's private (`_x`) names, and no function imports a module
  of the package in its body (a cycle dodged);
- the package's import graph has no cycle.
Each rule is also checked to fail when broken (`test_the_rules_catch_a_break`).
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

import eventstore

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "eventstore"


@functools.lru_cache(maxsize=None)
def _parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, once per source text in a test process: most rules walk every file of
    the package, and parsing them was most of this module's time. Keyed on the text itself,
    so a source a test changes (``test_the_rules_catch_a_break``) is parsed anew; the rules
    only read the trees."""
    return ast.parse(text, filename=filename)


def _imports_of(tree: ast.AST, path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for every import in a module of the package."""
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


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    return _imports_of(_parse(path.read_text(), str(path)), path)


def _offenders(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for f in files:
        for mod, _ in _imports(f):
            if any(mod == p or mod.startswith(p + ".") for p in forbidden):
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    return bad


#: What each layer may not import (module prefixes).
DRIVERS = ("sqlalchemy", "psycopg", "alembic", "sqlite3", "aiosqlite")
LAYER_RULES: dict[str, tuple[str, ...]] = {
    "core": (
        "eventstore.engine",
        "eventstore.features",
        "eventstore.storage",
        "eventstore.store",
        "eventstore.async_store",
        "eventstore.integrations",
        *DRIVERS,
        "threading",
        "asyncio",
        "time",
        "uuid",
        "random",
    ),
    "features": ("eventstore.storage", "eventstore.store", "eventstore.async_store", *DRIVERS),
    "storage": (
        "eventstore.engine",
        "eventstore.features",
        "eventstore.store",
        "eventstore.async_store",
        "eventstore.core.models",
        "eventstore.core.reducer",
        "eventstore.core.codec",
        "eventstore.core.diff",
        "pydantic",
        "orjson",
    ),
}
#: Calls that read a clock or make an id: the core takes them as arguments instead.
IMPURE_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("date", "today"), ("time", "time")}


def _owner_name(node: ast.expr) -> str | None:
    """The last name of what an attribute is read from: ``datetime`` for both
    ``datetime.now`` and ``datetime.datetime.now``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _clock_reads(tree: ast.AST) -> list[str]:
    return [
        f"line {node.lineno} calls {_owner_name(node.func.value)}.{node.func.attr}()"  # type: ignore[attr-defined]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (_owner_name(node.func.value), node.func.attr) in IMPURE_CALLS
    ]


def _layer_breaks(layer: str, sources: dict[Path, str]) -> list[str]:
    """Every import (and, in the core, every clock read) that breaks ``layer``'s rule."""
    bad = []
    for path, text in sources.items():
        tree = _parse(text, str(path))
        for mod, _ in _imports_of(tree, path):
            if any(mod == p or mod.startswith(p + ".") for p in LAYER_RULES[layer]):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
        if layer == "core":
            bad += [f"{path.relative_to(ROOT)} {hit}" for hit in _clock_reads(tree)]
    return bad


def _layer_sources(layer: str) -> dict[Path, str]:
    files = sorted((PKG / layer).rglob("*.py"))
    assert files, f"eventstore/{layer}/ has no modules"
    return {f: f.read_text() for f in files}


@pytest.mark.parametrize("layer", sorted(LAYER_RULES))
def test_each_layer_keeps_its_rule(layer: str) -> None:
    assert _layer_breaks(layer, _layer_sources(layer)) == []


BREAKS = {
    "core": "import threading\n",
    "core ": "from datetime import datetime\nWHEN = datetime.now()\n",
    "core  ": "import datetime\nWHEN = datetime.datetime.now()\n",
    "core   ": "from eventstore.engine.engine import Engine\n",
    "core    ": "import sqlalchemy\n",
    "features": "from eventstore.storage.interface import Storage\n",
    "storage": "from eventstore.core.models import parse_action\n",
    "storage ": "from eventstore.core.reducer import fold\n",
}


@pytest.mark.parametrize("layer", sorted(BREAKS))
def test_the_rules_catch_a_break(layer: str) -> None:
    """Checked by breaking it: one added line in one module of the layer is caught."""
    sources = _layer_sources(layer.strip())
    victim = next(iter(sources))
    sources[victim] = BREAKS[layer] + sources[victim]
    assert _layer_breaks(layer.strip(), sources) != []


#: The folders of the package that may hold the database itself; everyone else asks the engine.
STORAGE_HOLDERS = ("engine", "storage")


def _around_the_engine() -> dict[Path, str]:
    """The sources that must reach the database through the engine's operations: every
    module of the package outside :data:`STORAGE_HOLDERS` (features, facades, explorer,
    integrations), and the CLI."""
    files = [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] not in STORAGE_HOLDERS]
    return {f: f.read_text() for f in [*files, *sorted((ROOT / "cli").rglob("*.py"))]}


def _storage_reads(sources: dict[Path, str]) -> list[str]:
    """Every ``x.storage`` read in ``sources``: the database reached around the engine."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} reads .storage"
        for path, text in sources.items()
        for node in ast.walk(_parse(text, str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "storage"
    ]


def test_features_and_facades_reach_storage_only_through_the_engine() -> None:
    sources = _around_the_engine()
    assert any(p.is_relative_to(PKG / "features") for p in sources)
    assert _storage_reads(sources) == []


def test_the_storage_read_rule_catches_a_break() -> None:
    """Checked by breaking it: one feature module reading ``engine.storage`` is caught."""
    sources = _around_the_engine()
    victim = next(p for p in sources if p.is_relative_to(PKG / "features") and p.name != "__init__.py")
    sources[victim] += "\n\ndef rows(engine, tx):\n    return engine.storage.sessions(tx)\n"
    assert _storage_reads(sources) != []


def test_storage_rows_are_the_only_core_module_storage_sees() -> None:
    used = {
        mod
        for f in sorted((PKG / "storage").rglob("*.py"))
        for mod, _ in _imports(f)
        if mod.startswith("eventstore.core")
    }
    assert used == {"eventstore.core.rows"}


def test_only_the_postgres_module_imports_psycopg() -> None:
    postgres = sorted((PKG / "storage" / "postgres").rglob("*.py"))
    files = [p for p in PKG.rglob("*.py") if p not in postgres]
    assert _offenders(files, ("psycopg",)) == []
    assert _offenders(postgres, ("psycopg",)) != []


#: At most this many methods on the storage interface: a new need is first a keyword of an
#: existing method (a filter, a lock), not a method of its own.
MAX_STORAGE_METHODS = 30
#: Its data attributes, each a member too: adding one is a decision, not a slip.
STORAGE_ATTRIBUTES = {"dialect", "safe_url", "feed_banded"}


def _storage_members(source: str) -> tuple[set[str], set[str]]:
    """The public methods and the data attributes of ``class Storage`` in ``source``."""
    tree = _parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Storage"]
    methods = {
        n.name
        for n in cls.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("_")
    }
    attributes = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    return methods, attributes


def _storage_interface_breaks(source: str) -> list[str]:
    methods, attributes = _storage_members(source)
    bad = []
    if len(methods) > MAX_STORAGE_METHODS:
        bad.append(f"the storage interface has {len(methods)} methods (at most {MAX_STORAGE_METHODS})")
    if attributes != STORAGE_ATTRIBUTES:
        bad.append(f"the storage interface's attributes are {sorted(attributes)}")
    return bad


def test_the_storage_interface_stays_small() -> None:
    source = (PKG / "storage" / "interface.py").read_text()
    assert _storage_interface_breaks(source) == []


def test_the_storage_interface_size_check_catches_a_new_method() -> None:
    """Checked by breaking it: one more method, or one more attribute, is caught."""
    source = (PKG / "storage" / "interface.py").read_text()
    methods, _ = _storage_members(source)
    extra = "".join(
        f"\n    def extra_{i}(self) -> None:\n        ...\n"
        for i in range(MAX_STORAGE_METHODS + 1 - len(methods))
    )
    # Appended at the end of the module, they land in its last class: Storage.
    grown = source.rstrip("\n") + "\n" + extra
    assert _storage_interface_breaks(grown) != []
    assert _storage_interface_breaks(source.rstrip("\n") + "\n    colour: str\n") != []


def test_the_imports_walker_sees_relative_imports() -> None:
    fake = PKG / "engine" / "example.py"
    tree = _parse("from ..core import reducer\nfrom .planner import AppendPlanner\n")
    assert _imports_of(tree, fake) == [
        ("eventstore.core", ["reducer"]),
        ("eventstore.engine.planner", ["AppendPlanner"]),
    ]


#: Who may use only the public API, and the files that are theirs.
PUBLIC_ONLY = {
    "cli": lambda: sorted((ROOT / "cli").rglob("*.py")),
    "integrations": lambda: sorted((PKG / "integrations").rglob("*.py")),
}


def _non_public_imports(sources: dict[Path, str]) -> list[str]:
    """Every import of an ``eventstore`` name outside ``__all__`` (or of a submodule)."""
    public = set(eventstore.__all__)
    bad = []
    for path, text in sources.items():
        for mod, names in _imports_of(_parse(text, str(path)), path):
            if mod == "eventstore.samples" and path.is_relative_to(ROOT / "cli"):
                continue  # the demo's sample data: importable, not in the public namespace
            if mod == "eventstore":
                bad += [
                    f"{path.relative_to(ROOT)}: eventstore.{n} is not public"
                    for n in names
                    if n not in public
                ]
            elif mod.startswith("eventstore.") and not mod.startswith("eventstore.integrations"):
                bad.append(
                    f"{path.relative_to(ROOT)} imports {mod} (use `from eventstore import ...`)"
                )
    return bad


@pytest.mark.parametrize("user", sorted(PUBLIC_ONLY))
def test_the_cli_and_integrations_use_only_public_names(user: str) -> None:
    files = PUBLIC_ONLY[user]()
    assert files
    assert _non_public_imports({f: f.read_text() for f in files}) == []


@pytest.mark.parametrize(
    "user, line",
    [
        ("cli", "from eventstore.core.reducer import fold\n"),
        ("cli", "from eventstore import Engine\n"),
        ("integrations", "from eventstore.core.reducer import fold_json\n"),
        ("integrations", "from eventstore.engine.engine import Engine\n"),
    ],
)
def test_the_public_api_rule_catches_a_break(user: str, line: str) -> None:
    """Checked by breaking it: one private import added to one of the user's files is caught."""
    sources = {f: f.read_text() for f in PUBLIC_ONLY[user]()}
    victim = next(p for p in sources if p.name != "__init__.py")
    sources[victim] = line + sources[victim]
    assert _non_public_imports(sources) != []


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """``{name: module}`` of the imports under ``if TYPE_CHECKING:`` of a module."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                for alias in imp.names:
                    assert alias.asname in (None, alias.name), f"{alias.name} renamed"
                    found[alias.name] = imp.module
    return found


def test_all_comes_from_the_one_table_and_the_static_imports_match_it() -> None:
    """``__all__`` is the table's names; the imports static checkers read are the same
    names from the same modules (so a name added to one place and not the other fails)."""
    tree = _parse((PKG / "__init__.py").read_text())
    groups = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_PUBLIC"
    )
    table = {name: module for group in groups.values() for name, module in group.items()}
    assert eventstore.__all__ == list(table)
    static = _type_checking_imports(tree)
    assert static == table
    for name, module in table.items():
        assert name in vars(importlib.import_module(module)), f"{module} has no {name}"


def _py_files() -> list[Path]:
    return sorted(
        p for d in ("eventstore", "cli", "benchmarks", "tests") for p in (ROOT / d).rglob("*.py")
    )


#: The two public facades: EventStore and its asyncio twin.
FACADES = (PKG / "store.py", PKG / "async_store.py", PKG / "engine" / "facade.py")


def test_only_the_package_init_imports_the_facade_module() -> None:
    allowed = {*FACADES, PKG / "__init__.py"}
    files = [f for f in _py_files() if f not in allowed]
    assert (
        _offenders(
            files, ("eventstore.store", "eventstore.async_store", "eventstore.engine.facade")
        )
        == []
    )


def _private_reads(path: Path, names: tuple[str, ...]) -> list[str]:
    """``x._attr`` reads in a file where ``x`` is one of ``names`` (dunders aside)."""
    tree = _parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} reads {node.value.id}.{node.attr}"  # type: ignore[attr-defined]
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in names
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def _facade_private_attributes() -> set[str]:
    """The ``self._x`` names the facades set (what no other file may read, by any name)."""
    return {
        node.attr
        for facade in FACADES
        for node in ast.walk(_parse(facade.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    }


def test_nothing_reads_the_facades_private_attributes() -> None:
    private = _facade_private_attributes()
    assert private  # the walker sees the facade's own state
    bad = []
    for f in _py_files():
        if f in FACADES:
            continue
        tree = _parse(f.read_text(), str(f))
        bad += [
            f"{f.relative_to(ROOT)}:{node.lineno} reads ._{node.attr[1:]}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in private
        ]
    # And no `store._anything`, whatever the attribute is called.
    names = ("store", "tt", "reader", "writer", "hostile_store", "tamper_store", "seeded")
    bad += [hit for f in _py_files() if f not in FACADES for hit in _private_reads(f, names)]
    assert bad == []


ENGINE_SIDE = sorted(
    p
    for layer in ("core", "engine", "features")
    for p in (PKG / layer).glob("*.py")
    if p.name != "facade.py"
)


@pytest.mark.parametrize("path", ENGINE_SIDE, ids=lambda p: p.relative_to(PKG).as_posix())
def test_the_engine_imports_no_cli_and_no_facade(path: Path) -> None:
    assert (
        _offenders(
            [path],
            (
                "eventstore.store",
                "eventstore.async_store",
                "eventstore.engine.facade",
                "eventstore_cli",
                "typer",
                "rich",
            ),
        )
        == []
    )
    assert "eventstore" not in {m for m, _ in _imports(path)}


def test_no_module_reads_another_modules_private_names() -> None:
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        for mod, names in _imports(f):
            if mod.startswith("eventstore"):
                bad += [
                    f"{f.relative_to(ROOT)} imports {mod}.{n}"
                    for n in names
                    if n.startswith("_") and n != "__version__"
                ]
    assert bad == []


#: Deferred imports that are not about cycles: a backend's driver (psycopg) loads only when a
#: URL of that backend is opened, and Alembic only when ``migrate`` runs (start-up time).
DEFERRED = {("storage/__init__.py", "_open"), ("storage/sql/transactions.py", "migrate")}


def test_no_function_imports_a_package_module_in_its_body() -> None:
    bad = []
    for f in sorted(PKG.rglob("*.py")):
        tree = _parse(f.read_text(), str(f))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if (f.relative_to(PKG).as_posix(), fn.name) in DEFERRED:
                        continue
                    if isinstance(node, ast.ImportFrom) and (
                        node.level or (node.module or "").startswith("eventstore")
                    ):
                        bad.append(f"{f.relative_to(ROOT)}:{node.lineno} imports in {fn.name}()")
    assert bad == []


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_the_package_has_no_import_cycle() -> None:
    files = {_module_name(f): f for f in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        deps = set()
        for mod, names in _imports(f):
            if mod in files:
                deps.add(mod)
            # `from . import x` and `from .storage import base` name modules too
            deps.update(f"{mod}.{n}" for n in names if f"{mod}.{n}" in files)
        # A package's __init__ runs before its modules: an edge into a package counts as
        # an edge into its __init__ only, which the walk below treats like any module.
        graph[name] = deps - {name}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # The package __init__ re-exports from its modules, and they import siblings through
    # the package path: edges into "eventstore" itself are the re-export, not a cycle.
    cycles = [c for c in cycles if "eventstore" not in c]
    assert cycles == []
