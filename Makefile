# sessionrepo: every target sets itself up (venv + install) on a fresh machine.
#   make demo   three gateway processes flush overlapping transcripts; verified summary
#   make test   the contract suite on SQLite and PostgreSQL
#               (PostgreSQL from SESSIONREPO_TEST_POSTGRES_URL, see README)
#   make lint   ruff, mypy --strict and the import contracts (layering) on the package

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint check clean

# The package is installed editable in setuptools' strict mode: a tree of links named as the
# package is (sessionrepo/, sessionrepo/models/, ...) that mypy and import-linter can read.
# A new or removed file needs a new link tree, so the install runs again when the list of
# package files changes.
PACKAGE_FILES := $(shell find repo models migrations -name '*.py' -o -name '*.mako' -o -name py.typed | LC_ALL=C sort)
ifneq ($(strip $(PACKAGE_FILES)),$(strip $(shell cat $(VENV)/.package-files 2>/dev/null)))
.PHONY: $(STAMP)
endif

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	echo '$(PACKAGE_FILES)' > $(VENV)/.package-files
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sessionrepo demo

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check models repo migrations tests
	$(BIN)/ruff format --check models repo migrations tests
	$(BIN)/mypy -p sessionrepo
	$(BIN)/lint-imports

check: lint test

# make screenshots   the README's pictures of the console (docs/console-*.png), taken in
#                    Chromium from the demo's data by the browser tests
.PHONY: screenshots
screenshots: $(STAMP)
	SESSIONREPO_SCREENSHOTS=$(CURDIR)/docs $(BIN)/python -m pytest -q tests/web/test_web_screenshots.py

# make bench   sessionrepo against the raw drivers and the peer stores (issues 7, 13), about
#              15 minutes; results in bench/results/. BENCH_ARGS=--quick for a smoke run.
#              PostgreSQL from BENCH_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]' --config-settings editable_mode=strict
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache .hypothesis
