# `make test` is the whole suite: it creates the virtualenv, installs the project with
# its test extras, starts a throwaway PostgreSQL server and runs pytest on both backends.
# The report's browser test needs headless Chromium: scripts/ensure-chromium installs it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# pytest-xdist workers for `make test`'s parallel phase (0: the whole suite in one
# process). Tests that stop, pause or restart a server run beside it, one at a time, on
# servers of their own (scripts/run-tests; tests/conftest.py marks them `serial`).
# One file: `make test PYTEST_ARGS=tests/test_x.py`, or `pytest tests/test_x.py` (no -n)
# under scripts/with-postgres.
TEST_WORKERS ?= 2
# The demo needs eventstore alone: its own stamp installs `-e .` without the test extras
# (`make test` later adds them through $(STAMP)).
DEMO_STAMP := $(VENV)/.demo-stamp
# The ai npm package (both majors the AI SDK adapter supports) judges its streams in the tests.
JS_STAMP := tests/js/node_modules/.installed-stamp
# The Agents SDK's own session tests (tests/test_openai_agents.py runs them), fetched from
# the SDK's sdist into a cache outside the repository, at the version the test extra pins.
AGENTS_VERSION := $(shell sed -n 's/.*"openai-agents==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)

.PHONY: test test-fast install demo bench lint clean agents-tests

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(DEMO_STAMP)

install: $(STAMP)

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	npm ci --prefix tests/js --no-audit --no-fund
	touch $(JS_STAMP)

# Nothing but print the cache's directory when it holds them already.
agents-tests:
	$(PYTHON) scripts/fetch-agents-tests $(AGENTS_VERSION) >/dev/null

test: export SE_OFFLINE = true
# Every pytest process (the workers, the serial phase, the Agents SDK's own tests) would
# otherwise rewrite and compile each test module again: about 3 s of CPU each.
test: export PYTHONDONTWRITEBYTECODE =
test:
	@# The installs and the fetch mostly wait on the network: side by side, whatever
	@# `make -j` says (the fetch would otherwise be a test's setup, on a worker's clock).
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(JS_STAMP) agents-tests
	scripts/ensure-chromium
	# The suite starts the CLI and other programs many times: with the bytecode cache
	# written once, before the workers start, no run recompiles the package.
	$(PY) -m compileall -q eventstore cli/eventstore_cli
	TEST_WORKERS=$(TEST_WORKERS) scripts/run-tests $(PY) $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	$(VENV)/bin/eventstore demo

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	scripts/with-postgres $(PY) -m benchmarks all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info eventstore.db
