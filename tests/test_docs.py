"""Every ```python block of README.md and of docs/*.md runs as written.

How a page's blocks run (the rules a docs writer follows):

- Each block runs on its own: a fresh namespace, in a fresh empty temporary directory
  (so ``sqlite:///chat.db`` is a new database every time).
- A block whose first line is ``# continues the example above`` runs after the block
  before it, in the same namespace and directory: a page may build on what it just
  showed (an open ``store``, a ``url``, the ``actions`` it defined).
- Every PostgreSQL URL written as a string literal in a block (``"postgresql+psycopg://
  app@db1/chat"``) is replaced by a fresh private schema on the test server
  (``EVENTSTORE_TEST_PG_URL``, which ``make test`` sets); a second distinct URL in the
  same chain of blocks (a read replica) becomes the test server's streaming replica
  (``EVENTSTORE_TEST_PG_REPLICA_URL``) on the same schema. Such a block fails, never
  skips, without the server.
- A block whose first line is ``# not run: REASON`` is not run. It is for what no test
  machine has (another host, a PgBouncer in front of the server); anything that can run
  on SQLite or on the test server must run.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPLICA_GROUP

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONTINUES = "# continues the example above"
NOT_RUN = "# not run:"
PG_PREFIX = "postgresql+psycopg://"


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str


def page_blocks(path: Path) -> list[Block]:
    """The ```python blocks of one page, with the line each starts on."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(name, line, match.group(1)))
    return blocks


def chains(pages: list[Path]) -> list[list[Block]]:
    """The blocks grouped into what runs together: a block and the ones that continue it."""
    out: list[list[Block]] = []
    for path in pages:
        for block in page_blocks(path):
            first = block.code.lstrip().splitlines()[0] if block.code.strip() else ""
            if first.startswith(CONTINUES):
                assert out and out[-1][0].page == block.page, (
                    f"{block.page}:{block.line} continues nothing"
                )
                out[-1].append(block)
            else:
                out.append([block])
    return out


CHAINS = chains(PAGES)


def _first_line(block: Block) -> str:
    return block.code.lstrip().splitlines()[0]


def pg_literals(code: str) -> list[str]:
    """The PostgreSQL URLs written as string literals in ``code`` (not in comments)."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except ValueError:  # an f-string: not a literal URL
                continue
            if isinstance(value, str) and value.startswith(PG_PREFIX):
                found.append(tok.string)
    return found


def _with_schema(server_url: str, schema_url: str) -> str:
    """``server_url`` with the search_path option of ``schema_url`` (a replica streams the
    primary's schemas, so the same option names the same tables there)."""
    _, _, options = schema_url.partition("?")
    return f"{server_url}?{options}" if options else server_url


def _chain_id(chain: list[Block]) -> str:
    return f"{chain[0].page}:{chain[0].line}"


def _reads_the_replica(chain: list[Block]) -> bool:
    """Whether the chain writes a second distinct PostgreSQL URL (run on the replica)."""
    if _first_line(chain[0]).startswith(NOT_RUN):
        return False
    return len({literal for block in chain for literal in pg_literals(block.code)}) > 1


@pytest.mark.parametrize(
    "chain",
    [
        pytest.param(c, marks=[pytest.mark.xdist_group(REPLICA_GROUP), pytest.mark.serial] if _reads_the_replica(c) else [])
        for c in CHAINS
    ],
    ids=[_chain_id(c) for c in CHAINS],
)
def test_python_blocks_run(
    chain: list[Block],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if _first_line(chain[0]).startswith(NOT_RUN):
        reason = _first_line(chain[0])[len(NOT_RUN) :].strip()
        assert reason, f"{_chain_id(chain)}: a block that is not run says why"
        assert len(chain) == 1, f"{_chain_id(chain)}: nothing continues a block that is not run"
        pytest.skip(f"not run: {reason}")
    monkeypatch.chdir(tmp_path)
    urls: dict[str, str] = {}  # literal as written -> literal of the test server's URL
    schema_url = ""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in chain:
        code = block.code
        for literal in pg_literals(code):
            if literal not in urls:
                if not urls:
                    schema_url = str(request.getfixturevalue("pg_schema"))
                    urls[literal] = repr(schema_url)
                else:
                    replica = os.environ.get("EVENTSTORE_TEST_PG_REPLICA_URL")
                    assert replica, "EVENTSTORE_TEST_PG_REPLICA_URL is not set (make test sets it)"
                    urls[literal] = repr(_with_schema(replica, schema_url))
            code = code.replace(literal, urls[literal])
        exec(compile(code, f"{block.page} python block at line {block.line}", "exec"), namespace)


def test_the_rules_find_blocks(tmp_path: Path) -> None:
    """The page reader sees every block and groups a continuation with the block before it;
    the PostgreSQL finder ignores URLs in comments."""
    assert len(page_blocks(ROOT / "README.md")) >= 2
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\ntext\n```bash\nls\n```\n"
        f"```python\n{CONTINUES}\nprint(x)\n```\n```python\n{NOT_RUN} another host\n```\n",
        encoding="utf-8",
    )
    grouped = chains([page])
    assert [[b.line for b in chain] for chain in grouped] == [[1, 8], [12]]
    assert pg_literals('s = "sqlite:///x.db"  # or "postgresql+psycopg://h/db"\n') == []
    assert pg_literals('EventStore("postgresql+psycopg://h/db")\n') == ['"postgresql+psycopg://h/db"']


def test_the_readme_stays_short_and_links_every_page() -> None:
    """A newcomer reads the README in minutes and finds every docs page from it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300, "the README grew past 300 lines: move detail to docs/"
    pages = sorted((ROOT / "docs").glob("*.md"))
    unlinked = [p.name for p in pages if f"(docs/{p.name}" not in readme]
    assert unlinked == [], f"docs pages the README does not link: {unlinked}"
